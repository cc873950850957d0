//! Chat messages and tool calls in OpenAI form — the one vocabulary the chat template, the
//! HTTP API, the agent loop and trajectories share.
//!
//! The serialised form is exactly the OpenAI (and `leaf-function-calling` trajectory) JSON:
//! `content` is a plain string (or a list of typed parts, or `null` for an assistant turn that
//! only calls tools); `reasoning_content`, `tool_calls`, `tool_call_id` and `name` are left out
//! when absent; a tool call's `arguments` is a JSON object *serialised to a string*.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// One chat message in OpenAI form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool` (templates may accept others).
    pub role: String,
    /// Text or typed parts; `None` (serialised as `null`, as trajectories store it) for an
    /// assistant turn that only calls tools.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The assistant's reasoning (the text inside `<think>…</think>`). Also read from the
    /// field name `reasoning`, which some servers use.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "reasoning")]
    pub reasoning_content: Option<String>,
    /// Tool calls made by an assistant turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a `tool` message: the tool's name (some clients send it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Message content: a plain string (serialised as a JSON string) or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts (`{"type": "text", "text": …}`, images, …).
    Parts(Vec<ContentPart>),
}

/// One part of a list-of-parts content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// The part type: `text`, `image`, `image_url`, `video`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Any other fields (`image_url`, `image`, …), kept in order for the template.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContentPart {
    /// A `{"type": "text", "text": …}` part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart { kind: "text".into(), text: Some(text.into()), extra: Map::new() }
    }
}

impl Message {
    /// A message with `role` and text `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::new("system", text)
    }
    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::new("user", text)
    }
    /// A plain-text assistant message.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::new("assistant", text)
    }
    /// A tool result answering the call `call_id`.
    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Message { tool_call_id: Some(call_id.into()), ..Self::new("tool", text) }
    }
    /// An assistant turn as a model reply is split: `content` `None` for a turn that only
    /// calls tools; empty reasoning and an empty call list are left out.
    pub fn assistant_reply(content: Option<String>, reasoning: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message {
            role: "assistant".into(),
            content: content.map(MessageContent::Text),
            reasoning_content: reasoning.filter(|r| !r.is_empty()),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
            tool_call_id: None,
            name: None,
        }
    }
    /// Sets the reasoning text.
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning_content = Some(reasoning.into());
        self
    }
    /// Appends a tool call `name` with object `arguments` and call id `id`.
    pub fn with_tool_call(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: Map<String, Value>,
    ) -> Self {
        let call = ToolCall { id: id.into(), ..ToolCall::new(name, Value::Object(arguments).to_string()) };
        self.tool_calls.get_or_insert_with(Vec::new).push(call);
        self
    }
    /// The tool calls (empty if none).
    pub fn calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or(&[])
    }
    /// The text of the content: the string, the `text` parts concatenated, or "" if null.
    pub fn text(&self) -> Cow<'_, str> {
        match &self.content {
            None => Cow::Borrowed(""),
            Some(MessageContent::Text(s)) => Cow::Borrowed(s),
            Some(MessageContent::Parts(p)) => Cow::Owned(p.iter().filter_map(|p| p.text.as_deref()).collect()),
        }
    }

    /// The content as the text a text-only model reads, refusing what it cannot read: the
    /// string itself, the `text` parts joined with nothing between them (as Qwen's templates
    /// join them), or "" for `null` / no content. A part of any other type (an image, audio,
    /// a file) is [`ContentError::NotText`], except in a `tool` message, where it reads as
    /// [`NOT_READ_PART`]: a client cannot take back what its tool returned, and an agent's
    /// session must go on after a tool returns a picture.
    pub fn text_content(&self) -> Result<Cow<'_, str>, ContentError> {
        let parts = match &self.content {
            None => return Ok(Cow::Borrowed("")),
            Some(MessageContent::Text(s)) => return Ok(Cow::Borrowed(s)),
            Some(MessageContent::Parts(parts)) => parts,
        };
        let mut text = String::new();
        for (index, part) in parts.iter().enumerate() {
            match (part.kind.as_str(), &part.text) {
                ("text", Some(t)) => text.push_str(t),
                ("text", None) => return Err(ContentError::MissingText { index }),
                (_, _) if self.role == "tool" => text.push_str(NOT_READ_PART),
                (kind, _) => return Err(ContentError::NotText { index, kind: kind.to_string() }),
            }
        }
        Ok(Cow::Owned(text))
    }

    /// This message with its content as a plain string ([`Message::text_content`]), the form
    /// every chat template can render: templates without list-of-parts support concatenate
    /// `message['content']` as a string and fail on a list or on a missing content (what
    /// clients send back for an assistant turn that only called tools). For templates that
    /// do handle both (Qwen's), the rendering is the same bytes.
    pub fn with_text_content(&self) -> Result<Message, ContentError> {
        let text = self.text_content()?.into_owned();
        Ok(Message { content: Some(MessageContent::Text(text)), ..self.clone() })
    }
}

/// What a part of a tool message that is not text reads as ([`Message::text_content`]).
pub const NOT_READ_PART: &str = "[a part this model cannot read: it reads text only]";

/// Why a message's content cannot be read as text ([`Message::text_content`]). Indices
/// count the content's parts from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentError {
    /// A part that is not text.
    #[error("content[{index}] is a part of type {kind:?}; this model reads text only (parts of type \"text\")")]
    NotText {
        /// The part's position.
        index: usize,
        /// Its `type`.
        kind: String,
    },
    /// A `text` part without its `text`.
    #[error("content[{index}] is a \"text\" part without a `text` string")]
    MissingText {
        /// The part's position.
        index: usize,
    },
}

/// `messages` with every content as a plain string ([`Message::with_text_content`]), as the
/// server and the in-process model both hand them to the chat template. The error carries
/// the index of the first message that cannot be read as text.
pub fn text_only_messages(messages: &[Message]) -> Result<Vec<Message>, (usize, ContentError)> {
    messages.iter().enumerate().map(|(i, m)| m.with_text_content().map_err(|e| (i, e))).collect()
}

/// One tool call in OpenAI form (`{"id", "type": "function", "function": {"name", "arguments"}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id; the answering `tool` message refers to it. Empty (and left out when
    /// serialised) if a client sent none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// Name and JSON-string arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

/// The function part of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Tool name.
    pub name: String,
    /// Arguments as a JSON object serialised to a string (OpenAI convention). Arguments sent
    /// as an object (some clients do) are kept as that object's JSON text; `null` reads as
    /// `{}`. Whether the text is an object is checked where it is used
    /// ([`crate::codec::parse_arguments_object`]).
    #[serde(deserialize_with = "arguments_text")]
    pub arguments: String,
}

fn arguments_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Null => "{}".to_string(),
        other => other.to_string(),
    })
}

impl ToolCall {
    /// A call with a fresh id ([`new_call_id`]).
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: new_call_id(),
            kind: function_kind(),
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
        }
    }
}

/// A fresh OpenAI-style call id (`call_` + 24 hex digits).
///
/// Ids only need to be unique within a conversation, so std's randomly keyed hasher, fed a
/// process-wide counter and the clock, stands in for a random number generator.
pub fn new_call_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let keys = std::collections::hash_map::RandomState::new();
    let mut high = keys.build_hasher();
    high.write_u64(count);
    high.write_u128(nanos);
    let high = high.finish();
    let mut low = keys.build_hasher();
    low.write_u64(high);
    low.write_u64(count);
    format!("call_{high:016x}{:08x}", low.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_text_stays_a_string_and_a_tool_only_turn_keeps_null_content() {
        let call = ToolCall { id: "call_1".into(), ..ToolCall::new("Bash", r#"{"command":"ls"}"#) };
        let turn = Message::assistant_reply(None, Some("think".into()), vec![call]);
        assert_eq!(
            serde_json::to_value(&turn).unwrap(),
            json!({"role": "assistant", "content": null, "reasoning_content": "think", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]})
        );
        let result = Message::tool("call_1", "a.py");
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"role":"tool","content":"a.py","tool_call_id":"call_1"}"#
        );
        // Trajectory JSON reads back to the same value.
        let back: Message = serde_json::from_value(serde_json::to_value(&turn).unwrap()).unwrap();
        assert_eq!(back, turn);
        assert!(Message::assistant_reply(Some("x".into()), Some(String::new()), vec![]).reasoning_content.is_none());
    }

    #[test]
    fn arguments_sent_as_an_object_are_kept_as_their_json_text() {
        let m: Message = serde_json::from_value(json!({"role": "assistant", "tool_calls": [
            {"function": {"name": "Bash", "arguments": {"command": "ls", "n": 2}}},
            {"id": "c2", "function": {"name": "Glob", "arguments": null}}]}))
        .unwrap();
        assert_eq!(m.calls()[0].function.arguments, r#"{"command":"ls","n":2}"#);
        assert_eq!(m.calls()[0].id, "");
        assert_eq!(m.calls()[0].kind, "function");
        assert_eq!(m.calls()[1].function.arguments, "{}");
        // A call without an id is written without one.
        assert!(serde_json::to_value(&m.calls()[0]).unwrap().get("id").is_none());
    }

    #[test]
    fn list_of_parts_content_round_trips() {
        let m: Message = serde_json::from_value(json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "b"}]}))
        .unwrap();
        assert!(matches!(m.content, Some(MessageContent::Parts(ref p)) if p.len() == 3));
        assert_eq!(m.text(), "ab");
        let back = serde_json::to_value(&m).unwrap();
        assert_eq!(back["content"][1], json!({"type": "image_url", "image_url": {"url": "u"}}));
        assert_eq!(Message::user("hi").text(), "hi");
    }

    #[test]
    fn text_content_joins_text_parts_and_refuses_other_parts_by_type() {
        let parts: Message = serde_json::from_value(json!({"role": "tool", "tool_call_id": "c", "content": [
            {"type": "text", "text": "a.py\n"}, {"type": "text", "text": "b.py"}]}))
        .unwrap();
        let plain = parts.with_text_content().unwrap();
        assert_eq!(plain.content, Some(MessageContent::Text("a.py\nb.py".into())));
        assert_eq!(plain.tool_call_id.as_deref(), Some("c"));
        // A tool-only assistant turn as clients send it back: null content, or none at all.
        for turn in [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "Bash", "arguments": "{}"}}]}),
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "Bash", "arguments": "{}"}}]}),
        ] {
            let m: Message = serde_json::from_value(turn).unwrap();
            let plain = m.with_text_content().unwrap();
            assert_eq!(plain.content, Some(MessageContent::Text(String::new())));
            assert_eq!(plain.calls(), m.calls());
        }
        let image: Message = serde_json::from_value(json!({"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]}))
        .unwrap();
        let err = image.text_content().unwrap_err();
        assert_eq!(err, ContentError::NotText { index: 1, kind: "image_url".into() });
        assert_eq!(
            err.to_string(),
            "content[1] is a part of type \"image_url\"; this model reads text only (parts of type \"text\")"
        );
        let empty_part: Message =
            serde_json::from_value(json!({"role": "user", "content": [{"type": "text"}]})).unwrap();
        assert_eq!(empty_part.text_content().unwrap_err(), ContentError::MissingText { index: 0 });
        let picture: Message = serde_json::from_value(json!({"role": "tool", "tool_call_id": "c", "content": [
            {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "a.png"}]}))
        .unwrap();
        assert_eq!(picture.text_content().unwrap(), format!("{NOT_READ_PART}a.png"), "a tool's picture is a note");
        let err = text_only_messages(&[Message::user("ok"), image]).unwrap_err();
        assert_eq!(err.0, 1);
        assert_eq!(text_only_messages(&[Message::user("hi")]).unwrap(), vec![Message::user("hi")]);
    }

    #[test]
    fn builders_and_the_reasoning_alias() {
        let mut args = Map::new();
        args.insert("command".into(), json!("ls"));
        let m = Message::assistant("").with_reasoning("r").with_tool_call("c1", "Bash", args);
        assert_eq!(m.calls()[0].id, "c1");
        assert_eq!(m.calls()[0].function.arguments, r#"{"command":"ls"}"#);
        let m: Message =
            serde_json::from_value(json!({"role": "assistant", "content": "x", "reasoning": "r"})).unwrap();
        assert_eq!(m.reasoning_content.as_deref(), Some("r"));
    }

    #[test]
    fn call_ids_are_fresh_and_openai_shaped() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_call_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids.iter().take(5) {
            let hex = id.strip_prefix("call_").unwrap();
            assert_eq!(hex.len(), 24, "{id}");
            assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
    }
}
