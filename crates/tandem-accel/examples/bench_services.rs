//! Runs `tandem bench services` without the CLI: `cargo run --release -p tandem-accel --example bench_services -- --help`.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match tandem_accel::bench::run_services(&args) {
        Ok(report) => print!("{report}"),
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(2);
        }
    }
}
