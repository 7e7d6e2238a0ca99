//! Plain-text tables and the number formats every benchmark prints.

use crate::size::format_count;

/// "812,345/s 1.23 µs": throughput first because bigger is better is easier to scan.
pub fn format_rate(seconds_per_operation: f64) -> String {
    if seconds_per_operation <= 0.0 || !seconds_per_operation.is_finite() {
        return "-".into();
    }
    let per_second = (1.0 / seconds_per_operation).round() as u64;
    format!("{}/s {}", format_count(per_second), format_latency(seconds_per_operation))
}

/// Microseconds with sensible precision.
pub fn format_latency(seconds: f64) -> String {
    let microseconds = seconds * 1e6;
    if microseconds < 10.0 {
        format!("{microseconds:.2} µs")
    } else if microseconds < 1000.0 {
        format!("{microseconds:.1} µs")
    } else {
        format!("{:.2} ms", microseconds / 1000.0)
    }
}

/// Speed-up of `ours` over `theirs` (both seconds per operation): "4.2×".
pub fn format_ratio(ours: f64, theirs: f64) -> String {
    if ours <= 0.0 || theirs <= 0.0 {
        return "-".into();
    }
    format!("{:.1}×", theirs / ours)
}

/// Prints rows under headers with each column as wide as its widest cell; the first column is
/// left-aligned (labels), the rest right-aligned (numbers).
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|header| header.chars().count()).collect();
    for row in rows {
        for (column, cell) in row.iter().enumerate().take(columns) {
            widths[column] = widths[column].max(cell.chars().count());
        }
    }
    let render = |cells: Vec<String>| {
        let mut line = String::new();
        for (column, cell) in cells.iter().enumerate() {
            let padding = widths[column].saturating_sub(cell.chars().count());
            if column == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(padding));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(padding));
                line.push_str(cell);
            }
        }
        println!("{}", line.trim_end());
    };
    render(headers.iter().map(|header| header.to_string()).collect());
    render(widths.iter().map(|width| "-".repeat(*width)).collect());
    for row in rows {
        let mut cells = row.clone();
        cells.resize(columns, String::new());
        render(cells);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rates_and_ratios() {
        assert_eq!(format_rate(0.000_001), "1,000,000/s 1.00 µs");
        assert_eq!(format_ratio(1.0, 4.0), "4.0×");
        assert_eq!(format_ratio(0.0, 4.0), "-");
        assert_eq!(format_latency(0.002_5), "2.50 ms");
    }
}
