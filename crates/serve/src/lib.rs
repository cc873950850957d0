//! # frognano-serve
//!
//! HTTP: the OpenAI-compatible API over the engine (`frognano serve MODEL`).
//!
//! Endpoints: `POST /v1/chat/completions` (tools, streaming, logprobs, reasoning),
//! `POST /v1/completions` (text or token-id prompts), `GET /v1/models`, `GET /health`,
//! `POST /tokenize`, `POST /detokenize`; the OpenAI ones also without the `/v1` prefix.
//! Ollama's API ([`ollama`]: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`) and
//! Anthropic's Messages API ([`anthropic`]: `/v1/messages`) run on the same chat path.
//! Bad input gets OpenAI-shaped error JSON ([`error::ApiError`]) that never shows the server's
//! paths ([`error::PathScrubber`]). What is read and sent, field by field: docs/serve.md. Generation runs on one scheduler thread that batches the decode
//! steps of all running sequences, over prefix-routed
//! engine sessions ([`pool`]). Conversations arrive as `frognano_protocol::Message`s and are
//! rendered with the model's chat template; model replies are split into reasoning, content
//! and tool calls by the protocol's tool-call codec (`frognano_protocol::codec`, used in
//! [`output`]), the same one the agent's in-process backend uses.
//!
//! ```no_run
//! // In-process, on an ephemeral port (what the tests do):
//! let mut args = frognano_serve::ServeConfig::for_model("fixtures/qwen35-tiny");
//! args.port = 0;
//! let server = frognano_serve::spawn_server(args).unwrap();
//! println!("listening on {}", server.url());
//! server.shutdown().unwrap();
//! ```

pub mod anthropic;
pub mod api;
pub mod error;
pub mod ollama;
pub mod output;
pub mod pool;
pub mod responses;
pub mod routes;
pub mod structured;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::Context;
use frognano_model::LoadedModel;
use frognano_protocol::codec::ToolParser;
use tokio::sync::oneshot;

use crate::pool::EnginePool;
use crate::routes::AppState;

/// What `frognano serve` runs: the model, where to listen, and the scheduler's limits. The
/// flags that fill it are in `crates/cli`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The model: a checkpoint folder, a `.gguf` file, or a hub id in the local cache.
    pub model: String,
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0 picks a free one).
    pub port: u16,
    /// Sequences generated at the same time (decoded together, one batched step per token);
    /// further requests wait their turn.
    pub max_concurrent: usize,
    /// Context length in tokens (prompt + completion); default and maximum: the model's.
    pub ctx: Option<usize>,
    /// KV cache element type (`--kv-cache`; default: the model's own, f16 for GGUF models).
    pub kv_cache: Option<frognano_model::KvType>,
    /// The model name clients send in `model` (default: the file or folder name of `model`).
    pub model_name: Option<String>,
    /// Idle conversation states kept for prefix reuse, beyond one per concurrent sequence.
    pub cached_sessions: usize,
    /// Start every request from an empty state (for measuring what prefix reuse saves).
    pub no_prefix_reuse: bool,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Prompts allowed to wait for a free slot (all requests together) before new requests
    /// get a 429 with `Retry-After`.
    pub max_waiting: usize,
    /// Most prompts in one request (`/v1/completions` with a list of prompts); more is a 400.
    pub max_prompts_per_request: usize,
    /// The most prompt tokens prefilled per scheduler iteration, between two decode steps of
    /// the running sequences (`frognano_engine::SchedulerConfig::prefill_chunk`).
    pub prefill_chunk: usize,
    /// While sequences are decoding, the time a prefill chunk may take as a fraction of a
    /// decode step (`frognano_engine::SchedulerConfig::prefill_stall`; 0: fixed chunks).
    pub prefill_stall: f64,
    /// Run prompt chunks apart from the decode steps instead of inside them
    /// (`frognano_engine::SchedulerConfig::prefill_inside_step` off: for measuring).
    pub prefill_apart: bool,
    /// Seconds a connection may take to deliver a request's headers, counted from when the
    /// server starts waiting for them: on a new connection, and between requests on a
    /// kept-alive one (so it is also the idle keep-alive timeout). Then it is closed.
    pub header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive once its headers are in; then a 408.
    pub body_timeout_secs: u64,
    /// The tool-call format replies are read in (default: the chat template's,
    /// `frognano_model::chat::ChatTemplate::tool_parser`).
    pub tool_parser: Option<ToolParser>,
    /// Sample `tool_choice: "auto"` replies to requests with tools under a grammar of the
    /// tools' calls, so a reply is free text or well-formed calls (`Some(true)`), or leave
    /// them free (`Some(false)`); `None`: on unless the model is a Qwen3.5/FrogNano one.
    pub constrain_tools: Option<bool>,
    /// A folder where every reply's conversation state is saved and restored from on a
    /// matching prefix, also after a restart (`--session-dir`; docs/serve.md §9).
    pub session_dir: Option<std::path::PathBuf>,
    /// The most bytes of states kept in `session_dir` (least recently used go first).
    pub session_budget: u64,
    /// Drafting in the batched decode steps (`--speculative`; docs/speculative.md).
    pub speculative: frognano_engine::SpeculativeMode,
}

impl ServeConfig {
    /// The command line's defaults, for `model`.
    pub fn for_model(model: impl Into<String>) -> Self {
        ServeConfig {
            model: model.into(),
            host: "127.0.0.1".into(),
            port: 8000,
            max_concurrent: 4,
            ctx: None,
            kv_cache: None,
            model_name: None,
            cached_sessions: 8,
            no_prefix_reuse: false,
            max_body_bytes: 32 * 1024 * 1024,
            max_waiting: 512,
            max_prompts_per_request: 32,
            prefill_chunk: frognano_engine::scheduler::DEFAULT_PREFILL_CHUNK,
            prefill_stall: frognano_engine::scheduler::DEFAULT_PREFILL_STALL,
            prefill_apart: false,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            tool_parser: None,
            constrain_tools: None,
            session_dir: None,
            session_budget: DEFAULT_SESSION_BUDGET,
            speculative: frognano_engine::SpeculativeMode::default(),
        }
    }

    /// Checks the settings that do not need the model; the message names the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_concurrent == 0 {
            anyhow::bail!("--max-concurrent must be at least 1");
        }
        if self.max_body_bytes == 0 {
            anyhow::bail!("--max-body-bytes must be at least 1");
        }
        if self.max_prompts_per_request == 0 {
            anyhow::bail!("--max-prompts-per-request must be at least 1");
        }
        if self.prefill_chunk == 0 {
            anyhow::bail!("--prefill-chunk must be at least 1");
        }
        if !(self.prefill_stall.is_finite() && self.prefill_stall >= 0.0) {
            anyhow::bail!("--prefill-stall must be a number ≥ 0 (0 turns it off), found {}", self.prefill_stall);
        }
        if self.header_timeout_secs == 0 {
            anyhow::bail!("--header-timeout must be at least 1 second");
        }
        if self.body_timeout_secs == 0 {
            anyhow::bail!("--body-timeout must be at least 1 second");
        }
        Ok(())
    }
}

/// The default model name: the file stem of a `.gguf`, else the last path component.
fn default_model_name(spec: &str) -> String {
    let p = Path::new(spec.trim_end_matches('/'));
    let name = if p.extension().is_some_and(|e| e == "gguf") { p.file_stem() } else { p.file_name() };
    name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| spec.to_string())
}

/// [`ServeConfig::session_budget`]'s default: 8 GiB.
pub const DEFAULT_SESSION_BUDGET: u64 = 8 << 30;

/// Loads the model and starts the generation scheduler.
fn load_state(args: &ServeConfig) -> anyhow::Result<Arc<AppState>> {
    args.validate()?; // before the model loads: a bad flag should not wait for it
    let loaded = frognano_model::load(&args.model).with_context(|| format!("loading {}", args.model))?;
    state_from_loaded(loaded, args)
}

/// Starts the generation scheduler over an already loaded model.
fn state_from_loaded(loaded: LoadedModel, args: &ServeConfig) -> anyhow::Result<Arc<AppState>> {
    let mut facts = ollama::ModelFacts::read(&loaded.path, &loaded.architecture);
    let tokenizer = Arc::new(
        loaded
            .tokenizer
            .with_context(|| format!("{}: the model has no tokenizer; the server needs one", args.model))?,
    );
    let mut model = loaded.model;
    if let Some(ty) = args.kv_cache {
        model.set_kv_type(ty).with_context(|| format!("--kv-cache {ty}"))?;
    }
    let kv_cache = model.kv_type().to_string();
    let model: Arc<dyn frognano_model::CausalLm> = Arc::from(model);
    let store = match &args.session_dir {
        None => None,
        Some(dir) => {
            let model_path =
                frognano_model::load::resolve_path(&args.model).unwrap_or_else(|_| args.model.clone().into());
            let id = frognano_engine::persist::model_identity(&model_path);
            let store = frognano_engine::SessionStore::open(dir, &id, model.as_ref(), args.session_budget)
                .with_context(|| format!("--session-dir {}", dir.display()))?;
            let st = store.stats();
            tracing::info!(
                "session store {}: {} states, {:.1} of {:.1} GB",
                dir.display(),
                st.files,
                st.bytes as f64 / 1e9,
                st.budget as f64 / 1e9
            );
            Some(Arc::new(store))
        }
    };
    let model_max = model.max_context();
    let ctx = match args.ctx {
        None => model_max,
        Some(0) => anyhow::bail!("-c/--ctx-size must be at least 1"),
        Some(n) if n > model_max => {
            anyhow::bail!("-c/--ctx-size {n} is larger than the model's context of {model_max} tokens")
        }
        Some(n) => n,
    };
    args.validate()?;
    facts.memory = (loaded.weight_bytes + model.cache_bytes(ctx)) as u64;
    facts.on_device = frognano_model::load::accelerator().is_some();
    if loaded.eos_ids.is_empty() {
        tracing::warn!("the model declares no end-of-sequence token; replies end only at max_tokens or a stop string");
    }
    let template_parser = loaded.chat_template.as_ref().map(|t| t.tool_parser());
    if loaded.chat_template.as_ref().is_some_and(|t| !t.supports_tools()) {
        tracing::warn!(
            "{}: the chat template does not show the model its tools; requests with tools get them described in \
             the system prompt in the Hermes form (response header x-frognano-tool-prompt: injected)",
            args.model
        );
    }
    let tool_parser = args.tool_parser.or(template_parser).unwrap_or(ToolParser::Hermes);
    // (Without a grammar, Mistral's and Granite's formats would get every request with tools
    // refused.)
    let constrain_tools = args.constrain_tools.unwrap_or_else(|| {
        frognano_engine::tool_grammar::constrain_tools_by_default(Some(&loaded.architecture), tool_parser)
    });
    if constrain_tools {
        tracing::info!("tool calls of tool_choice \"auto\" replies are constrained by a grammar (--no-constrain-tools to turn off)");
    }
    let vocab_size = model.vocab_size();
    let max_token_bytes = routes::longest_token_bytes(&tokenizer);
    let constraints = frognano_engine::LazyConstraints::new(Arc::clone(&tokenizer), vocab_size, loaded.eos_ids.clone());
    let pool = EnginePool::start(
        model,
        Arc::clone(&tokenizer),
        frognano_engine::SchedulerConfig {
            max_batch: args.max_concurrent,
            sessions: args.max_concurrent + args.cached_sessions,
            prefix_reuse: !args.no_prefix_reuse,
            max_waiting: args.max_waiting,
            prefill_chunk: args.prefill_chunk,
            prefill_stall: args.prefill_stall,
            prefill_inside_step: !args.prefill_apart,
            store,
            speculative: args.speculative,
        },
    )
    .context("starting the generation scheduler")?;
    let scrubber =
        error::PathScrubber::for_server(Path::new(&args.model), loaded.chat_template.as_ref().map(|t| t.origin()));
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    Ok(Arc::new(AppState {
        model_name: args.model_name.clone().unwrap_or_else(|| default_model_name(&args.model)),
        ctx,
        kv_cache,
        vocab_size,
        tokenizer,
        template: loaded.chat_template,
        tool_parser,
        eos_ids: loaded.eos_ids,
        defaults: loaded.generation,
        pool,
        created,
        max_body_bytes: args.max_body_bytes,
        body_timeout: std::time::Duration::from_secs(args.body_timeout_secs),
        max_prompts_per_request: args.max_prompts_per_request,
        max_token_bytes,
        next_id: AtomicU64::new(0),
        scrubber,
        constraints,
        constrain_tools,
        facts,
    }))
}

fn bind(args: &ServeConfig) -> anyhow::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Accepts connections and serves each with hyper's HTTP/1 server, under a header read
/// timeout (hyper's timer runs from when a connection starts waiting for a request's headers:
/// on a new connection and between kept-alive requests, so slow and idle connections are
/// closed). On `shutdown` it stops accepting and waits for open connections to finish.
async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    header_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let router = routes::router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection closed by its client or by the header timeout ends here.
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// Runs `frognano serve` until Ctrl-C.
pub fn run_serve(args: ServeConfig) -> anyhow::Result<()> {
    let state = load_state(&args)?;
    let listener = bind(&args)?;
    let addr = listener.local_addr()?;
    eprintln!(
        "frognano serve: model `{}` on http://{addr}/v1 (context {} tokens, {} concurrent, {} threads, tool calls: {})",
        state.model_name,
        state.ctx,
        args.max_concurrent,
        rayon::current_num_threads(),
        state.tool_parser
    );
    let header_timeout = std::time::Duration::from_secs(args.header_timeout_secs);
    runtime()?.block_on(serve(listener, state, header_timeout, async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("frognano serve: shutting down");
    }))
}

/// A server running in the background of this process (see [`spawn_server`]).
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl ServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server (open connections finish first) and waits for it.
    pub fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Loads the model, binds `args.host:args.port` (port 0: a free one) and serves on a
/// background thread. Returns once the server accepts connections.
pub fn spawn_server(args: ServeConfig) -> anyhow::Result<ServerHandle> {
    let state = load_state(&args)?;
    spawn_with_state(state, &args)
}

/// Like [`spawn_server`], over a model already loaded (or assembled by hand: a test can put
/// its own [`frognano_model::CausalLm`] or chat template into the [`LoadedModel`]).
/// `args.model` is then only the default model name.
pub fn spawn_server_with_model(loaded: LoadedModel, args: ServeConfig) -> anyhow::Result<ServerHandle> {
    let state = state_from_loaded(loaded, &args)?;
    spawn_with_state(state, &args)
}

fn spawn_with_state(state: Arc<AppState>, args: &ServeConfig) -> anyhow::Result<ServerHandle> {
    let listener = bind(args)?;
    let addr = listener.local_addr()?;
    let rt = runtime()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let header_timeout = std::time::Duration::from_secs(args.header_timeout_secs);
    let thread = std::thread::Builder::new().name("frognano-serve".into()).spawn(move || {
        rt.block_on(serve(listener, state, header_timeout, async {
            let _ = stopped.await;
        }))
    })?;
    Ok(ServerHandle { addr, stop: Some(stop), thread: Some(thread) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names() {
        assert_eq!(default_model_name("models/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(default_model_name("fixtures/qwen35-tiny/"), "qwen35-tiny");
        assert_eq!(default_model_name("Qwen/Qwen3.5-4B"), "Qwen3.5-4B");
    }
}
