//! Chat templates: Hugging Face jinja chat templates rendered with minijinja to the same bytes
//! transformers' `apply_chat_template` renders (transformers 5.23 + jinja2 semantics).
//!
//! What is reproduced, and where it lives here:
//! * the jinja environment: `trim_blocks` + `lstrip_blocks`, loop controls, `namespace`,
//!   `raise_exception`, `strftime_now`, Python string/dict methods (`startswith`, `split`,
//!   `rstrip`, `items`, …);
//! * Python-valued output: `{{ x }}` and `x|string` print like Python `str()` (`True`, `None`,
//!   `['a', 1]`, `1.0`), `tojson` is `json.dumps(x, ensure_ascii=False)` with `", "`/`": "`
//!   separators and key order kept (plus its `indent`, `separators`, `sort_keys` options);
//!   `is sequence` is true for strings and mappings as in jinja2;
//! * transformers' message preparation: top-level `null` fields dropped, `reasoning_content`
//!   / `reasoning` / `thinking` aliased onto each other, special tokens
//!   (`bos_token`, `eos_token`, …) from tokenizer_config.json passed to the template,
//!   `tools = None` and `documents = None` when absent, and the `default` / `tool_use` choice
//!   among named templates.
//!
//! One known difference: the `~` operator formats booleans as `true`/`false` (jinja2:
//! `True`/`False`); no template we know of concatenates booleans with `~`.
//!
//! Typed messages are `frognano_protocol::Message`s; a tool call's `arguments` (a JSON object
//! serialised to a string, OpenAI form) is handed to the template as the mapping it encodes,
//! since templates such as Qwen3.5's iterate over it.
//!
//! **Templates without tool support.** Many small models' templates (SmolLM2's) ignore
//! `tools`: transformers renders the tools away without a word. [`ChatTemplate::render`]
//! finds this out once per template ([`ChatTemplate::supports_tools`]: a probe tool's name
//! must appear in the rendering) and then describes the tools itself, in the Hermes form
//! ([`frognano_protocol::codec::inline_tools`]): the schemas in `<tools></tools>` and the
//! instruction to answer with `<tool_call>` JSON, merged into the system message; earlier
//! calls and tool results are written into the turns as Hermes templates write them. Such a
//! model's replies are then read with the Hermes parser ([`ChatTemplate::tool_parser`]).
//! [`ChatTemplate::render_json`] stays exactly what transformers renders.
//!
//! ```no_run
//! use frognano_model::chat::ChatTemplate;
//! use frognano_protocol::Message;
//! let t = ChatTemplate::from_model_dir("models/qwen35-tokenizer").unwrap();
//! let prompt = t
//!     .render(&[Message::user("Hi")], None, true, None)
//!     .unwrap();
//! assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
//! ```

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::OnceLock;

use frognano_protocol::codec::{inline_tools, parse_arguments_object, ToolParser};
use frognano_protocol::Message;
use minijinja::value::{Kwargs, Rest, Value as JValue, ValueKind};
use minijinja::{Environment, Error as JError, ErrorKind, Output, State};
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

// ------------------------------------------------------------------------------------------
// Template
// ------------------------------------------------------------------------------------------

/// Names of the special tokens transformers passes to every template (its
/// `special_tokens_map`), read from tokenizer_config.json.
const SPECIAL_TOKEN_KEYS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// A compiled chat template (or several named ones) plus the special tokens it is rendered
/// with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names in the order given; a single template is named `default`.
    names: Vec<String>,
    /// The source of each template, in the order of `names`.
    sources: Vec<String>,
    origin: PathBuf,
    special_tokens: Map<String, Value>,
    /// Whether the template shows the model the tools it is given (probed once).
    supports_tools: OnceLock<bool>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("names", &self.names)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles one template source. `origin` (a file name) appears in errors; a syntax
    /// error is [`ModelError::Format`] with the line.
    pub fn new(source: &str, origin: impl AsRef<Path>) -> Result<Self> {
        Self::from_named(vec![("default".to_string(), source.to_string())], origin)
    }

    /// Compiles named templates (tokenizer_config.json's list form,
    /// `[{"name": "default", "template": …}, {"name": "tool_use", …}]`). Rendering uses
    /// `tool_use` when tools are given and it exists, else `default`, as transformers does.
    pub fn from_named(templates: Vec<(String, String)>, origin: impl AsRef<Path>) -> Result<Self> {
        let origin = origin.as_ref().to_path_buf();
        if templates.is_empty() {
            return Err(ModelError::format(&origin, "chat_template: empty list of templates"));
        }
        let mut env = new_environment();
        let mut names = Vec::with_capacity(templates.len());
        let mut sources = Vec::with_capacity(templates.len());
        for (name, source) in templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(&source)).map_err(|e| {
                ModelError::format(&origin, format!("chat template `{name}` does not compile: {}", describe(&e)))
            })?;
            names.push(name);
            sources.push(source);
        }
        Ok(Self { env, names, sources, origin, special_tokens: Map::new(), supports_tools: OnceLock::new() })
    }

    /// Loads a `.jinja` template file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::new(&source, path)
    }

    /// Loads the chat template of a model directory the way transformers does:
    /// `chat_template.jinja` (plus named ones in `additional_chat_templates/*.jinja`), else
    /// `chat_template.json`'s `chat_template`, else tokenizer_config.json's `chat_template`
    /// (a string or a list of `{name, template}`). Special tokens (`bos_token`, `eos_token`,
    /// `pad_token`, …) come from tokenizer_config.json when it exists.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() { Some(read_json(&config_path)?) } else { None };

        let jinja = dir.join("chat_template.jinja");
        let json_path = dir.join("chat_template.json");
        let mut template = if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?;
            let mut named = vec![("default".to_string(), source)];
            named.extend(additional_templates(&dir.join("additional_chat_templates"))?);
            Self::from_named(named, &jinja)?
        } else if json_path.is_file() {
            let value = read_json(&json_path)?;
            match value.get("chat_template") {
                Some(t) => Self::from_config_value(t, &json_path)?,
                None => {
                    return Err(ModelError::format(&json_path, "no `chat_template` field"));
                }
            }
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                Some(t) if !t.is_null() => Self::from_config_value(t, &config_path)?,
                _ => {
                    return Err(ModelError::format(
                        dir,
                        "no chat template: looked for chat_template.jinja, chat_template.json \
                         and `chat_template` in tokenizer_config.json",
                    ))
                }
            }
        };
        if let Some(config) = &config {
            template.special_tokens = special_tokens_of(config, &config_path)?;
        }
        Ok(template)
    }

    /// Compiles the value of a `chat_template` field: a string or a list of
    /// `{"name", "template"}` objects. `origin` is the file it came from.
    pub fn from_config_value(value: &Value, origin: impl AsRef<Path>) -> Result<Self> {
        let origin = origin.as_ref();
        match value {
            Value::String(s) => Self::new(s, origin),
            Value::Array(items) => {
                let mut named = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let name = item.get("name").and_then(Value::as_str);
                    let source = item.get("template").and_then(Value::as_str);
                    match (name, source) {
                        (Some(n), Some(s)) => named.push((n.to_string(), s.to_string())),
                        _ => {
                            return Err(ModelError::format(
                                origin,
                                format!("chat_template[{i}]: expected {{\"name\": …, \"template\": …}}"),
                            ))
                        }
                    }
                }
                Self::from_named(named, origin)
            }
            other => Err(ModelError::format(
                origin,
                format!("chat_template: expected a string or a list of named templates, got {other}"),
            )),
        }
    }

    /// Sets a special token passed to the template (`bos_token`, `eos_token`, …).
    pub fn with_special_token(mut self, name: &str, value: impl Into<String>) -> Self {
        self.special_tokens.insert(name.to_string(), Value::String(value.into()));
        self.supports_tools = OnceLock::new();
        self
    }

    /// The source of the template used when tools are given (`tool_use` if there is one,
    /// else `default`).
    pub fn tool_source(&self) -> &str {
        let name = self.pick(true).unwrap_or(&self.names[0]);
        let i = self.names.iter().position(|n| n == name).unwrap_or(0);
        &self.sources[i]
    }

    /// Whether the template shows the model the tools it is given: a conversation with one
    /// probe tool is rendered, and the probe's name must appear (llama.cpp decides the
    /// same way). A template that fails with tools but renders without them has none; one
    /// that fails either way is taken at its word. Probed once.
    pub fn supports_tools(&self) -> bool {
        *self.supports_tools.get_or_init(|| {
            const PROBE: &str = "frognano_probe_tool";
            let messages = [serde_json::json!({"role": "user", "content": "Which tools do you have?"})];
            let tool = serde_json::json!({"type": "function", "function": {"name": PROBE,
                "description": "A probe.", "parameters": {"type": "object", "properties": {}}}});
            match self.render_json(&messages, Some(&[tool]), true, None) {
                Ok(text) => text.contains(PROBE),
                Err(_) => self.render_json(&messages, None, true, None).is_err(),
            }
        })
    }

    /// The tool-call format the model answers in: the one its template writes
    /// ([`ToolParser::detect`]), or Hermes when FrogNano describes the tools itself
    /// (the template has no tool support).
    pub fn tool_parser(&self) -> ToolParser {
        if self.supports_tools() {
            ToolParser::detect(self.tool_source())
        } else {
            ToolParser::Hermes
        }
    }

    /// Whether [`render`](Self::render) describes the tools itself for this conversation:
    /// the template has no tool support and there are tools, calls or tool results to show.
    pub fn injects_tool_prompt(&self, messages: &[Message], tools: Option<&[Value]>) -> bool {
        let shows_tools =
            tools.is_some_and(|t| !t.is_empty()) || messages.iter().any(|m| m.role == "tool" || !m.calls().is_empty());
        shows_tools && !self.supports_tools()
    }

    /// The BOS token text from tokenizer_config.json, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.special_tokens.get("bos_token").and_then(Value::as_str)
    }

    /// The EOS token text from tokenizer_config.json, if any (`<|im_end|>` for Qwen3.5).
    pub fn eos_token(&self) -> Option<&str> {
        self.special_tokens.get("eos_token").and_then(Value::as_str)
    }

    /// The names of the compiled templates (`default` for a single one).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Where the template came from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Renders typed messages; see [`render_json`](Self::render_json). Each tool call's
    /// `arguments` string is given to the template as the JSON object it encodes; one that is
    /// not a JSON object is [`ModelError::Input`] naming the message and the tool. When the
    /// template has no tool support, the tools, calls and tool results are written into the
    /// messages in the Hermes form instead (see the module docs and
    /// [`injects_tool_prompt`](Self::injects_tool_prompt)).
    ///
    /// An assistant turn of tool calls without text (as OpenAI clients send it) reaches the
    /// template without `content`, as transformers hands it over; a template that cannot
    /// render that (Qwen3's concatenates `content`) gets `""` instead, as llama.cpp gives
    /// templates that need non-null content.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        kwargs: Option<&Map<String, Value>>,
    ) -> Result<String> {
        if self.injects_tool_prompt(messages, tools) {
            let inlined = inline_tools(messages, tools.unwrap_or_default())
                .map_err(|e| ModelError::Input(format!("{}: {e}", self.origin.display())))?;
            let values = inlined.iter().enumerate().map(|(i, m)| template_input(i, m)).collect::<Result<Vec<_>>>()?;
            return self.render_json(&values, None, add_generation_prompt, kwargs);
        }
        let mut values = messages.iter().enumerate().map(|(i, m)| template_input(i, m)).collect::<Result<Vec<_>>>()?;
        let first = self.render_json(&values, tools, add_generation_prompt, kwargs);
        let mut patched = false;
        for v in values.iter_mut() {
            if v.get("role").and_then(Value::as_str) == Some("assistant") && v.get("content").is_none_or(Value::is_null)
            {
                v["content"] = Value::String(String::new());
                patched = true;
            }
        }
        match first {
            Err(e) if patched => self.render_json(&values, tools, add_generation_prompt, kwargs).map_err(|_| e),
            other => other,
        }
    }

    /// Renders messages given as JSON objects, exactly as transformers'
    /// `tokenizer.apply_chat_template(messages, tools=tools,
    /// add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)` does.
    ///
    /// `tools` are OpenAI tool objects (`{"type": "function", "function": {…}}`); `kwargs`
    /// are extra template variables such as `{"enable_thinking": true}` (they override the
    /// special tokens of the same name). An error raised by the template
    /// (`raise_exception(…)`, e.g. "System message must be at the beginning.") or a bad
    /// message is [`ModelError::Input`] quoting the template's message and naming the
    /// template file.
    pub fn render_json(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        kwargs: Option<&Map<String, Value>>,
    ) -> Result<String> {
        let input = |msg: String| ModelError::Input(format!("{}: {msg}", self.origin.display()));
        if messages.is_empty() {
            return Err(input("cannot apply the chat template to an empty conversation".into()));
        }
        let mut prepared = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let Value::Object(obj) = m else {
                return Err(input(format!("message {i} is not a JSON object: {m}")));
            };
            prepared.push(Value::Object(prepare_message(obj)));
        }
        let name = self.pick(tools.is_some()).map_err(input)?;

        let mut ctx = self.special_tokens.clone();
        if let Some(kwargs) = kwargs {
            for (k, v) in kwargs {
                if matches!(k.as_str(), "messages" | "tools" | "documents" | "add_generation_prompt") {
                    return Err(input(format!("template variable `{k}` cannot be passed as an extra kwarg")));
                }
                ctx.insert(k.clone(), v.clone());
            }
        }
        ctx.insert("messages".into(), Value::Array(prepared));
        ctx.insert("tools".into(), tools.map_or(Value::Null, |t| Value::Array(t.to_vec())));
        ctx.insert("documents".into(), Value::Null);
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));

        let template = self.env.get_template(name).map_err(|e| input(describe(&e)))?;
        template
            .render(json_to_jinja(&Value::Object(ctx)))
            .map_err(|e| input(format!("chat template error: {}", describe(&e))))
    }

    fn pick(&self, with_tools: bool) -> std::result::Result<&str, String> {
        if self.names.len() == 1 {
            return Ok(&self.names[0]);
        }
        let has = |n: &str| self.names.iter().any(|x| x == n);
        if with_tools && has("tool_use") {
            Ok("tool_use")
        } else if has("default") {
            Ok("default")
        } else {
            Err(format!("several chat templates ({}) and none is named `default`", self.names.join(", ")))
        }
    }
}

/// Message `i` as the template reads it: its OpenAI JSON with each tool call's `arguments`
/// string replaced by the object it encodes (blank reads as `{}`).
fn template_input(i: usize, message: &Message) -> Result<Value> {
    let mut value = serde_json::to_value(message).map_err(|e| ModelError::Input(format!("message {i}: {e}")))?;
    if let Some(Value::Array(calls)) = value.get_mut("tool_calls") {
        for (call, typed) in calls.iter_mut().zip(message.calls()) {
            let arguments = parse_arguments_object(&typed.function.name, &typed.function.arguments)
                .map_err(|e| ModelError::Input(format!("message {i}: {e}")))?;
            call["function"]["arguments"] = Value::Object(arguments);
        }
    }
    Ok(value)
}

/// transformers' preparation of one message: drop `null` fields, then alias the reasoning
/// fields (`thinking` first, `reasoning_content` last, both set to the first non-null of
/// `reasoning_content`, `thinking`, `reasoning`).
fn prepare_message(obj: &Map<String, Value>) -> Map<String, Value> {
    let kept: Map<String, Value> =
        obj.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"].iter().find_map(|k| kept.get(*k).cloned());
    let Some(reasoning) = reasoning else { return kept };
    let mut out = Map::with_capacity(kept.len() + 2);
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in kept {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), reasoning);
    out
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::format(path, format!("not valid JSON: {e}")))
}

fn additional_templates(dir: &Path) -> Result<Vec<(String, String)>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))? {
        let path = entry.map_err(|e| ModelError::io(dir, e))?.path();
        if path.extension().and_then(|e| e.to_str()) == Some("jinja") {
            if let Some(name) = path.file_stem().and_then(|s| s.to_str()) {
                let source = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
                out.push((name.to_string(), source));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn special_tokens_of(config: &Value, path: &Path) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    for key in SPECIAL_TOKEN_KEYS {
        match config.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(key.into(), Value::String(s.clone()));
            }
            Some(Value::Object(o)) => match o.get("content").and_then(Value::as_str) {
                Some(s) => {
                    out.insert(key.into(), Value::String(s.to_string()));
                }
                None => {
                    return Err(ModelError::format(path, format!("`{key}` has no string `content`")));
                }
            },
            Some(other) => {
                return Err(ModelError::format(
                    path,
                    format!("`{key}` must be a string or an AddedToken object, got {other}"),
                ))
            }
        }
    }
    Ok(out)
}

/// A minijinja error with its line and every cause.
fn describe(e: &JError) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// transformers' `{% generation %}…{% endgeneration %}` marks assistant text for training
/// masks and renders its body unchanged; it becomes `{% if true %}…{% endif %}` here (same
/// whitespace control markers, so the output is identical).
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

// ------------------------------------------------------------------------------------------
// The jinja environment
// ------------------------------------------------------------------------------------------

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .expect("default delimiters are valid");
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_formatter(|out: &mut Output, _state: &mut State, value: &JValue| {
        let text = py_str(value);
        out.write_str(&text).map_err(|_| JError::new(ErrorKind::WriteFailure, "write failed"))
    });
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> std::result::Result<JValue, JError> {
        Err(JError::new(ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |format: String| -> String { strftime_now(&format) });
    env.add_filter("tojson", tojson_filter);
    env.add_filter("string", |v: JValue| -> String { py_str(&v) });
    env.add_filter("trim", |v: String, chars: Option<String>| -> String {
        match chars {
            Some(c) => v.trim_matches(|x| c.contains(x)).to_string(),
            None => v.trim_matches(py_is_space).to_string(),
        }
    });
    env.add_test("sequence", |v: JValue| {
        matches!(
            v.kind(),
            ValueKind::Undefined | ValueKind::Seq | ValueKind::String | ValueKind::Map | ValueKind::Bytes
        )
    });
    // Python's `iter(x)` fails on None: `tools is iterable and tools | length > 0` (Qwen3-Coder's
    // and Nemotron's templates) must be false for `tools=None`, as transformers passes it when
    // a request has no tools, not an error on `length`.
    env.add_test("iterable", |v: JValue| {
        matches!(
            v.kind(),
            ValueKind::Undefined
                | ValueKind::Seq
                | ValueKind::String
                | ValueKind::Map
                | ValueKind::Bytes
                | ValueKind::Iterable
        )
    });
    env
}

/// Python's `str.isspace` (Rust's whitespace plus the ASCII separators U+001C..U+001F).
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// serde_json value → template value (integers stay integers, floats floats, key order kept).
fn json_to_jinja(v: &Value) -> JValue {
    JValue::from(minijinja::value::Serde(v))
}

// --- Python str() / repr() -----------------------------------------------------------------

/// Python `str(value)`.
fn py_str(v: &JValue) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => {
            let mut s = String::new();
            py_repr(v, &mut s);
            s
        }
    }
}

/// Python `repr(value)` for JSON-like values.
fn py_repr(v: &JValue, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(v)),
        ValueKind::String => py_repr_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out);
                    out.push_str(": ");
                    py_repr(&v.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn py_number(v: &JValue) -> String {
    if v.is_integer() {
        return i128::try_from(v.clone()).map(|i| i.to_string()).unwrap_or_else(|_| v.to_string());
    }
    match f64::try_from(v.clone()) {
        Ok(f) => py_float_repr(f),
        Err(_) => v.to_string(),
    }
}

/// Python `repr(float)`: shortest round-trip digits, positional for exponents in -4..16,
/// else `d.ddde+XX`.
fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sci = format!("{f:e}"); // e.g. "-1.2345e-5", shortest round-trip digits
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() <= point {
                format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{sign}{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() { String::new() } else { format!(".{tail}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{frac}e{esign}{:02}", exp.abs())
    }
}

// --- tojson ----------------------------------------------------------------------------------

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` = Python `json.dumps` with those arguments.
fn tojson_filter(value: JValue, args: Rest<JValue>, kwargs: Kwargs) -> std::result::Result<JValue, JError> {
    let positional = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > positional.len() {
        return Err(JError::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let get = |name: &str| -> std::result::Result<Option<JValue>, JError> {
        let idx = positional.iter().position(|p| *p == name).unwrap_or(usize::MAX);
        if let Some(v) = args.get(idx) {
            return Ok(Some(v.clone()));
        }
        kwargs.get::<Option<JValue>>(name)
    };
    let ensure_ascii = get("ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = get("sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match get("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => return Err(JError::new(ErrorKind::InvalidOperation, "tojson: indent must be an int or str")),
        },
    };
    let (item_sep, key_sep) = match get("separators")? {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .filter(|p| p.len() == 2)
                .ok_or_else(|| JError::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))?;
            (parts[0].clone(), parts[1].clone())
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let opts = JsonOpts { ensure_ascii, sort_keys, indent, item_sep, key_sep };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    Ok(JValue::from(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

fn not_serializable(v: &JValue) -> JError {
    JError::new(ErrorKind::InvalidOperation, format!("tojson: object of kind {} is not JSON serializable", v.kind()))
}

fn write_json(v: &JValue, o: &JsonOpts, depth: usize, out: &mut String) -> std::result::Result<(), JError> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&py_number(v));
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&if f.is_nan() {
                    "NaN".to_string()
                } else if f.is_infinite() {
                    if f > 0.0 {
                        "Infinity".into()
                    } else {
                        "-Infinity".into()
                    }
                } else {
                    py_float_repr(f)
                });
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<JValue> = v.try_iter()?.collect();
            write_container(out, o, depth, '[', ']', items.len(), |i, out| write_json(&items[i], o, depth + 1, out))?;
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, JValue)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                let k = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                        let mut s = String::new();
                        write_json(&key, o, depth, &mut s)?;
                        s
                    }
                    _ => return Err(not_serializable(&key)),
                };
                pairs.push((k, item));
            }
            if o.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, o, depth, '{', '}', pairs.len(), |i, out| {
                write_json_str(&pairs[i].0, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                write_json(&pairs[i].1, o, depth + 1, out)
            })?;
        }
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    o: &JsonOpts,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> std::result::Result<(), JError>,
) -> std::result::Result<(), JError> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        item(i, out)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// A JSON string as Python's json.dumps writes it.
fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// --- strftime_now ----------------------------------------------------------------------------

/// Python `datetime.now().strftime(format)` for the common directives (UTC clock).
fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    strftime(secs, format)
}

fn strftime(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (h, mi, s) = (tod / 3600, (tod % 3600) / 60, tod % 60);
    // civil_from_days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.125, "123456789.125"),
            (1e22, "1e+22"),
            (0.1, "0.1"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strftime_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday
        assert_eq!(strftime(1_709_211_909, "%d %b %Y %H:%M:%S %A %j %%"), "29 Feb 2024 13:05:09 Thursday 060 %");
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
    }
}
