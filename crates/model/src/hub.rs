//! Hugging Face hub ids: resolution through the standard local cache
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) and download into it.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// The hub cache folder in use.
pub fn cache_dir() -> PathBuf {
    if let Ok(p) = std::env::var("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Ok(p) = std::env::var("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| ".".into());
    PathBuf::from(home).join(".cache/huggingface/hub")
}

/// True if `s` looks like `owner/name` rather than a path on disk.
pub fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        && !Path::new(s).exists()
}

/// Folder of `repo_id` in the cache: `models--owner--name`.
pub fn repo_folder(repo_id: &str) -> PathBuf {
    cache_dir().join(format!("models--{}", repo_id.replace('/', "--")))
}

/// The snapshot folder of `repo_id` at `revision` (a branch name in `refs/` or a commit).
pub fn resolve(repo_id: &str, revision: &str) -> Result<PathBuf> {
    let folder = repo_folder(repo_id);
    let refs = folder.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&refs) {
        Ok(c) => c.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    let snap = folder.join("snapshots").join(&commit);
    if snap.is_dir() {
        Ok(snap)
    } else {
        Err(ModelError::format(
            &folder,
            format!(
                "model `{repo_id}` (revision {revision}) is not in the local Hugging Face cache; \
                 run `frognano pull {repo_id}` or pass a local folder or .gguf file"
            ),
        ))
    }
}

/// Downloads every file of `repo_id` at `revision` into the cache and returns the snapshot
/// folder. Files already present are skipped, so an interrupted pull resumes.
pub fn pull(repo_id: &str, revision: &str, endpoint: &str, mut progress: impl FnMut(&str, u64)) -> Result<PathBuf> {
    let api = format!("{endpoint}/api/models/{repo_id}/revision/{revision}");
    let unreachable = |e: &dyn std::fmt::Display| {
        ModelError::format(&api, format!("cannot reach the model hub ({e}); check the network or set HF_ENDPOINT"))
    };
    let mut resp = ureq::get(&api).call().map_err(|e| unreachable(&e))?;
    let info: serde_json::Value = resp.body_mut().read_json().map_err(|e| unreachable(&e))?;
    let sha = info
        .get("sha")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ModelError::format(&api, "hub answer has no `sha` field"))?
        .to_string();
    let files: Vec<String> = info
        .get("siblings")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|s| s.get("rfilename")?.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let folder = repo_folder(repo_id);
    let snap = folder.join("snapshots").join(&sha);
    for f in &files {
        let dest = snap.join(f);
        if dest.exists() {
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ModelError::io(parent, e))?;
        }
        let url = format!("{endpoint}/{repo_id}/resolve/{sha}/{f}");
        let resp = ureq::get(&url).call().map_err(|e| unreachable(&e))?;
        let part = dest.with_extension("part");
        let mut out = std::fs::File::create(&part).map_err(|e| ModelError::io(&part, e))?;
        let n = std::io::copy(&mut resp.into_body().into_reader(), &mut out).map_err(|e| ModelError::io(&part, e))?;
        std::fs::rename(&part, &dest).map_err(|e| ModelError::io(&dest, e))?;
        progress(f, n);
    }
    let refs = folder.join("refs");
    std::fs::create_dir_all(&refs).map_err(|e| ModelError::io(&refs, e))?;
    std::fs::write(refs.join(revision), &sha).map_err(|e| ModelError::io(refs.join(revision), e))?;
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_told_apart_from_paths() {
        assert!(looks_like_repo_id("microsoft/FrogNano-4B-2609"));
        assert!(!looks_like_repo_id("models/a/b"));
        assert!(!looks_like_repo_id("model.gguf"));
    }
}
