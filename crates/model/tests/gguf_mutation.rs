//! The GGUF parser never panics on a corrupt file: thousands of deterministic mutations of a
//! valid file (fixtures/gguf/quant-reference.gguf: every metadata value type, nested arrays, every
//! block format) — byte flips, overwritten counts, lengths and offsets, truncations, spliced
//! bytes — each either parses or gives an error, and whatever parses can be read without a
//! panic. The cargo-fuzz target in fuzz/ explores the same entry point without a bound.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use frognano_model::gguf::GgufFile;

fn fixture() -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf/quant-reference.gguf");
    std::fs::read(p).unwrap()
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break parsers: zero, one, the type boundaries, huge counts.
const INTERESTING: [u64; 12] = [0, 1, 2, 12, 13, 0x7F, 0xFF, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 40, u64::MAX];

/// One mutation of `base`, chosen by `rng`. Most touch the header (the first `header` bytes),
/// where the parser reads.
fn mutate(base: &[u8], header: usize, rng: &mut Lcg) -> Vec<u8> {
    let mut b = base.to_vec();
    let rounds = 1 + rng.below(3);
    for _ in 0..rounds {
        let at = if rng.below(8) == 0 { rng.below(b.len()) } else { rng.below(header.min(b.len())) };
        match rng.below(7) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => {
                // An interesting little-endian u64 or u32 over whatever field is there.
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let w = if rng.below(2) == 0 { 8 } else { 4 };
                for (i, byte) in v.to_le_bytes().iter().take(w).enumerate() {
                    if let Some(x) = b.get_mut(at + i) {
                        *x = *byte;
                    }
                }
            }
            3 => b.truncate(at),
            4 => {
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(at..at, bytes);
            }
            5 => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at..end);
            }
            _ => {
                // A copy of another header stretch (a string length or count moved elsewhere).
                let from = rng.below(header.min(b.len()));
                let n = (1 + rng.below(12)).min(b.len() - from).min(b.len() - at);
                let chunk = b[from..from + n].to_vec();
                b[at..at + n].copy_from_slice(&chunk);
            }
        }
        if b.is_empty() {
            break;
        }
    }
    b
}

/// Parses `bytes` and, when that succeeds, reads every tensor and metadata value through the
/// public readers (errors allowed, panics not).
fn exercise(bytes: Vec<u8>) -> bool {
    let Ok(f) = GgufFile::from_bytes(Arc::new(bytes), "mutated.gguf") else { return false };
    for (k, _) in f.metadata() {
        let _ = (
            f.get_u64(k),
            f.get_f64(k),
            f.get_str(k),
            f.get_bool(k),
            f.get_str_array(k),
            f.get_i64_array(k),
            f.get_f64_array(k),
        );
    }
    for t in f.tensors() {
        let _ = f.tensor_bytes(&t.name);
        let rows = t.dims[1..].iter().product::<usize>();
        if t.len <= 1 << 20 {
            let _ = f.matrix(&t.name, rows, t.dims[0]);
            let _ = f.f32(&t.name, t.elements());
        }
    }
    true
}

#[test]
fn thousands_of_mutated_headers_give_errors_not_panics() {
    let base = fixture();
    assert!(exercise(base.clone()), "the unmutated fixture parses");
    // The header: everything before the first tensor's data.
    let f = GgufFile::from_bytes(Arc::new(base.clone()), "base.gguf").unwrap();
    let header = f.tensors().iter().map(|t| t.start).min().unwrap();
    let mut rng = Lcg(0x5eed);
    let (mut parsed, mut rejected) = (0, 0);
    for case in 0..4000 {
        let m = mutate(&base, header, &mut rng);
        match catch_unwind(AssertUnwindSafe(|| exercise(m))) {
            Ok(true) => parsed += 1,
            Ok(false) => rejected += 1,
            Err(_) => panic!("mutation case {case} (seed 0x5eed) panicked the GGUF reader"),
        }
    }
    // Both outcomes happen: the mutations are neither all harmless nor all fatal.
    assert!(parsed > 50 && rejected > 500, "parsed {parsed}, rejected {rejected}");
}

#[test]
fn every_truncation_of_the_header_is_an_error() {
    let base = fixture();
    let f = GgufFile::from_bytes(Arc::new(base.clone()), "base.gguf").unwrap();
    let header = f.tensors().iter().map(|t| t.start).min().unwrap();
    for len in 0..header {
        let r = GgufFile::from_bytes(Arc::new(base[..len].to_vec()), "cut.gguf");
        let e = r.expect_err("a file cut inside its header is an error").to_string();
        assert!(!e.is_empty());
    }
}
