//! Usage read from model-API responses, and what it costs.
//!
//! Each of the four protocols reports its tokens in its own fields; a
//! streamed reply reports them in its events, cumulatively (Anthropic's
//! `message_start` then `message_delta`, OpenAI's last chunk or
//! `response.completed`, Gemini's `usageMetadata` on each chunk). A
//! [`Reading`] keeps the largest figure seen of each field, which is the
//! total whatever order the events come in. Tokens are normalised to
//! Anthropic's split: `input` excludes tokens read from a cache.

use std::collections::BTreeMap;

use serde_json::Value;

/// Tokens of one reply or of many, normalised across protocols.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input tokens not read from a cache.
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Tokens {
    pub fn total(&self) -> u64 {
        self.input + self.output + self.cache_read + self.cache_write
    }

    pub fn add(&mut self, o: &Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
    }
}

/// USD per million tokens of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_write: f64,
}

impl Price {
    /// What `t` costs at this price, in USD.
    pub fn cost(&self, t: &Tokens) -> f64 {
        (t.input as f64 * self.input
            + t.output as f64 * self.output
            + t.cache_read as f64 * self.cache_read
            + t.cache_write as f64 * self.cache_write)
            / 1_000_000.0
    }
}

/// Prices by model id. A model is found by its exact id, else by the
/// longest id in the table its own starts with (`claude-sonnet-4-5` prices
/// `claude-sonnet-4-5-20250929`), else at the fallback price (the attempt's
/// configured model), so an unexpected side model is never free.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    pub models: BTreeMap<String, Price>,
    pub fallback: Option<Price>,
}

impl PriceTable {
    pub fn price(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.models.get(model) {
            return Some(*p);
        }
        self.models
            .iter()
            .filter(|(id, _)| model.starts_with(id.as_str()))
            .max_by_key(|(id, _)| id.len())
            .map(|(_, p)| *p)
            .or(self.fallback)
    }
}

/// The usage figures one reply's JSON values gave so far.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Input as the protocol counts it (OpenAI and Gemini include cached
    /// tokens in it; Anthropic does not).
    prompt: u64,
    prompt_includes_cache: bool,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    /// Gemini's thinking tokens, billed as output.
    thoughts: u64,
    /// The model the reply names, if it names one.
    pub model: Option<String>,
    /// Whether any value carried usage.
    pub seen: bool,
}

fn n(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Reading {
    /// Takes the usage of one JSON value of a reply: a whole response, or
    /// one event of a stream.
    pub fn take(&mut self, v: &Value) {
        if let Some(m) = v.get("model").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_string());
        }
        if let Some(m) = v.get("modelVersion").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_string());
        }
        match v.get("type").and_then(Value::as_str) {
            // Anthropic's stream: the message's usage first, then deltas.
            Some("message_start") => {
                if let Some(m) = v.get("message") {
                    self.take(m);
                }
                return;
            }
            // OpenAI Responses' stream: the response in its last event.
            Some(
                "response.completed"
                | "response.incomplete"
                | "response.failed"
                | "response.created"
                | "response.in_progress",
            ) => {
                if let Some(r) = v.get("response") {
                    self.take(r);
                }
                return;
            }
            _ => {}
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.seen = true;
            if u.get("prompt_tokens").is_some() {
                // OpenAI Chat Completions.
                self.prompt_includes_cache = true;
                self.prompt = self.prompt.max(n(u, "prompt_tokens"));
                self.output = self.output.max(n(u, "completion_tokens"));
                if let Some(d) = u.get("prompt_tokens_details") {
                    self.cache_read = self.cache_read.max(n(d, "cached_tokens"));
                }
            } else if u.get("input_tokens_details").is_some() || v.get("object").is_some() {
                // OpenAI Responses.
                self.prompt_includes_cache = true;
                self.prompt = self.prompt.max(n(u, "input_tokens"));
                self.output = self.output.max(n(u, "output_tokens"));
                if let Some(d) = u.get("input_tokens_details") {
                    self.cache_read = self.cache_read.max(n(d, "cached_tokens"));
                }
            } else {
                // Anthropic Messages.
                self.prompt = self.prompt.max(n(u, "input_tokens"));
                self.output = self.output.max(n(u, "output_tokens"));
                self.cache_read = self.cache_read.max(n(u, "cache_read_input_tokens"));
                self.cache_write = self.cache_write.max(n(u, "cache_creation_input_tokens"));
            }
        }
        if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
            // Gemini.
            self.seen = true;
            self.prompt_includes_cache = true;
            self.prompt = self.prompt.max(n(u, "promptTokenCount"));
            self.output = self.output.max(n(u, "candidatesTokenCount"));
            self.cache_read = self.cache_read.max(n(u, "cachedContentTokenCount"));
            self.thoughts = self.thoughts.max(n(u, "thoughtsTokenCount"));
        }
    }

    /// The reply's tokens, normalised.
    pub fn tokens(&self) -> Tokens {
        let input = if self.prompt_includes_cache {
            self.prompt.saturating_sub(self.cache_read)
        } else {
            self.prompt
        };
        Tokens {
            input,
            output: self.output + self.thoughts,
            cache_read: self.cache_read,
            cache_write: self.cache_write,
        }
    }
}

/// Server-sent events cut into their `data` payloads as bytes arrive.
#[derive(Debug, Default)]
pub struct SseReader {
    buf: Vec<u8>,
}

/// An event larger than this is not metered (its bytes still pass).
const MAX_EVENT: usize = 4 << 20;

impl SseReader {
    /// Feeds bytes; calls `f` with the JSON of every complete event.
    pub fn feed(&mut self, bytes: &[u8], mut f: impl FnMut(&Value)) {
        self.buf.extend_from_slice(bytes);
        while let Some(end) = event_end(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end.1).take(end.0).collect();
            data_of(&event, &mut f);
        }
        if self.buf.len() > MAX_EVENT {
            self.buf.clear();
        }
    }

    /// The last event, when the stream ended without a blank line.
    pub fn finish(&mut self, f: impl FnMut(&Value)) {
        let event = std::mem::take(&mut self.buf);
        data_of(&event, f);
    }
}

/// Where the first event ends: (its length, its length with the blank line).
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some((i, i + 2));
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, i + 3));
            }
        }
        i += 1;
    }
    None
}

fn data_of(event: &[u8], mut f: impl FnMut(&Value)) {
    let text = String::from_utf8_lossy(event);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d).trim_end_matches('\r'))
        .collect();
    if data.is_empty() {
        return;
    }
    let joined = data.join("\n");
    if let Ok(v) = serde_json::from_str::<Value>(&joined) {
        f(&v);
    }
}

/// Reads a whole (not streamed) reply body: one JSON value, or a JSON
/// array of chunks (Gemini's stream without `alt=sse`).
pub fn read_body(body: &[u8], r: &mut Reading) {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => items.iter().for_each(|v| r.take(v)),
        Ok(v) => r.take(&v),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_stream_usage_is_the_start_plus_the_last_delta() {
        let mut r = Reading::default();
        let mut sse = SseReader::default();
        let stream = concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"model":"claude-sonnet-4-5","usage":{"input_tokens":1000,"output_tokens":1,"cache_read_input_tokens":200,"cache_creation_input_tokens":10}}}"#,
            "\n\nevent: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
            "\r\n\r\nevent: message_delta\n",
            r#"data: {"type":"message_delta","delta":{},"usage":{"output_tokens":50}}"#,
            "\n\n"
        );
        // Fed in awkward pieces: events cross chunk boundaries.
        for chunk in stream.as_bytes().chunks(7) {
            sse.feed(chunk, |v| r.take(v));
        }
        sse.finish(|v| r.take(v));
        assert_eq!(
            r.tokens(),
            Tokens {
                input: 1000,
                output: 50,
                cache_read: 200,
                cache_write: 10
            }
        );
        assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5"));
    }

    #[test]
    fn openai_and_gemini_cached_tokens_are_taken_out_of_the_input() {
        let mut chat = Reading::default();
        chat.take(
            &json!({"object": "chat.completion.chunk", "choices": [], "usage": {
            "prompt_tokens": 1200, "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 200}}}),
        );
        let mut resp = Reading::default();
        resp.take(
            &json!({"type": "response.completed", "response": {"object": "response",
            "model": "gpt-5", "usage": {"input_tokens": 1200, "output_tokens": 50,
            "input_tokens_details": {"cached_tokens": 200}}}}),
        );
        let mut gem = Reading::default();
        read_body(
            serde_json::to_vec(&json!([{"usageMetadata": {"promptTokenCount": 1200,
                "candidatesTokenCount": 40, "thoughtsTokenCount": 10,
                "cachedContentTokenCount": 200}}]))
            .unwrap()
            .as_slice(),
            &mut gem,
        );
        let want = Tokens {
            input: 1000,
            output: 50,
            cache_read: 200,
            cache_write: 0,
        };
        assert_eq!(chat.tokens(), want);
        assert_eq!(resp.tokens(), want);
        assert_eq!(gem.tokens(), want);
        assert_eq!(resp.model.as_deref(), Some("gpt-5"));
    }

    #[test]
    fn prices_match_by_longest_prefix_then_fall_back() {
        let p = |x: f64| Price {
            input: x,
            output: x * 5.0,
            cache_read: x / 10.0,
            cache_write: x * 1.25,
        };
        let table = PriceTable {
            models: [
                ("claude-sonnet-4".to_string(), p(1.0)),
                ("claude-sonnet-4-5".to_string(), p(3.0)),
            ]
            .into(),
            fallback: Some(p(15.0)),
        };
        assert_eq!(table.price("claude-sonnet-4-5-20250929"), Some(p(3.0)));
        assert_eq!(table.price("claude-sonnet-4-0"), Some(p(1.0)));
        assert_eq!(table.price("claude-haiku-4-5"), Some(p(15.0)));
        let cost = p(3.0).cost(&Tokens {
            input: 1_000_000,
            output: 100_000,
            cache_read: 1_000_000,
            cache_write: 0,
        });
        assert!((cost - (3.0 + 1.5 + 0.3)).abs() < 1e-9, "{cost}");
    }
}
