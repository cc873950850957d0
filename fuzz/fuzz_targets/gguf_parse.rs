//! Any byte string given to the GGUF reader is parsed or rejected with an error, never a panic;
//! what parses is read back through the public readers. Seed corpus: fixtures/gguf/*.gguf.
#![no_main]

use std::sync::Arc;

use frognano_model::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
