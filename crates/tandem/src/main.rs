fn main() {
    eprintln!("tandem: not yet built");
    std::process::exit(2);
}
