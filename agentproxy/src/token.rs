//! An attempt's token, as the proxy and the attempt's tools check it.
//!
//! A token is made fresh for an attempt (`fvd-` and 48 hex digits from the
//! kernel's random source) and handed to its agent. What fvd keeps of it
//! is its SHA-256 digest: requests are checked against the digest, so a
//! proxy (or tools) started again for the same attempt after a restart of
//! the orchestrator — whose agent still holds the token — admits that
//! agent without the token's value ever being written anywhere.
//!
//! Invariant: no `Debug` output and no stored form holds the value; the
//! digest is what goes to the database.

use sha2::{Digest, Sha256};

/// An attempt's token: its value while this process made it, its digest
/// always.
#[derive(Clone)]
pub struct AttemptToken {
    value: Option<String>,
    digest: [u8; 32],
}

impl std::fmt::Debug for AttemptToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptToken")
            .field("known", &self.value.is_some())
            .finish_non_exhaustive()
    }
}

impl AttemptToken {
    /// A new token from the kernel's random source.
    pub fn fresh() -> std::io::Result<Self> {
        use std::io::Read;
        let mut b = [0u8; 24];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        let value = format!("fvd-{}", hex(&b));
        Ok(Self {
            digest: Sha256::digest(value.as_bytes()).into(),
            value: Some(value),
        })
    }

    /// The token whose digest is `digest` (64 hex digits, as
    /// [`AttemptToken::digest_hex`] wrote it): it checks requests, and has
    /// no value to hand out. `None` when `digest` is not one.
    pub fn from_digest_hex(digest: &str) -> Option<Self> {
        if digest.len() != 64 {
            return None;
        }
        let mut d = [0u8; 32];
        for (i, pair) in digest.as_bytes().chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            d[i] = u8::from_str_radix(s, 16).ok()?;
        }
        Some(Self {
            value: None,
            digest: d,
        })
    }

    /// The value, to hand to the agent: `None` for a token known by its
    /// digest only (its agent already holds it).
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// The digest in 64 lowercase hex digits: what may be stored.
    pub fn digest_hex(&self) -> String {
        hex(&self.digest)
    }

    /// Whether `given` is this token (in constant time over the digests).
    pub fn admits(&self, given: &[u8]) -> bool {
        let d: [u8; 32] = Sha256::digest(given).into();
        d.iter()
            .zip(&self.digest)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_known_by_its_digest_admits_the_same_value_and_nothing_else() {
        let t = AttemptToken::fresh().unwrap();
        let v = t.value().unwrap().to_string();
        assert!(v.starts_with("fvd-") && v.len() == 52, "{v}");
        let again = AttemptToken::from_digest_hex(&t.digest_hex()).unwrap();
        assert_eq!(again.value(), None);
        assert!(again.admits(v.as_bytes()));
        assert!(t.admits(v.as_bytes()));
        assert!(!again.admits(b"fvd-0000"));
        assert!(!again.admits(&v.as_bytes()[..51]));
        assert!(!format!("{again:?}{t:?}").contains(&v));
        assert!(!t.digest_hex().contains(&v[4..]));
        for bad in ["", "zz", &"g".repeat(64), &"a".repeat(63)] {
            assert!(AttemptToken::from_digest_hex(bad).is_none(), "{bad}");
        }
    }
}
