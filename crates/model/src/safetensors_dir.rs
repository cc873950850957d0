//! Hugging Face safetensors weights: one file or shards listed in
//! `model.safetensors.index.json`, memory-mapped, looked up by canonical name.
//!
//! Names are normalised so `model.language_model.X` and `model.X` are the same tensor; the
//! vision tower (`model.visual.*`) is skipped. The multi-token-prediction head (`mtp.*`) keeps
//! its names; [`crate::qwen35_mtp`] reads it when present.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};

use crate::error::{ModelError, Result};
use crate::tensor::{to_f32_vec, Bytes, DType, Matrix};
use crate::weights::{TensorSource, WeightSpec};

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    len: usize,
}

/// All tensors of a checkpoint, memory-mapped.
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    entries: HashMap<String, Entry>,
}

/// The canonical name of a stored tensor, or `None` for tensors the text model ignores.
pub fn canonical_name(name: &str) -> Option<String> {
    if name.starts_with("model.visual.") || name.starts_with("visual.") {
        return None;
    }
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        return Some(format!("model.{rest}"));
    }
    Some(name.to_string())
}

impl SafetensorsDir {
    /// Opens every weight file of the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::format(&index, format!("invalid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::format(&index, "missing object field `weight_map`"))?;
            let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
            files.sort();
            files.dedup();
            files.into_iter().map(|f| dir.join(f)).collect()
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| ModelError::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            found
        };
        if names.is_empty() {
            return Err(ModelError::format(dir, "no *.safetensors weight files in this folder"));
        }
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        for (fi, path) in names.into_iter().enumerate() {
            let file = std::fs::File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is read-only; a file changed underneath us is the user's problem
            // (documented behaviour of every mmap-based loader).
            let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let st = SafeTensors::deserialize(&mmap)
                .map_err(|e| ModelError::format(&path, format!("not a valid safetensors file: {e}")))?;
            let base = mmap.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let Some(canon) = canonical_name(&name) else { continue };
                let dtype = match view.dtype() {
                    Dtype::F32 => DType::F32,
                    Dtype::BF16 => DType::BF16,
                    Dtype::F16 => DType::F16,
                    other => {
                        return Err(ModelError::DType {
                            path: path.clone(),
                            name,
                            expected: "F32, BF16, F16".into(),
                            found: format!("{other:?}"),
                        })
                    }
                };
                let data = view.data();
                entries.insert(
                    canon,
                    Entry {
                        file: fi,
                        dtype,
                        shape: view.shape().to_vec(),
                        start: data.as_ptr() as usize - base,
                        len: data.len(),
                    },
                );
            }
            files.push((path, Arc::new(mmap)));
        }
        Ok(SafetensorsDir { dir: dir.to_path_buf(), files, entries })
    }

    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True if a tensor of that canonical name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Total bytes of the tensors the text model uses.
    pub fn byte_len(&self) -> usize {
        self.entries.values().map(|e| e.len).sum()
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<(&Entry, &PathBuf)> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { path: self.dir.clone(), name: name.into() })?;
        let path = &self.files[e.file].0;
        // Accept trailing/leading singleton dims (conv1d is stored [C, 1, K]).
        let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if squeeze(&e.shape) != squeeze(shape) {
            return Err(ModelError::Shape {
                path: path.clone(),
                name: name.into(),
                expected: shape.to_vec(),
                found: e.shape.clone(),
            });
        }
        Ok((e, path))
    }

    /// A `[rows, cols]` matrix that stays in the memory map.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (e, _) = self.entry(name, &[rows, cols])?;
        Ok(Matrix::new(rows, cols, e.dtype, Bytes::mapped(self.files[e.file].1.clone(), e.start, e.len)))
    }

    /// A small tensor of `shape` widened to f32 (norm weights, gates, conv kernels).
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (e, _) = self.entry(name, shape)?;
        Ok(to_f32_vec(&self.files[e.file].1[e.start..e.start + e.len], e.dtype))
    }

    /// Stored dtype of a tensor.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.entries.get(name).map(|e| e.dtype)
    }
}

/// Tensors by canonical name, as the checkpoint stores them (Hugging Face layout).
impl TensorSource for SafetensorsDir {
    fn origin(&self) -> &Path {
        self.dir()
    }
    fn contains(&self, name: &str) -> bool {
        SafetensorsDir::contains(self, name)
    }
    fn matrix(&self, w: &WeightSpec) -> Result<Matrix> {
        let (rows, cols) = w.dims2();
        SafetensorsDir::matrix(self, &w.name, rows, cols)
    }
    fn stored_f32(&self, w: &WeightSpec) -> Result<Vec<f32>> {
        self.f32(&w.name, &w.shape)
    }
}
