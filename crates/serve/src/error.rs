//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! OpenAI uses for the same mistake.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error returned to the client as OpenAI error JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a human.
    pub message: String,
    /// OpenAI's error type: `invalid_request_error`, `not_found_error`, `server_error`, …
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying, sent as `Retry-After` (a full queue's 429).
    pub retry_after: Option<u64>,
    /// For a prompt that does not fit the context: its size and the context's, which each API
    /// words as its clients look for ([`ApiError::context_length`]).
    pub overflow: Option<ContextOverflow>,
}

/// A prompt longer than the context, as [`ApiError::context_length`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOverflow {
    /// The prompt's tokens: counted, or (when `at_least`) a lower bound from its bytes
    /// (saturated at `u32::MAX`; kept small, as every handler returns `ApiError` by value).
    pub prompt_tokens: u32,
    /// Whether `prompt_tokens` is a lower bound (the text was refused before tokenizing).
    pub at_least: bool,
    /// The context's size in tokens.
    pub max_context: u32,
}

impl ContextOverflow {
    /// A prompt of `prompt_tokens` (a lower bound when `at_least`) against `max_context`.
    pub fn new(prompt_tokens: usize, at_least: bool, max_context: usize) -> Self {
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        ContextOverflow { prompt_tokens: small(prompt_tokens), at_least, max_context: small(max_context) }
    }

    /// The prompt's size as a message gives it: `N` or `at least N`.
    pub fn prompt_size(&self) -> String {
        if self.at_least {
            format!("at least {}", self.prompt_tokens)
        } else {
            self.prompt_tokens.to_string()
        }
    }

    /// Anthropic's wording, `prompt is too long: N tokens > M maximum`: Claude Code reads the
    /// two numbers from it to compact the conversation (and by how much).
    pub fn anthropic_message(&self) -> String {
        format!("prompt is too long: {} tokens > {} maximum", self.prompt_size(), self.max_context)
    }

    /// The Responses API's wording (OpenAI's sentence, with the two sizes).
    pub fn responses_message(&self) -> String {
        format!(
            "Your input exceeds the context window of this model ({} tokens; the context holds {}). Please adjust \
             your input and try again.",
            self.prompt_size(),
            self.max_context
        )
    }
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
            overflow: None,
        }
    }

    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.into()), ..Self::invalid(message) }
    }

    /// The 404 OpenAI returns for a model it does not serve.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{requested}` does not exist; this server serves `{served}`."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
            overflow: None,
        }
    }

    /// A prompt that does not fit the context (`max_tokens` is a cap, never refused for its
    /// size). The message contains "maximum context length", which clients look for.
    pub fn context_length(max_context: usize, prompt_tokens: usize, param: &str) -> Self {
        let message = format!(
            "This model's maximum context length is {max_context} tokens. However, your prompt has \
             {prompt_tokens} tokens, which leaves no room for a completion. Please reduce the length of the prompt."
        );
        ApiError {
            param: Some(param.into()),
            code: Some("context_length_exceeded"),
            overflow: Some(ContextOverflow::new(prompt_tokens, false, max_context)),
            ..Self::invalid(message)
        }
    }

    /// 404 for a path the server does not have.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: None,
            retry_after: None,
            overflow: None,
        }
    }

    /// 413 for a request body over the limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("The request body is larger than the server's limit of {limit} bytes."),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
            overflow: None,
        }
    }

    /// 429 when the waiting queue has no room for the request's prompts; the response says
    /// when to come back ([`ApiError::retry_after_secs`]).
    pub fn overloaded(waiting: usize, max_batch: usize) -> Self {
        let retry = Self::retry_after_secs(waiting, max_batch);
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("The server is busy ({waiting} prompts are waiting for a free slot); retry in {retry} s."),
            kind: "rate_limit_error",
            param: None,
            code: Some("server_overloaded"),
            retry_after: Some(retry),
            overflow: None,
        }
    }

    /// The `Retry-After` of a full queue: about one second per batch of waiting prompts
    /// (`waiting / max_batch`, rounded up), from 1 to 60 s. A rough hint, not a promise.
    pub fn retry_after_secs(waiting: usize, max_batch: usize) -> u64 {
        (waiting.div_ceil(max_batch.max(1)) as u64).clamp(1, 60)
    }

    /// 408 for a request body that did not arrive within `--body-timeout`.
    pub fn body_timeout(secs: u64) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!("The request body did not arrive within {secs} s (--body-timeout)."),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
            retry_after: None,
            overflow: None,
        }
    }

    /// 500 for a failure inside the server (model error, worker gone).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
            overflow: None,
        }
    }

    /// An engine failure: a request the engine refused is a 400, anything else a 500.
    pub fn from_engine(e: &frognano_engine::EngineError) -> Self {
        use frognano_engine::EngineError;
        use frognano_model::ModelError;
        match e {
            EngineError::Request(m) => Self::invalid(m.clone()),
            EngineError::Model(ModelError::Input(m)) => Self::invalid(m.clone()),
            EngineError::Model(m) => Self::internal(format!("Generation failed: {m}")),
            EngineError::Failed(m) => Self::internal(format!("Generation failed: {m}")),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Takes the server's own locations out of what clients are told: an error about the model
/// (a template that raised, a file that could not be read) names its file as the model crate
/// names it, by path. Each known folder (the model's, its chat template's, the working
/// directory, the home directory), as given and resolved, is cut from the front of any path
/// in the message (`/srv/models/x.gguf: …` → `x.gguf: …`); the folder alone becomes its last
/// name.
#[derive(Debug, Clone, Default)]
pub struct PathScrubber {
    /// (folder with a trailing `/`, what the bare folder becomes), longest first.
    folders: Vec<(String, String)>,
}

impl PathScrubber {
    /// A scrubber for `folders`; relative and empty ones are skipped (they say nothing about
    /// the server's layout), and each is also taken in its resolved form.
    pub fn new(folders: impl IntoIterator<Item = std::path::PathBuf>) -> Self {
        let mut out: Vec<(String, String)> = Vec::new();
        for dir in folders {
            let resolved = std::fs::canonicalize(&dir).ok();
            for d in std::iter::once(dir).chain(resolved) {
                let text = d.to_string_lossy().trim_end_matches('/').to_string();
                if !d.is_absolute() || text.is_empty() || out.iter().any(|(f, _)| f.trim_end_matches('/') == text) {
                    continue;
                }
                let name = d.file_name().map_or_else(|| ".".to_string(), |n| n.to_string_lossy().into_owned());
                out.push((format!("{text}/"), name));
            }
        }
        out.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
        PathScrubber { folders: out }
    }

    /// The scrubber of a server: the model's folder (`model` is a file or a folder), the chat
    /// template's, the working directory and the home directory.
    pub fn for_server(model: &std::path::Path, template: Option<&std::path::Path>) -> Self {
        let mut folders = Vec::new();
        for p in std::iter::once(model).chain(template) {
            // As given (perhaps with `..` in it) and, by `new`, resolved.
            let folder = if p.is_dir() { Some(p) } else { p.parent() };
            folders.extend(folder.map(std::path::Path::to_path_buf));
        }
        folders.extend(std::env::current_dir().ok());
        folders.extend(std::env::var_os("HOME").map(std::path::PathBuf::from));
        Self::new(folders)
    }

    /// `text` without the known folders.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (folder, name) in &self.folders {
            if out.contains(folder.as_str()) {
                out = out.replace(folder.as_str(), "");
            }
            let bare = &folder[..folder.len() - 1];
            if out.contains(bare) {
                out = out.replace(bare, name);
            }
        }
        out
    }

    /// `error` with a scrubbed message.
    pub fn error(&self, error: ApiError) -> ApiError {
        ApiError { message: self.scrub(&error.message), ..error }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.retry_after;
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = retry {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// An I/O or format error from the model crate names its file by path; the client sees
    /// the file's name inside the model folder, never where the folder is.
    #[test]
    fn model_errors_reach_clients_without_the_servers_paths() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir(&models).unwrap();
        let gguf = models.join("m.gguf");
        std::fs::write(&gguf, b"").unwrap();
        let scrubber = PathScrubber::for_server(&gguf, None);
        let io = frognano_model::ModelError::io(&gguf, std::io::Error::new(std::io::ErrorKind::NotFound, "gone"));
        let err = ApiError::from_engine(&frognano_engine::EngineError::Model(io));
        assert!(err.message.contains(&models.display().to_string()), "the raw message has the path: {}", err.message);
        let public = scrubber.error(err);
        assert_eq!(public.message, "Generation failed: m.gguf: gone");
        assert_eq!(public.status, StatusCode::INTERNAL_SERVER_ERROR);
        // The folder given another way (with `..`, or resolved through a link) goes too.
        let roundabout = models.join("../models/sub/x.json");
        let format = frognano_model::ModelError::format(&roundabout, "not valid JSON");
        let public = scrubber.scrub(&format.to_string());
        assert!(!public.contains(&dir.path().display().to_string()), "{public}");
        assert!(public.ends_with("sub/x.json: not valid JSON"), "{public}");
        // The bare folder keeps its last name; unrelated text is left alone.
        assert_eq!(scrubber.scrub(&format!("cannot list {}", models.display())), "cannot list models");
        assert_eq!(scrubber.scrub("POST /v1/chat/completions"), "POST /v1/chat/completions");
    }

    #[test]
    fn relative_folders_are_not_scrubbed() {
        let s = PathScrubber::new([std::path::PathBuf::from("models"), std::path::PathBuf::new()]);
        assert_eq!(s.scrub("models/x.gguf: bad"), "models/x.gguf: bad");
    }
}
