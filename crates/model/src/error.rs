//! The one error type of the model crate: every failure names the file and, where there is
//! one, the tensor or field that is wrong.

use std::path::PathBuf;

/// What went wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file exists but its contents are not what the format requires.
    #[error("{path}: {msg}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field or tensor.
        msg: String,
    },
    /// A tensor is missing from every weight file.
    #[error("{path}: tensor `{name}` not found")]
    MissingTensor {
        /// The weight file or folder searched.
        path: PathBuf,
        /// The tensor name (after prefix normalisation).
        name: String,
    },
    /// A tensor's shape disagrees with config.json.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?} from config.json")]
    Shape {
        /// The weight file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// Shape derived from config.json.
        expected: Vec<usize>,
        /// Shape stored in the file.
        found: Vec<usize>,
    },
    /// A tensor has a dtype the loader does not handle.
    #[error("{path}: tensor `{name}` has dtype {found}, expected one of {expected}")]
    DType {
        /// The weight file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// Accepted dtypes.
        expected: String,
        /// The dtype stored.
        found: String,
    },
    /// Bad input at run time (token ids, lengths).
    #[error("{0}")]
    Input(String),
    /// An accelerator failed (a CUDA call, device memory), with its message.
    #[error("{0}")]
    Device(String),
}

/// Result alias for the model crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    /// A format error for `path`.
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Format { path: path.into(), msg: msg.into() }
    }
    /// An I/O error for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.into(), source }
    }
}
