//! Byte sizes on the command line ("512M", "2G", "1T") and in output ("1.0 GiB").
//!
//! All units are binary (powers of 1024), as in `truncate -s` and `mkfs`, because volume sizes
//! are counted in 4 KiB blocks and decimal units would leave odd remainders.

/// Parses a size such as `4096`, `512K`, `512M`, `2G`, `1T`, `1GiB` or `1GB` (both binary).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty size (expected a number with an optional unit, such as 512M)".into());
    }
    let digits_end = trimmed.find(|character: char| !character.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number_text, unit_text) = trimmed.split_at(digits_end);
    if number_text.is_empty() {
        return Err(format!("'{text}' does not start with a number (expected something like 512M)"));
    }
    let number: u64 = number_text.parse().map_err(|_| format!("'{number_text}' is too large a number"))?;
    let unit = unit_text.to_ascii_uppercase();
    let shift = match unit.as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        _ => return Err(format!("unknown unit '{unit_text}' in '{text}' (use K, M, G, T or P; all binary)")),
    };
    number.checked_mul(1u64 << shift).ok_or_else(|| format!("'{text}' is larger than 2^64 bytes"))
}

/// Parses a size and refuses zero, for lengths where zero would do nothing.
pub fn parse_nonzero_size(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err("the size must be larger than zero".into()),
        value => Ok(value),
    }
}

/// Formats bytes for people: "512 B", "4.0 KiB", "1.5 GiB".
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Formats a count with thousands separators: 1234567 → "1,234,567".
pub fn format_count(count: u64) -> String {
    let digits = count.to_string();
    let mut formatted = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            formatted.push(',');
        }
        formatted.push(digit);
    }
    formatted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("3KB"), Ok(3 << 10));
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("16777216T").is_err());
        assert!(parse_nonzero_size("0").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(1 << 30), "1.0 GiB");
        assert_eq!(format_count(1_234_567), "1,234,567");
        assert_eq!(format_count(999), "999");
    }
}
