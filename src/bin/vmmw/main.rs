//! `vmmw`: the command line (demo, inspect, load, bench).

fn main() {
    println!("vmmw {}", env!("CARGO_PKG_VERSION"));
}
