//! `-t/--threads N`: one flag, shared by every command that runs a model in this process
//! (`run`, `chat`, `serve`, `solve`, `eval run`, `synth calibrate`, `train`), sizing rayon's
//! global pool, the one the model's matrix work runs on, once at start.

use anyhow::Context;

/// The thread-count flag (flattened into each command that runs a model).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ThreadArgs {
    /// Threads for the model's work (matrix products, attention), as llama.cpp's -t
    /// [default: RAYON_NUM_THREADS if set, else one per CPU core].
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = parse_threads)]
    pub threads: Option<usize>,
}

/// `N ≥ 1`, or an error saying what was expected.
fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("the thread count must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("expected a whole number of threads (1, 2, …), found {s:?}")),
    }
}

/// Sizes rayon's global pool to `threads` (nothing when `None`: rayon then reads
/// `RAYON_NUM_THREADS` or takes one thread per core). Call once, before any model work; the
/// pool cannot be resized after its first use.
///
/// The count is also exported as `RAYON_NUM_THREADS`, so that the `frognano solve` processes
/// `eval run --frognano-bin` starts per attempt use the same count (sandboxed commands get a
/// clean environment and never see it).
pub fn size_pool(threads: Option<usize>) -> anyhow::Result<()> {
    let Some(n) = threads else { return Ok(()) };
    // Set before the pool's threads start: changing the environment while another thread
    // may read it is a race.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("frognano-{i}"))
        .build_global()
        .context("sizing the thread pool for -t/--threads")
}

/// The size of the pool the model runs on (what `--stats` and `serve` report).
pub fn pool_size() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_must_be_positive_whole_numbers() {
        assert_eq!(parse_threads("3"), Ok(3));
        assert_eq!(parse_threads("0").unwrap_err(), "the thread count must be at least 1");
        assert!(parse_threads("two").unwrap_err().contains("found \"two\""));
    }
}
