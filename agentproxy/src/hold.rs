//! Budgets that hold before the request (issue #43): a reply's cost is
//! known only once it is metered, so a cap checked after each reply let
//! one reply of any size through (a 200k-token reply cost $0.25 on a
//! $0.05 cap). Before a request is forwarded, the proxy now bounds its
//! reply by what is left:
//!
//! - what is left is the limit less what was metered and less what the
//!   requests in flight reserved;
//! - the request's prompt is estimated at the previous reply's prompt (an
//!   agent's requests grow a turn at a time; nothing for the first);
//! - the rest, at the model's output price (or as tokens, for a token
//!   limit), is the most output the reply may use: the request's own
//!   output cap (`max_tokens`, `max_completion_tokens`, `max_output_tokens`,
//!   `generationConfig.maxOutputTokens`) is lowered to it, or set where the
//!   request has none;
//! - nothing left: the request is refused and the proxy trips.
//!
//! What a reply can still cost past a cap is the difference between its
//! prompt and the estimate, never its output. A request that declares no
//! cap while more than [`MAX_INSERTED`] output tokens are left is forwarded
//! as it is (inserting a cap above a model's own maximum would make the API
//! refuse it), reserving [`MAX_INSERTED`].

use bytes::Bytes;
use serde_json::Value;

use crate::Limits;
use crate::meter::Price;

/// The largest output cap the proxy writes into a request that has none.
pub const MAX_INSERTED: u64 = 65_536;

/// The smallest thinking budget Anthropic's Messages API takes.
const MIN_THINKING: u64 = 1_024;

/// Where a request states its output cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CapField {
    /// Anthropic Messages: `max_tokens`.
    Anthropic,
    /// OpenAI Chat Completions: `max_completion_tokens` (or the older
    /// `max_tokens`).
    Chat,
    /// OpenAI Responses: `max_output_tokens`.
    Responses,
    /// Gemini: `generationConfig.maxOutputTokens`.
    Gemini,
}

fn cap_field(path: &str) -> Option<CapField> {
    if path.ends_with("/messages/count_tokens") {
        None
    } else if path.ends_with("/messages") {
        Some(CapField::Anthropic)
    } else if path.ends_with("/chat/completions") {
        Some(CapField::Chat)
    } else if path.ends_with("/responses") {
        Some(CapField::Responses)
    } else if path.contains(":generateContent") || path.contains(":streamGenerateContent") {
        Some(CapField::Gemini)
    } else {
        None
    }
}

fn declared(v: &Value, f: CapField) -> Option<u64> {
    match f {
        CapField::Anthropic => v.get("max_tokens"),
        CapField::Chat => v
            .get("max_completion_tokens")
            .or_else(|| v.get("max_tokens")),
        CapField::Responses => v.get("max_output_tokens"),
        CapField::Gemini => v.pointer("/generationConfig/maxOutputTokens"),
    }
    .and_then(Value::as_u64)
}

fn set_cap(v: &mut Value, f: CapField, n: u64) {
    let Some(o) = v.as_object_mut() else {
        return;
    };
    match f {
        CapField::Anthropic => {
            o.insert("max_tokens".into(), n.into());
        }
        CapField::Chat => {
            // The field the request used; a request with neither gets the
            // current one.
            let key = if o.contains_key("max_tokens") && !o.contains_key("max_completion_tokens") {
                "max_tokens"
            } else {
                "max_completion_tokens"
            };
            o.insert(key.into(), n.into());
        }
        CapField::Responses => {
            o.insert("max_output_tokens".into(), n.into());
        }
        CapField::Gemini => {
            let g = o
                .entry("generationConfig")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(g) = g.as_object_mut() {
                g.insert("maxOutputTokens".into(), n.into());
            }
        }
    }
}

/// What the attempt has used: metered replies plus what requests in flight
/// reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    pub usd: f64,
    pub tokens: u64,
}

/// The previous reply's prompt: its tokens (input and cache) and what they
/// cost.
pub type Prompt = Spent;

/// A request as it goes upstream, and what it reserves until its reply is
/// metered.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub body: Bytes,
    pub reserve: Spent,
    /// The output cap it declared (`None`: none) and the one it goes with,
    /// when the proxy changed it.
    pub clamped: Option<(Option<u64>, u64)>,
}

/// Bounds the reply of the request at `path` with `body` by what `limits`
/// leave after `spent`, its prompt estimated at `prompt` (see the module's
/// text). `Err`: nothing is left, in words.
pub fn hold(
    path: &str,
    body: Bytes,
    price: Option<Price>,
    limits: &Limits,
    spent: Spent,
    prompt: Prompt,
) -> Result<Held, String> {
    let unchanged = |body| Held {
        body,
        reserve: Spent::default(),
        clamped: None,
    };
    let Some(field) = cap_field(path) else {
        return Ok(unchanged(body));
    };
    if limits.usd.is_none() && limits.tokens.is_none() {
        return Ok(unchanged(body));
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
        return Ok(unchanged(body));
    };
    // `allowed` and the words that say which limit set it.
    let mut allowed: Option<(u64, String)> = None;
    if let (Some(max), Some(p)) = (limits.usd, price)
        && p.output > 0.0
    {
        let left = max - spent.usd - prompt.usd;
        let tokens = (left * 1_000_000.0 / p.output).floor();
        let words = format!(
            "{:.4} of {max} USD spent or held by requests in flight, and this request's prompt costs about {:.4}",
            spent.usd, prompt.usd
        );
        if tokens < 1.0 {
            return Err(format!("{words}: not one output token is left"));
        }
        allowed = Some((tokens as u64, words));
    }
    if let Some(max) = limits.tokens {
        let left = max
            .saturating_sub(spent.tokens)
            .saturating_sub(prompt.tokens);
        let words = format!(
            "{} of {max} tokens spent or held by requests in flight, and this request's prompt is about {} tokens",
            spent.tokens, prompt.tokens
        );
        if left == 0 {
            return Err(format!("{words}: not one output token is left"));
        }
        if allowed.as_ref().is_none_or(|(a, _)| left < *a) {
            allowed = Some((left, words));
        }
    }
    let Some((allowed, words)) = allowed else {
        // A USD limit on a model without a price: the proxy counts its
        // tokens as unpriced, and cannot bound it in USD.
        return Ok(unchanged(body));
    };
    let asked = declared(&v, field);
    let (cap, clamped) = match asked {
        Some(a) if a <= allowed => (a, None),
        None if allowed > MAX_INSERTED => (MAX_INSERTED, None),
        _ => (allowed, Some((asked, allowed))),
    };
    // Anthropic's extended thinking must fit below `max_tokens` (and take
    // 1,024 tokens at least): a lowered cap lowers its budget too, and one
    // too small for any thinking refuses the request.
    let thinking = v.pointer("/thinking/budget_tokens").and_then(Value::as_u64);
    if field == CapField::Anthropic
        && clamped.is_some()
        && let Some(t) = thinking
        && t >= cap
    {
        if cap <= MIN_THINKING {
            return Err(format!(
                "{words}: {cap} output tokens are left, too few for the request's extended thinking ({} at least)",
                MIN_THINKING + 1
            ));
        }
        if let Some(b) = v.pointer_mut("/thinking/budget_tokens") {
            *b = (cap - 1).into();
        }
    }
    let body = match clamped {
        Some(_) => {
            set_cap(&mut v, field, cap);
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        None => body,
    };
    let out_usd = price.map_or(0.0, |p| cap as f64 * p.output / 1_000_000.0);
    Ok(Held {
        body,
        reserve: Spent {
            usd: prompt.usd + out_usd,
            tokens: prompt.tokens + cap,
        },
        clamped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SONNET: Price = Price {
        input: 3.0,
        output: 15.0,
        cache_read: 0.3,
        cache_write: 3.75,
    };

    fn body(v: Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&v).unwrap())
    }

    fn cap_of(h: &Held, pointer: &str) -> Option<u64> {
        serde_json::from_slice::<Value>(&h.body)
            .unwrap()
            .pointer(pointer)
            .and_then(Value::as_u64)
    }

    #[test]
    fn a_reply_is_bounded_by_what_the_budget_has_left() {
        let limits = Limits {
            usd: Some(0.05),
            ..Limits::default()
        };
        // The 200k-token reply of issue #43: $3 of output asked, $0.05 left.
        let h = hold(
            "/v1/messages",
            body(json!({"model": "m", "max_tokens": 200_000})),
            Some(SONNET),
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!(h.clamped, Some((Some(200_000), 3333)));
        assert_eq!(cap_of(&h, "/max_tokens"), Some(3333));
        assert!((h.reserve.usd - 0.049995).abs() < 1e-9, "{:?}", h.reserve);
        // The prompt of the previous reply, and what requests in flight
        // hold, come off first.
        let h = hold(
            "/v1/messages",
            body(json!({"max_tokens": 200_000})),
            Some(SONNET),
            &limits,
            Spent {
                usd: 0.02,
                tokens: 0,
            },
            Prompt {
                usd: 0.015,
                tokens: 5000,
            },
        )
        .unwrap();
        assert_eq!(cap_of(&h, "/max_tokens"), Some(1000));
        // A cap within what is left goes unchanged, byte for byte.
        let b = body(json!({"max_tokens": 100}));
        let h = hold(
            "/v1/messages",
            b.clone(),
            Some(SONNET),
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!((h.body, h.clamped), (b, None));
        // Nothing left: refused, with the numbers.
        let e = hold(
            "/v1/messages",
            body(json!({"max_tokens": 100})),
            Some(SONNET),
            &limits,
            Spent {
                usd: 0.045,
                tokens: 0,
            },
            Prompt {
                usd: 0.006,
                tokens: 2000,
            },
        )
        .unwrap_err();
        assert!(
            e.contains("0.0450 of 0.05 USD") && e.contains("0.0060"),
            "{e}"
        );
    }

    /// A lowered `max_tokens` keeps Anthropic's extended thinking below
    /// it, or refuses a request with no room for any thinking.
    #[test]
    fn a_lowered_cap_lowers_the_thinking_budget_under_it() {
        let limits = Limits {
            tokens: Some(5000),
            ..Limits::default()
        };
        let req = |budget: u64| {
            body(
                json!({"max_tokens": 32_000, "thinking": {"type": "enabled", "budget_tokens": budget}}),
            )
        };
        let h = hold(
            "/v1/messages",
            req(16_000),
            None,
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!(cap_of(&h, "/max_tokens"), Some(5000));
        assert_eq!(cap_of(&h, "/thinking/budget_tokens"), Some(4999));
        // A budget already under the cap stays.
        let h = hold(
            "/v1/messages",
            req(2000),
            None,
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!(cap_of(&h, "/thinking/budget_tokens"), Some(2000));
        let e = hold(
            "/v1/messages",
            req(16_000),
            None,
            &limits,
            Spent {
                usd: 0.0,
                tokens: 4200,
            },
            Prompt::default(),
        )
        .unwrap_err();
        assert!(e.contains("800 output tokens are left"), "{e}");
    }

    #[test]
    fn each_api_s_own_field_is_set() {
        let limits = Limits {
            tokens: Some(1000),
            ..Limits::default()
        };
        for (path, v, pointer) in [
            ("/v1/chat/completions", json!({}), "/max_completion_tokens"),
            (
                "/v1/chat/completions",
                json!({"max_tokens": 5000}),
                "/max_tokens",
            ),
            ("/v1/responses", json!({}), "/max_output_tokens"),
            (
                "/v1beta/models/g:streamGenerateContent",
                json!({"generationConfig": {"temperature": 0}}),
                "/generationConfig/maxOutputTokens",
            ),
        ] {
            let h = hold(
                path,
                body(v),
                None,
                &limits,
                Spent {
                    usd: 0.0,
                    tokens: 300,
                },
                Prompt {
                    usd: 0.0,
                    tokens: 200,
                },
            )
            .unwrap();
            assert_eq!(cap_of(&h, pointer), Some(500), "{path}");
            assert_eq!(h.reserve.tokens, 700, "{path}");
        }
        // Not a generation: untouched.
        let b = body(json!({"max_tokens": 5000}));
        let h = hold(
            "/v1/messages/count_tokens",
            b.clone(),
            None,
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!(h.body, b);
    }

    #[test]
    fn no_cap_is_written_above_what_a_model_may_allow() {
        let limits = Limits {
            usd: Some(100.0),
            ..Limits::default()
        };
        let b = body(json!({"model": "gpt-5"}));
        let h = hold(
            "/v1/responses",
            b.clone(),
            Some(SONNET),
            &limits,
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!((h.body, h.clamped), (b, None));
        assert_eq!(h.reserve.tokens, MAX_INSERTED);
        // No limit at all: nothing changes or is held.
        let b = body(json!({"max_tokens": 1_000_000}));
        let h = hold(
            "/v1/messages",
            b.clone(),
            Some(SONNET),
            &Limits::default(),
            Spent::default(),
            Prompt::default(),
        )
        .unwrap();
        assert_eq!((h.body, h.reserve), (b, Spent::default()));
    }
}
