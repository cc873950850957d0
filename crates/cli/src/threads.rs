//! `-t/--threads N`: one flag, shared by every command that runs a model in this process
//! (`run`, `chat`, `serve`, `solve`, `eval run`, `synth calibrate`, `train`), sizing rayon's
//! global pool, the one the model's matrix work runs on, once at start.

use anyhow::Context;

/// Where the model runs: the thread count and the device (flattened into each command that
/// runs a model).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ThreadArgs {
    /// Threads for the model's work (matrix products, attention), as llama.cpp's -t
    /// [default: RAYON_NUM_THREADS if set, else one per CPU core].
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Where the model runs: cpu, cuda, cuda:N (an NVIDIA GPU; needs the driver and the CUDA
    /// 13 libraries at run time), or sim (the CUDA kernels on a CPU simulator: slow, for
    /// checking) [default: FROGNANO_DEVICE if set, else cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = parse_device)]
    pub device: Option<frognano_gpu::DeviceSpec>,
}

/// A `--device` name, or an error listing the names.
fn parse_device(s: &str) -> Result<frognano_gpu::DeviceSpec, String> {
    s.parse()
}

/// Places every model this process loads on `device` (else `FROGNANO_DEVICE`, else the CPU),
/// and exports the choice as `FROGNANO_DEVICE` so that the `frognano solve` processes `eval run
/// --frognano-bin` starts use the same device.
pub fn place_models(device: Option<frognano_gpu::DeviceSpec>) -> anyhow::Result<()> {
    let spec = match device {
        Some(d) => d,
        None => match std::env::var("FROGNANO_DEVICE") {
            Ok(s) if !s.trim().is_empty() => s.parse().map_err(|e: String| anyhow::anyhow!("FROGNANO_DEVICE: {e}"))?,
            _ => frognano_gpu::DeviceSpec::Cpu,
        },
    };
    if spec != frognano_gpu::DeviceSpec::Cpu {
        std::env::set_var("FROGNANO_DEVICE", spec.to_string());
    }
    frognano_gpu::install(spec).with_context(|| format!("--device {spec}"))
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
