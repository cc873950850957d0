//! `--ray [ADDRESS]` and its resource flags, shared by `eval run|grade`, `synth`, `synth batch`
//! and `train`: each turns its units of work into Ray tasks (docs/scale-out.md).

use std::path::PathBuf;

use frognano_swe::ray::{RayConfig, RayRunner};

/// The Ray flags of a command that can run its units on a cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct RayArgs {
    /// Run every unit of work as a task on the Ray cluster at ADDRESS (host:port,
    /// ray://host:10001, auto); `--ray` alone takes RAY_ADDRESS. Needs a Python with `ray`
    /// (FROGNANO_RAY_PYTHON, default python3; scripts/setup-ray.sh). docs/scale-out.md.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "")]
    pub ray: Option<String>,
    /// CPUs each Ray task declares.
    #[arg(long, default_value_t = 1.0, requires = "ray")]
    pub ray_cpus: f64,
    /// Memory each Ray task declares (e.g. 2G, 512M).
    #[arg(long, default_value = "1G", value_parser = frognano_swe::ray::parse_memory, requires = "ray")]
    pub ray_memory: u64,
    /// Reruns of a task whose Ray worker or node died.
    #[arg(long, default_value_t = 3, requires = "ray")]
    pub ray_retries: u32,
}

impl RayArgs {
    /// The cluster settings these flags ask for (`None` without `--ray`); the address is
    /// checked here so that a missing one fails before any work starts.
    pub fn config(&self) -> anyhow::Result<Option<RayConfig>> {
        let Some(address) = &self.ray else { return Ok(None) };
        let config = RayConfig {
            address: if address.is_empty() {
                std::env::var("RAY_ADDRESS").unwrap_or_default()
            } else {
                address.clone()
            },
            python: std::env::var_os("FROGNANO_RAY_PYTHON").map_or_else(|| "python3".into(), PathBuf::from),
            frognano: std::env::current_exe()?,
            cpus_per_unit: self.ray_cpus,
            memory_per_unit: self.ray_memory,
            max_retries: self.ray_retries,
        };
        config.validate()?;
        Ok(Some(config))
    }

    /// The runner of these flags (`None` without `--ray`).
    pub fn runner(&self) -> anyhow::Result<Option<RayRunner>> {
        Ok(self.config()?.map(|config| RayRunner { config }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        ray: RayArgs,
    }

    #[test]
    fn flags_become_the_cluster_settings_and_bad_ones_are_named() {
        let t = Top::try_parse_from(["x", "--ray", "head:6379", "--ray-memory", "2G", "--ray-retries", "1"]).unwrap();
        let c = t.ray.config().unwrap().expect("--ray given");
        assert_eq!((c.address.as_str(), c.memory_per_unit, c.max_retries), ("head:6379", 2 << 30, 1));
        assert!(Top::try_parse_from(["x"]).unwrap().ray.config().unwrap().is_none());
        assert!(Top::try_parse_from(["x", "--ray-cpus", "2"]).is_err(), "--ray-cpus goes with --ray");
        let t = Top::try_parse_from(["x", "--ray", "head:6379", "--ray-cpus", "0"]).unwrap();
        assert_eq!(t.ray.config().unwrap_err().to_string(), "--ray-cpus must be more than 0, got 0");
        let e = Top::try_parse_from(["x", "--ray", "h:1", "--ray-memory", "lots"]).unwrap_err().to_string();
        assert!(e.contains("expected e.g. 2G"), "{e}");
    }

    #[test]
    fn every_command_with_units_takes_ray() {
        for line in [
            "eval grade --instances i.jsonl --predictions gold --ray h:1",
            "eval run --instances i.jsonl --solver-cmd true --ray h:1 --ray-cpus 2",
            "synth repo --ray h:1",
            "synth batch manifest.txt --ray h:1 --ray-memory 4G",
            "train --toy --ray h:1",
        ] {
            crate::Cli::try_parse_from(std::iter::once("frognano").chain(line.split(' ')))
                .unwrap_or_else(|e| panic!("{line}: {e}"));
        }
    }
}
