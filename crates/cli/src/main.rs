//! `frognano`: the binary. One module per subcommand, wiring only.
fn main() {}
