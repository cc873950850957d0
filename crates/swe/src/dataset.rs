//! One entry point for every instance format: SWE-bench files ([`crate::instance`]) and
//! Harbor folders ([`crate::harbor`]). It sits above both so that neither imports the other
//! back.

use std::path::Path;

use crate::instance::{parse_json_instances, parse_jsonl_instances, parse_parquet_instances, SweInstance};

/// Loads instances from a `.json` (list, or one object), `.jsonl` or `.parquet` file, or a
/// Harbor dataset folder / task directory (see [`crate::harbor::load_harbor_instances`]).
pub fn load_instances(path: &Path) -> anyhow::Result<Vec<SweInstance>> {
    if path.is_dir() {
        return crate::harbor::load_harbor_instances(path);
    }
    let name = path.display().to_string();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "jsonl" => {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read instances {name}: {e}"))?;
            parse_jsonl_instances(&text, &name).map_err(Into::into)
        }
        "json" => {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read instances {name}: {e}"))?;
            parse_json_instances(&text, &name).map_err(Into::into)
        }
        "parquet" => {
            let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read instances {name}: {e}"))?;
            parse_parquet_instances(&bytes, &name).map_err(Into::into)
        }
        _ => anyhow::bail!("{name}: instances must be a .json, .jsonl or .parquet file, or a Harbor dataset folder"),
    }
}
