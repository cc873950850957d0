//! Any byte string given to the GGUF reader is parsed or rejected with an error, never a panic;
//! what parses is read back through the public readers. Seed corpus: fixtures/gguf/*.gguf.
//!
//! With the default feature `libfuzzer` this is the libFuzzer target (`cargo fuzz run
//! gguf_parse`). Without it (`--no-default-features`, stable Rust) it is a plain program that
//! runs the same check once on each file named on its command line, to replay a crash file;
//! that build is also what `scripts/test.sh` type-checks.
#![cfg_attr(feature = "libfuzzer", no_main)]

use std::sync::Arc;

use frognano_model::gguf::GgufFile;

/// Parses `data` and reads back everything that parsed.
fn parse_and_read_back(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes(Arc::new(data.to_vec()), "fuzz.gguf") else { return };
    for (k, _) in f.metadata() {
        let _ = (f.get_u64(k), f.get_f64(k), f.get_str(k), f.get_bool(k), f.get_str_array(k), f.get_i64_array(k));
    }
    for t in f.tensors() {
        let _ = f.tensor_bytes(&t.name);
        if t.len <= 1 << 20 {
            let rows = t.dims[1..].iter().product::<usize>();
            let _ = f.matrix(&t.name, rows, t.dims[0]);
            let _ = f.f32(&t.name, t.elements());
        }
    }
}

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(|data: &[u8]| parse_and_read_back(data));

/// Replays each file named on the command line; a panic is the crash libFuzzer found.
#[cfg(not(feature = "libfuzzer"))]
fn main() {
    for path in std::env::args_os().skip(1) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.to_string_lossy()));
        parse_and_read_back(&data);
        println!("{}: no panic", path.to_string_lossy());
    }
}
