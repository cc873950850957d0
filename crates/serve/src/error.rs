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
        }
    }

    /// A prompt (plus requested completion) that does not fit the context. The message
    /// contains "maximum context length", which clients look for.
    pub fn context_length(max_context: usize, prompt_tokens: usize, max_tokens: Option<usize>, param: &str) -> Self {
        let message = match max_tokens {
            Some(m) => format!(
                "This model's maximum context length is {max_context} tokens. However, you requested {} tokens \
                 ({prompt_tokens} in the prompt, {m} in the completion). Please reduce the length of the prompt \
                 or the completion.",
                prompt_tokens + m
            ),
            None => format!(
                "This model's maximum context length is {max_context} tokens. However, your prompt has \
                 {prompt_tokens} tokens, which leaves no room for a completion. Please reduce the length of the \
                 prompt."
            ),
        };
        ApiError { param: Some(param.into()), code: Some("context_length_exceeded"), ..Self::invalid(message) }
    }

    /// 404 for a path the server does not have.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: None,
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
        }
    }

    /// 503 when the waiting queue is full.
    pub fn overloaded(waiting: usize) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("The server is overloaded ({waiting} requests waiting); retry later."),
            kind: "server_error",
            param: None,
            code: Some("server_overloaded"),
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}
