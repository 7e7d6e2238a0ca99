//! Compiles the CUDA kernels with NVRTC (no GPU needed) into the kernel cache and prints
//! the file: `cargo run -p tandem-accel --example compile_kernels -- 9 0` for sm_90.
fn main() {
    let args: Vec<i32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (major, minor) = (args.first().copied().unwrap_or(9), args.get(1).copied().unwrap_or(0));
    if let Err(reason) = tandem_accel::cuda::probe_nvrtc() {
        eprintln!("{reason}");
        std::process::exit(1);
    }
    match tandem_accel::cuda::compiled_kernels(major, minor) {
        Ok((image, from_cache, path)) => {
            println!(
                "{} bytes, {}: {}",
                image.len(),
                if from_cache { "from cache" } else { "compiled" },
                path.display()
            )
        }
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(1);
        }
    }
}
