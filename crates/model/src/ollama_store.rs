//! Models already pulled with Ollama: a reference such as `qwen2.5-coder:1.5b`,
//! `library/llama3.2:latest` or `hf.co/bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M` names
//! the GGUF file Ollama keeps in its store, so `frognano run qwen2.5-coder:1.5b` needs no second
//! download; a bare name (`llama3.2`) that is no path means its `latest` tag, as in Ollama.
//!
//! The store is `$OLLAMA_MODELS`, else `~/.ollama/models`, else the system service's
//! `/usr/share/ollama/.ollama/models`. A reference `[host/][namespace/]name[:tag]` (host
//! `registry.ollama.ai`, namespace `library` and tag `latest` by default) has its manifest at
//! `manifests/host/namespace/name/tag`, a JSON object whose `layers` list the blobs; the layer of
//! media type `application/vnd.ollama.image.model` is the GGUF file, stored as
//! `blobs/sha256-<hex>` (no extension: [`crate::load`] recognises GGUF files by their magic).

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// The media type of the layer that holds the weights (a GGUF file).
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// The Ollama stores to look in, in order.
pub fn store_dirs() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("OLLAMA_MODELS") {
        return vec![PathBuf::from(p)];
    }
    let mut dirs = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".ollama/models"));
    }
    dirs.push(PathBuf::from("/usr/share/ollama/.ollama/models"));
    dirs
}

/// Whether `spec` reads as an Ollama reference rather than a path or a hub id: a `name:tag`
/// (the tag is what tells them apart from a Hugging Face `owner/name`), no path of that name
/// existing.
pub fn looks_like_reference(spec: &str) -> bool {
    let Some((name, tag)) = spec.rsplit_once(':') else { return false };
    is_part(tag) && name.split('/').count() <= 3 && name.split('/').all(is_part) && !Path::new(spec).exists()
}

/// Whether `s` can be one part of a reference (host, namespace, name or tag).
fn is_part(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The manifest path of `spec` under the store `store` (`None` for a reference with more
/// than three `/`-parts).
fn manifest_path(store: &Path, spec: &str) -> Option<PathBuf> {
    let (name, tag) = spec.rsplit_once(':').unwrap_or((spec, "latest"));
    let parts: Vec<&str> = name.split('/').collect();
    let (host, namespace, model) = match parts.as_slice() {
        [m] => ("registry.ollama.ai", "library", *m),
        [ns, m] => ("registry.ollama.ai", *ns, *m),
        [h, ns, m] => (*h, *ns, *m),
        _ => return None,
    };
    Some(store.join("manifests").join(host).join(namespace).join(model).join(tag))
}

/// The GGUF blob of the Ollama model `spec` in the store `store`, `Ok(None)` when the store has
/// no such model; a manifest without a model layer, or whose blob is missing, is an error
/// naming it.
pub fn resolve_in(store: &Path, spec: &str) -> Result<Option<PathBuf>> {
    let Some(manifest) = manifest_path(store, spec) else { return Ok(None) };
    let text = match std::fs::read_to_string(&manifest) {
        Ok(t) => t,
        // (The system service's store is often unreadable to other users: not this store's.)
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => {
            return Ok(None)
        }
        Err(e) => return Err(ModelError::io(&manifest, e)),
    };
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::format(&manifest, format!("not an Ollama manifest (invalid JSON: {e})")))?;
    let digest = v
        .get("layers")
        .and_then(|l| l.as_array())
        .and_then(|layers| layers.iter().find(|l| l.get("mediaType").and_then(|m| m.as_str()) == Some(MODEL_LAYER)))
        .and_then(|l| l.get("digest")?.as_str())
        .ok_or_else(|| ModelError::format(&manifest, format!("the manifest lists no `{MODEL_LAYER}` layer")))?;
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| {
            ModelError::format(&manifest, format!("model layer digest {digest:?} is not sha256:<64 hex>"))
        })?;
    let blob = store.join("blobs").join(format!("sha256-{hex}"));
    if !blob.is_file() {
        return Err(ModelError::format(&manifest, format!("its model blob {} is missing", blob.display())));
    }
    Ok(Some(blob))
}

/// A bare name (`llama3.2`, as `ollama run llama3.2` takes it) that no path has: its `latest`
/// tag's GGUF blob, when an Ollama store has one; `Ok(None)` otherwise (the caller then says
/// the path does not exist).
pub fn resolve_untagged(spec: &str) -> Result<Option<PathBuf>> {
    if !is_part(spec) || Path::new(spec).exists() {
        return Ok(None);
    }
    find(&store_dirs(), spec)
}

/// The GGUF blob of `spec` in the first of `stores` that has it.
fn find(stores: &[PathBuf], spec: &str) -> Result<Option<PathBuf>> {
    for store in stores {
        if let Some(blob) = resolve_in(store, spec)? {
            return Ok(Some(blob));
        }
    }
    Ok(None)
}

/// The GGUF blob of the Ollama model `spec`, from the first store that has it ([`store_dirs`]);
/// an error names the stores looked in.
pub fn resolve(spec: &str) -> Result<PathBuf> {
    let stores = store_dirs();
    if let Some(blob) = find(&stores, spec)? {
        return Ok(blob);
    }
    let looked: Vec<String> = stores.iter().map(|s| s.display().to_string()).collect();
    Err(ModelError::format(
        Path::new(spec),
        format!(
            "no such file or folder, and no Ollama model of that name in {} (set OLLAMA_MODELS to another store)",
            looked.join(" or ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_their_manifests() {
        assert!(looks_like_reference("qwen2.5-coder:1.5b"));
        assert!(looks_like_reference("hf.co/bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M"));
        assert!(!looks_like_reference("Qwen/Qwen2.5-Coder-1.5B"));
        assert!(!looks_like_reference("model.gguf"));
        assert!(!looks_like_reference("C:thing/../x:y"));
        let s = Path::new("/s");
        assert_eq!(
            manifest_path(s, "qwen2.5-coder:1.5b").unwrap(),
            Path::new("/s/manifests/registry.ollama.ai/library/qwen2.5-coder/1.5b")
        );
        assert_eq!(manifest_path(s, "me/tool:v1").unwrap(), Path::new("/s/manifests/registry.ollama.ai/me/tool/v1"));
        assert_eq!(
            manifest_path(s, "hf.co/bartowski/Repo-GGUF:Q4_K_M").unwrap(),
            Path::new("/s/manifests/hf.co/bartowski/Repo-GGUF/Q4_K_M")
        );
        assert_eq!(
            manifest_path(s, "llama3.2").unwrap(),
            Path::new("/s/manifests/registry.ollama.ai/library/llama3.2/latest")
        );
    }
}
