//! What a context costs, checked before it is used (docs/model.md §4): one sequence's cache at
//! `ctx` tokens ([`crate::CausalLm::cache_bytes`]: attention keys and values in the model's
//! [`crate::KvType`], plus recurrent state) against the memory the system has available, with
//! an error that names the largest context that fits.

use crate::CausalLm;

/// Bytes the kernel reports as available (`MemAvailable` in `/proc/meminfo`), or `None` where
/// that cannot be read (not Linux).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The largest context `n ≤ ctx` whose cache, `bytes(n)`, fits in `available` (0 if none).
fn largest_fitting(bytes: impl Fn(usize) -> usize, ctx: usize, available: u64) -> usize {
    let (mut lo, mut hi) = (0usize, ctx);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if bytes(mid) as u64 <= available {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Fails unless a cache of `ctx` tokens (`bytes(ctx)`) fits in `available` bytes; the error
/// names the need, what is available, the largest context that fits and how to get it.
pub fn fit_context(
    bytes: impl Fn(usize) -> usize,
    ctx: usize,
    available: u64,
    kv: crate::KvType,
) -> Result<(), String> {
    fit_context_in(bytes, ctx, available, kv, "of memory is available (MemAvailable)")
}

/// [`fit_context`], naming where the memory is (`"of GPU memory is free"`).
fn fit_context_in(
    bytes: impl Fn(usize) -> usize,
    ctx: usize,
    available: u64,
    kv: crate::KvType,
    where_: &str,
) -> Result<(), String> {
    let need = bytes(ctx) as u64;
    if need <= available {
        return Ok(());
    }
    let fits = largest_fitting(&bytes, ctx, available);
    Err(format!(
        "a context of {ctx} tokens needs {:.2} GiB of cache (KV cache {kv}), but only {:.2} GiB {where_}; the \
         largest context that fits is {fits} tokens: pass -c/--ctx-size {fits}, or a smaller --kv-cache (q8_0 takes \
         53 %, q4_0 28 % of f16)",
        gib(need),
        gib(available),
    ))
}

/// [`fit_context`] for `model` against the memory its caches live in: the device's free
/// memory for a model on a GPU ([`CausalLm::device_memory_free`]), else [`mem_available`] (no
/// check where that is unknown).
pub fn check_context(model: &dyn CausalLm, ctx: usize) -> Result<(), String> {
    if let Some(free) = model.device_memory_free() {
        return fit_context_in(|n| model.cache_bytes(n), ctx, free, model.kv_type(), "of GPU memory is free");
    }
    match mem_available() {
        Some(available) => fit_context(|n| model.cache_bytes(n), ctx, available, model.kv_type()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvType;

    #[test]
    fn a_context_that_does_not_fit_names_the_one_that_does() {
        // 1,000 bytes of state plus 100 a token, 51,000 bytes available: 500 tokens fit.
        let bytes = |n: usize| 1000 + 100 * n;
        assert_eq!(fit_context(bytes, 500, 51_000, KvType::F16), Ok(()));
        let e = fit_context(bytes, 131_072, 51_000, KvType::F16).unwrap_err();
        assert!(e.contains("131072 tokens") && e.contains("-c/--ctx-size 500,"), "{e}");
        assert!(e.contains("KV cache f16"), "{e}");
        // Not even the state fits.
        assert!(fit_context(bytes, 10, 999, KvType::Q8_0).unwrap_err().contains("-c/--ctx-size 0,"));
    }

    #[test]
    fn meminfo_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(mem_available().is_some_and(|b| b > 0));
        }
    }
}
