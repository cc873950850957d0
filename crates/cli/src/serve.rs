//! `frognano serve …`: the flags, turned into `frognano_serve::ServeConfig`; the server is the
//! library's.

use frognano_protocol::codec::ToolParser;
use frognano_serve::ServeConfig;

/// `frognano serve` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The model: a checkpoint folder, a `.gguf` file, or a hub id in the local cache.
    #[arg(value_name = "MODEL")]
    pub model: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Sequences generated at the same time (decoded together, one batched step per
    /// token); further requests wait their turn.
    #[arg(long, default_value_t = 4)]
    pub max_concurrent: usize,
    /// Context length in tokens (prompt + completion); default and maximum: the model's.
    #[arg(short = 'c', long = "ctx-size", visible_alias = "ctx", value_name = "N")]
    pub ctx: Option<usize>,
    /// KV cache element type: f16 (the default for GGUF models), q8_0 or q4_0 (llama.cpp's
    /// block formats: half and a quarter of f16's bytes per token, a little less exact), f32.
    #[arg(long = "kv-cache", value_name = "TYPE", value_parser = crate::run::parse_kv_cache)]
    pub kv_cache: Option<frognano_model::KvType>,
    /// The model name clients send in `model` (default: the file or folder name of MODEL).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Idle conversation states kept for prefix reuse, beyond one per concurrent sequence.
    #[arg(long, default_value_t = 8)]
    pub cached_sessions: usize,
    /// Start every request from an empty state (for measuring what prefix reuse saves).
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Prompts allowed to wait for a free slot (all requests together) before new requests
    /// get a 429 with `Retry-After`.
    #[arg(long, default_value_t = 512)]
    pub max_waiting: usize,
    /// Most prompts in one request (`/v1/completions` with a list of prompts); more is a 400.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub max_prompts_per_request: usize,
    /// The most prompt tokens prefilled between two decode steps of the running sequences: a
    /// long prompt comes in at most this many tokens at a time, so streams keep flowing.
    #[arg(long, default_value_t = frognano_engine::scheduler::DEFAULT_PREFILL_CHUNK, value_name = "TOKENS")]
    pub prefill_chunk: usize,
    /// While sequences are decoding, the time one prefill chunk may take as a fraction of a
    /// decode step (chunks are cut to it from measured times): their inter-token latency
    /// during a long prefill stays within about 1 + F times its normal value. 0: fixed chunks.
    #[arg(long, default_value_t = frognano_engine::scheduler::DEFAULT_PREFILL_STALL, value_name = "F")]
    pub prefill_stall: f64,
    /// Run a prompt's chunks apart, before the decode step, instead of
    /// inside it (one forward for the streams' rows and the chunk's, the weights read once).
    /// For measuring what the shared forward saves.
    #[arg(long)]
    pub prefill_apart: bool,
    /// Seconds a connection may take to send a request's headers, counted from when the
    /// server starts waiting for them (a new connection, or the next request on a kept-alive
    /// one: also the idle keep-alive timeout); then it is closed.
    #[arg(long = "header-timeout", default_value_t = 10, value_name = "SECS")]
    pub header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive after its headers; then a 408.
    #[arg(long = "body-timeout", default_value_t = 30, value_name = "SECS")]
    pub body_timeout_secs: u64,
    /// The tool-call format the model writes: qwen_xml, hermes, llama3_json or mistral
    /// (default: detected from the chat template).
    #[arg(long, value_name = "NAME")]
    pub tool_parser: Option<ToolParser>,
    /// Tool calls of `tool_choice: "auto"` replies under a grammar.
    #[command(flatten)]
    pub constrain: crate::constrain::ConstrainToolsArgs,
    /// Save every reply's conversation state in DIR and start a prompt from the longest saved
    /// one it extends, also after a restart: an agent's next turn does not prefill its history
    /// again (docs/serve.md §9).
    #[arg(long, value_name = "DIR")]
    pub session_dir: Option<std::path::PathBuf>,
    /// The most disk the states in --session-dir take (e.g. 8G, 500M); least recently used go
    /// first.
    #[arg(long, value_name = "BYTES", default_value = "8G", value_parser = crate::solve::parse_size)]
    pub session_budget: u64,
    /// Speculative decoding in the batched decode steps: none, lookup, or auto (the
    /// default: a greedy reply that copies its context checks drafts of what follows, while
    /// they pay; same text as plain decoding; docs/speculative.md).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = crate::run::parse_speculative)]
    pub speculative: frognano_engine::SpeculativeMode,
    /// Threads of the model (`-t/--threads`).
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
}

impl From<ServeArgs> for ServeConfig {
    fn from(a: ServeArgs) -> Self {
        ServeConfig {
            model: a.model,
            host: a.host,
            port: a.port,
            max_concurrent: a.max_concurrent,
            ctx: a.ctx,
            kv_cache: a.kv_cache,
            model_name: a.model_name,
            cached_sessions: a.cached_sessions,
            no_prefix_reuse: a.no_prefix_reuse,
            max_body_bytes: a.max_body_bytes,
            max_waiting: a.max_waiting,
            max_prompts_per_request: a.max_prompts_per_request,
            prefill_chunk: a.prefill_chunk,
            prefill_stall: a.prefill_stall,
            prefill_apart: a.prefill_apart,
            header_timeout_secs: a.header_timeout_secs,
            body_timeout_secs: a.body_timeout_secs,
            tool_parser: a.tool_parser,
            constrain_tools: a.constrain.choice(),
            session_dir: a.session_dir,
            session_budget: a.session_budget,
            speculative: a.speculative,
        }
    }
}

/// Runs `frognano serve` until Ctrl-C.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    frognano_serve::run_serve(a.into())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        let flags: ServeConfig = Top::try_parse_from(["x", "m.gguf"]).unwrap().serve.into();
        let lib = ServeConfig::for_model("m.gguf");
        assert_eq!(format!("{flags:?}"), format!("{lib:?}"));
    }

    #[test]
    fn tool_parser_names_are_checked() {
        let flags: ServeConfig =
            Top::try_parse_from(["x", "m.gguf", "--tool-parser", "llama3_json"]).unwrap().serve.into();
        assert_eq!(flags.tool_parser, Some(ToolParser::Llama3Json));
        let err = Top::try_parse_from(["x", "m.gguf", "--tool-parser", "xml"]).unwrap_err().to_string();
        assert!(
            err.contains("unknown tool parser \"xml\"; the known ones are qwen_xml, hermes, llama3_json, mistral"),
            "{err}"
        );
    }
}
