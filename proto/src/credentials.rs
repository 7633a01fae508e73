//! Named credentials with roles (`fvd orchestrator serve --auth FILE`).
//!
//! A credentials file is TOML, one `[[token]]` table per person or worker
//! fleet:
//!
//! ```toml
//! [[token]]
//! name = "alice"
//! role = "porter"
//! sha256 = "<64 hex digits: SHA-256 of the token>"
//! ```
//!
//! The file holds no token, only the SHA-256 of each: `fvd auth add` makes a
//! token from 32 random bytes, prints it once and appends its hash. A fast
//! hash is enough because every token is 256 random bits: no dictionary or
//! brute force reaches one, so a slow password hash (argon2, bcrypt) would
//! only cost time on every call. A hash a person computed of a guessable
//! token would be as weak as that token; the file's tokens come from `fvd
//! auth add`.
//!
//! Roles ([`Role`]): `worker` may only dial `WorkerService.Connect`;
//! `viewer` may read (status, watch, logs, traces, attempts, the dashboard);
//! `porter` may also submit, answer, cancel and reset the ports it
//! submitted; `admin` may do all of it on every port, and run a worker (so
//! the single `--token-file` token of earlier versions keeps working as
//! one `admin` credential named `admin`).
//!
//! [`Credentials`] is the live set a server checks calls against; it is
//! reloaded from its files on demand (SIGHUP in `fvd orchestrator serve`),
//! and a reload that fails keeps the previous set. No token value is ever
//! kept, printed or logged: entries hold hashes, and [`Principal`]'s
//! `Debug` shows its name and role only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::auth::{Token, TokenSource};

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Dial `WorkerService.Connect`, nothing else.
    Worker,
    /// Read every port and the fleet; change nothing.
    Viewer,
    /// Read, and submit, answer, cancel and reset its own ports.
    Porter,
    /// Everything, on every port; also run a worker.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Worker, Role::Viewer, Role::Porter, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Viewer => "viewer",
            Role::Porter => "porter",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// May dial `WorkerService.Connect`.
    pub fn connects(self) -> bool {
        matches!(self, Role::Worker | Role::Admin)
    }

    /// May read ports, runs and the fleet.
    pub fn reads(self) -> bool {
        matches!(self, Role::Viewer | Role::Porter | Role::Admin)
    }

    /// May submit, answer, cancel and reset (its own ports unless admin).
    pub fn changes(self) -> bool {
        matches!(self, Role::Porter | Role::Admin)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The SHA-256 of a token: what the file and the live set hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHash([u8; 32]);

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(..)")
    }
}

impl KeyHash {
    /// The hash of `token` (surrounding whitespace is not part of it).
    pub fn of(token: &str) -> Self {
        KeyHash(Sha256::digest(token.trim().as_bytes()).into())
    }

    /// Lowercase hex, as the file writes it.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn parse_hex(s: &str) -> Option<Self> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(KeyHash(out))
    }

    /// Compared without an early exit.
    fn matches(&self, other: &KeyHash) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

/// Who made a call: the credential's name and role. The name is what the
/// store, the ledger, `PORT_STATUS.md` and spans record.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal {
    name: String,
    role: Role,
    /// The credential it came from; `None` on a server without
    /// credentials (anyone may call it).
    key: Option<KeyHash>,
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principal")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish()
    }
}

impl Principal {
    /// The caller of a server that checks no credential: allowed
    /// everything, named nobody.
    pub fn anonymous() -> Self {
        Principal {
            name: String::new(),
            role: Role::Admin,
            key: None,
        }
    }

    /// The credential's name; empty on a server without credentials.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// `alice (porter)`, or `anonymous` when the server checks no
    /// credential: how refusals name the caller.
    pub fn describe(&self) -> String {
        if self.name.is_empty() {
            "anonymous".to_string()
        } else {
            format!("{} ({})", self.name, self.role)
        }
    }
}

/// Why a credentials file was refused, with where.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read credentials file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{col}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("cannot write credentials file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} has no credential named {name}")]
    UnknownName { path: PathBuf, name: String },
    /// The file and the single token would share a name or a token, so
    /// the audit trail could not tell them apart (issue #38).
    #[error(
        "{path}: {what} ({single}), and the audit trail could not tell them apart: revoke that credential (fvd auth revoke) or drop the single token"
    )]
    Clash {
        path: PathBuf,
        what: &'static str,
        single: String,
    },
    #[error(transparent)]
    Token(#[from] crate::auth::AuthError),
}

/// One credential of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub role: Role,
    pub hash: KeyHash,
}

/// A credential's name: 1 to 32 of ASCII letters, digits, `.`, `_`, `-`,
/// `@`, starting with a letter or digit. It is written into tables
/// (`PORT_STATUS.md`), spans and logs, so it holds nothing that could
/// break out of them, and it is too short to be a token pasted in the
/// wrong place.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    token: Vec<toml::Spanned<EntryToml>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    name: toml::Spanned<String>,
    role: toml::Spanned<String>,
    sha256: toml::Spanned<String>,
}

/// 1-based line and column of byte `at` in `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Parses a credentials file's text; errors name `path`, line and column.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Entry>, CredentialsError> {
    let invalid = |at: usize, message: String| {
        let (line, col) = line_col(text, at);
        CredentialsError::Invalid {
            path: path.to_path_buf(),
            line,
            col,
            message,
        }
    };
    let file: FileToml = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        invalid(at, without_long_words(e.message().trim()))
    })?;
    let mut out: Vec<Entry> = Vec::with_capacity(file.token.len());
    for t in file.token {
        let t = t.into_inner();
        let name = t.name.get_ref();
        if !valid_name(name) {
            return Err(invalid(
                t.name.span().start,
                "name must be 1 to 32 ascii letters, digits, '.', '_', '-' or '@', starting with a letter or digit".into(),
            ));
        }
        if out.iter().any(|e| e.name == *name) {
            return Err(invalid(
                t.name.span().start,
                format!("a second credential named {name}"),
            ));
        }
        let role = Role::parse(t.role.get_ref()).ok_or_else(|| {
            invalid(
                t.role.span().start,
                format!(
                    "role must be one of worker, viewer, porter, admin (not {:?})",
                    fvd_cut(t.role.get_ref())
                ),
            )
        })?;
        // Never echo the value: it may be a token pasted by mistake.
        let hash = KeyHash::parse_hex(&t.sha256.get_ref().to_ascii_lowercase()).ok_or_else(|| {
            invalid(
                t.sha256.span().start,
                "sha256 must be the 64 hex digits of the token's SHA-256 (fvd auth add writes it), never the token".into(),
            )
        })?;
        if let Some(other) = out.iter().find(|e| e.hash.matches(&hash)) {
            return Err(invalid(
                t.sha256.span().start,
                format!(
                    "{name} has the same token as {}: each credential needs its own",
                    other.name
                ),
            ));
        }
        out.push(Entry {
            name: name.clone(),
            role,
            hash,
        });
    }
    Ok(out)
}

/// A role word cut for an error message (and no token in it).
fn fvd_cut(s: &str) -> String {
    without_long_words(&s.chars().take(24).collect::<String>())
}

/// The longest run of word characters an error may repeat from the file:
/// a token pasted where a key or a role goes is longer, and is cut out.
pub const MAX_ECHOED_WORD: usize = 32;

/// `message` with every run of more than [`MAX_ECHOED_WORD`] letters,
/// digits, `_` or `-` replaced by `…`: the parser's messages quote keys,
/// and a key may be a token pasted in the wrong place.
pub fn without_long_words(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.chars().count() > MAX_ECHOED_WORD {
            out.push('…');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in message.chars() {
        if c.is_alphanumeric() || c == '_' || c == '-' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// How a file starts when `fvd auth add` creates it.
const HEADER: &str = "# fvd credentials (fvd orchestrator serve --auth THIS): one [[token]] per person or fleet.\n# Only SHA-256 hashes of the tokens are kept here. Add one with `fvd auth add NAME --role ROLE --file THIS`;\n# revoke one by deleting its table (or `fvd auth remove NAME --file THIS`), then send the server SIGHUP.\n";

fn entry_text(e: &Entry) -> String {
    format!(
        "\n[[token]]\nname = \"{}\"\nrole = \"{}\"\nsha256 = \"{}\"\n",
        e.name,
        e.role,
        e.hash.hex()
    )
}

/// Reads `path`'s entries; a missing file has none.
fn read_existing(path: &Path) -> Result<(String, Vec<Entry>), CredentialsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let entries = parse(path, &text)?;
            Ok((text, entries))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((HEADER.to_string(), Vec::new())),
        Err(source) => Err(CredentialsError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces `path` with `text` through a temporary file in its folder
/// (owner-only permissions), so a server reloading it never reads half.
fn write_atomically(path: &Path, text: &str) -> Result<(), CredentialsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CredentialsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Adds a credential named `name` with `role` to `path` (created when
/// missing) and returns its token: the only time the token exists outside
/// the caller's hands. Refuses a name already there.
pub fn add(path: &Path, name: &str, role: Role) -> Result<Token, CredentialsError> {
    let (mut text, entries) = read_existing(path)?;
    let invalid = |message: String| CredentialsError::Invalid {
        path: path.to_path_buf(),
        line: 1,
        col: 1,
        message,
    };
    if !valid_name(name) {
        return Err(invalid(format!(
            "{:?} is no credential name: 1 to 32 ascii letters, digits, '.', '_', '-' or '@', starting with a letter or digit",
            without_long_words(name)
        )));
    }
    if entries.iter().any(|e| e.name == name) {
        return Err(invalid(format!(
            "a credential named {name} exists already: fvd auth remove {name} first to replace it"
        )));
    }
    let token = Token::generate()?;
    let entry = Entry {
        name: name.to_string(),
        role,
        hash: KeyHash::of(token.value()),
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&entry_text(&entry));
    // What is written must read back as it was meant.
    parse(path, &text)?;
    write_atomically(path, &text)?;
    Ok(token)
}

/// Removes the credential `name` from `path`. The file is written anew
/// from its entries (comments other than the header are not kept).
pub fn remove(path: &Path, name: &str) -> Result<Entry, CredentialsError> {
    let (_, entries) = read_existing(path)?;
    let Some(gone) = entries.iter().find(|e| e.name == name).cloned() else {
        return Err(CredentialsError::UnknownName {
            path: path.to_path_buf(),
            name: name.to_string(),
        });
    };
    let mut text = HEADER.to_string();
    for e in entries.iter().filter(|e| e.name != name) {
        text.push_str(&entry_text(e));
    }
    write_atomically(path, &text)?;
    Ok(gone)
}

/// The entries of `path`, for `fvd auth list`.
pub fn list(path: &Path) -> Result<Vec<Entry>, CredentialsError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// The credentials a server checks calls against, shared by its services
/// and reloaded in place. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// `None`: a server without credentials, where every call is allowed.
    live: Option<Arc<Live>>,
}

#[derive(Debug)]
struct Live {
    /// The named credentials' file (`--auth`).
    file: Option<PathBuf>,
    /// The single token of `--token-file`/`--token-env`: an admin named
    /// `admin`.
    single: Option<TokenSource>,
    table: RwLock<Arc<Vec<Entry>>>,
    /// Bumped on every reload: streams that outlive a call see revocations.
    generation: tokio::sync::watch::Sender<u64>,
}

/// The name the single `--token-file` token is recorded under.
pub const SINGLE_TOKEN_NAME: &str = "admin";

/// Why a call's credential was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` header, or not `Bearer`.
    Missing,
    /// No credential has this token (never was, or revoked).
    Unknown,
}

impl Credentials {
    /// A server that checks nothing: every call is [`Principal::anonymous`].
    pub fn open() -> Self {
        Credentials { live: None }
    }

    /// A server with one in-memory token, an admin with no name (embedded
    /// mode: one process of one person, whose records name nobody), or
    /// none. `fvd orchestrator serve --token-file` goes through
    /// [`Credentials::load`] instead, which names its token `admin`.
    pub fn single(token: Option<&Token>) -> Self {
        match token {
            None => Self::open(),
            Some(t) => {
                let table = vec![Entry {
                    name: String::new(),
                    role: Role::Admin,
                    hash: KeyHash::of(t.value()),
                }];
                Credentials {
                    live: Some(Arc::new(Live {
                        file: None,
                        single: None,
                        table: RwLock::new(Arc::new(table)),
                        generation: tokio::sync::watch::channel(0).0,
                    })),
                }
            }
        }
    }

    /// Loads the named credentials of `file` and the single token of
    /// `single` (an admin named `admin`), either or both; neither is an
    /// open server.
    pub fn load(
        file: Option<&Path>,
        single: Option<&TokenSource>,
    ) -> Result<Self, CredentialsError> {
        if file.is_none() && single.is_none() {
            return Ok(Self::open());
        }
        let table = read_all(file, single)?;
        Ok(Credentials {
            live: Some(Arc::new(Live {
                file: file.map(Path::to_path_buf),
                single: single.cloned(),
                table: RwLock::new(Arc::new(table)),
                generation: tokio::sync::watch::channel(0).0,
            })),
        })
    }

    /// Whether every call is allowed (no credential configured).
    pub fn is_open(&self) -> bool {
        self.live.is_none()
    }

    /// Reads the files again and, when they are valid, replaces the set:
    /// a revoked token is refused from the next call on, and streams held
    /// by it end ([`Credentials::revoked`]). A file that does not read or
    /// parse keeps the previous set. Returns how many credentials hold.
    pub fn reload(&self) -> Result<usize, CredentialsError> {
        let Some(live) = &self.live else {
            return Ok(0);
        };
        if live.file.is_none() && live.single.is_none() {
            return Ok(self.len());
        }
        let table = read_all(live.file.as_deref(), live.single.as_ref())?;
        let n = table.len();
        *live.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        live.generation.send_modify(|g| *g += 1);
        Ok(n)
    }

    /// How many credentials the set holds.
    pub fn len(&self) -> usize {
        self.live.as_ref().map_or(0, |l| self.table_of(l).len())
    }

    /// Whether the set holds none (an open server, or an empty file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn table_of(&self, live: &Live) -> Arc<Vec<Entry>> {
        live.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Who holds `token`.
    pub fn resolve(&self, token: &str) -> Result<Principal, Refusal> {
        let Some(live) = &self.live else {
            return Ok(Principal::anonymous());
        };
        let hash = KeyHash::of(token);
        // Every entry is looked at, so the time does not say which matched.
        let mut found = None;
        for e in self.table_of(live).iter() {
            if e.hash.matches(&hash) && found.is_none() {
                found = Some(Principal {
                    name: e.name.clone(),
                    role: e.role,
                    key: Some(e.hash),
                });
            }
        }
        found.ok_or(Refusal::Unknown)
    }

    /// Who sent `authorization` (its raw header value).
    pub fn resolve_header(&self, header: Option<&[u8]>) -> Result<Principal, Refusal> {
        if self.live.is_none() {
            return Ok(Principal::anonymous());
        }
        let token = header
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .filter(|t| !t.trim().is_empty())
            .ok_or(Refusal::Missing)?;
        self.resolve(token)
    }

    /// Whether `who` still holds: its credential is in the set with the
    /// same name and role.
    pub fn holds(&self, who: &Principal) -> bool {
        let (Some(live), Some(key)) = (&self.live, &who.key) else {
            return true;
        };
        self.table_of(live)
            .iter()
            .any(|e| e.hash.matches(key) && e.name == who.name && e.role == who.role)
    }

    /// Resolves once `who`'s credential is gone from the set (after a
    /// reload); never on a server without credentials. Streams that
    /// outlive their call (a worker's, a watch) end on it.
    pub async fn revoked(&self, who: &Principal) {
        let Some(live) = &self.live else {
            return std::future::pending().await;
        };
        let mut rx = live.generation.subscribe();
        loop {
            if !self.holds(who) {
                return;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

fn read_all(
    file: Option<&Path>,
    single: Option<&TokenSource>,
) -> Result<Vec<Entry>, CredentialsError> {
    let mut table = match file {
        Some(p) => list(p)?,
        None => Vec::new(),
    };
    if let Some(source) = single {
        let t = Token::load(source)?;
        let hash = KeyHash::of(t.value());
        let clash = |what| CredentialsError::Clash {
            path: file.map(Path::to_path_buf).unwrap_or_default(),
            what,
            single: match source {
                TokenSource::File(p) => format!("--token-file {}", p.display()),
                TokenSource::Env(name) => format!("--token-env {name}"),
            },
        };
        if table.iter().any(|e| e.name == SINGLE_TOKEN_NAME) {
            return Err(clash(
                "a credential is named `admin`, the name of the single token",
            ));
        }
        if table.iter().any(|e| e.hash == hash) {
            return Err(clash("a credential has the single token's own token"));
        }
        table.push(Entry {
            name: SINGLE_TOKEN_NAME.into(),
            role: Role::Admin,
            hash: KeyHash::of(t.value()),
        });
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(entries: &[(&str, Role)]) -> (tempfile::TempDir, PathBuf, Vec<Token>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        let tokens = entries
            .iter()
            .map(|(n, r)| add(&path, n, *r).unwrap())
            .collect();
        (dir, path, tokens)
    }

    #[test]
    fn add_writes_hashes_only_and_each_token_resolves_to_its_name_and_role() {
        let (_d, path, tokens) = file_with(&[
            ("alice", Role::Porter),
            ("ci-fleet", Role::Worker),
            ("bob", Role::Viewer),
        ]);
        let text = std::fs::read_to_string(&path).unwrap();
        for t in &tokens {
            assert!(!text.contains(t.value()), "a token reached the file");
            assert!(text.contains(&KeyHash::of(t.value()).hex()));
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let creds = Credentials::load(Some(&path), None).unwrap();
        assert_eq!(creds.len(), 3);
        let alice = creds.resolve(tokens[0].value()).unwrap();
        assert_eq!((alice.name(), alice.role()), ("alice", Role::Porter));
        let fleet = creds.resolve(tokens[1].value()).unwrap();
        assert_eq!((fleet.name(), fleet.role()), ("ci-fleet", Role::Worker));
        assert_eq!(creds.resolve("not-a-token"), Err(Refusal::Unknown));
        assert_eq!(creds.resolve_header(None), Err(Refusal::Missing));
        let header = format!("Bearer {}", tokens[2].value());
        assert_eq!(
            creds
                .resolve_header(Some(header.as_bytes()))
                .unwrap()
                .name(),
            "bob"
        );
    }

    #[test]
    fn a_name_is_added_once() {
        let (_d, path, _) = file_with(&[("alice", Role::Porter)]);
        let err = add(&path, "alice", Role::Admin).unwrap_err().to_string();
        assert!(err.contains("exists already"), "{err}");
        let err = add(&path, "al|ice", Role::Admin).unwrap_err().to_string();
        assert!(err.contains("no credential name"), "{err}");
    }

    #[test]
    fn errors_name_the_file_line_and_column_and_never_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        let secret = "fvd_0123456789abcdef0123456789abcdef";
        let text = format!("[[token]]\nname = \"a\"\nrole = \"porter\"\nsha256 = \"{secret}\"\n");
        let err = parse(&path, &text).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}:4:10: ", path.display())),
            "{err}"
        );
        assert!(!err.contains(secret), "{err}");

        let text = format!(
            "[[token]]\nname = \"a\"\nrole = \"boss\"\nsha256 = \"{}\"\n",
            KeyHash::of("x").hex()
        );
        let err = parse(&path, &text).unwrap_err().to_string();
        assert!(err.contains(":3:8: role must be one of"), "{err}");

        let h = KeyHash::of("x").hex();
        let text = format!(
            "[[token]]\nname = \"a\"\nrole = \"viewer\"\nsha256 = \"{h}\"\n[[token]]\nname = \"b\"\nrole = \"viewer\"\nsha256 = \"{h}\"\n"
        );
        let err = parse(&path, &text).unwrap_err().to_string();
        assert!(err.contains(":8:10: b has the same token as a"), "{err}");

        let err = parse(
            &path,
            "[[token]]\nname = \"a\"\nrole = \"viewer\"\nsha = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with(&format!("{}:", path.display())), "{err}");
        // A token pasted as a key is not repeated.
        let err = parse(&path, &format!("[[token]]\n{secret} = 1\n"))
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains(secret) && !err.contains("0123456789abcdef"),
            "{err}"
        );
    }

    #[test]
    fn a_reload_revokes_and_a_broken_file_keeps_the_previous_set() {
        let (_d, path, tokens) = file_with(&[("alice", Role::Porter), ("bob", Role::Viewer)]);
        let creds = Credentials::load(Some(&path), None).unwrap();
        let bob = creds.resolve(tokens[1].value()).unwrap();
        assert!(creds.holds(&bob));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let waiter = {
            let (c, b) = (creds.clone(), bob.clone());
            rt.spawn(async move { c.revoked(&b).await })
        };
        remove(&path, "bob").unwrap();
        std::fs::write(&path, "[[token]\n").unwrap();
        let err = creds.reload().unwrap_err().to_string();
        assert!(err.contains("auth.toml:1:"), "{err}");
        assert!(creds.resolve(tokens[1].value()).is_ok(), "kept on error");
        // Now the file without bob.
        let _ = std::fs::remove_file(&path);
        let keep = add(&path, "alice2", Role::Porter).unwrap();
        assert_eq!(creds.reload().unwrap(), 1);
        assert_eq!(creds.resolve(tokens[1].value()), Err(Refusal::Unknown));
        assert_eq!(creds.resolve(keep.value()).unwrap().name(), "alice2");
        assert!(!creds.holds(&bob));
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("revoked() returns after the reload")
                .unwrap()
        });
    }

    #[test]
    fn the_single_token_is_an_admin_named_admin_beside_the_file() {
        let (d, path, tokens) = file_with(&[("alice", Role::Porter)]);
        let single = d.path().join("token");
        std::fs::write(&single, "the-old-shared-token\n").unwrap();
        let creds =
            Credentials::load(Some(&path), Some(&TokenSource::File(single.clone()))).unwrap();
        let admin = creds.resolve("the-old-shared-token").unwrap();
        assert_eq!((admin.name(), admin.role()), ("admin", Role::Admin));
        assert_eq!(creds.resolve(tokens[0].value()).unwrap().name(), "alice");
        let only = Credentials::load(None, Some(&TokenSource::File(single))).unwrap();
        assert_eq!(only.len(), 1);
        let open = Credentials::open();
        assert_eq!(open.resolve("anything").unwrap(), Principal::anonymous());
    }

    /// Issue #38: a porter named `admin` in the file would own every port
    /// of the single token's admin, and the audit trail could not tell
    /// them apart; the same token in both would be two names for one key.
    #[test]
    fn the_file_and_the_single_token_share_no_name_and_no_token() {
        let (_d, path, tokens) = file_with(&[("admin", Role::Porter), ("bob", Role::Viewer)]);
        let single_dir = tempfile::tempdir().unwrap();
        let single = single_dir.path().join("token");
        std::fs::write(&single, "a-different-token-of-at-least-some-length\n").unwrap();
        let e = Credentials::load(Some(&path), Some(&TokenSource::File(single.clone())))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("named `admin`") && e.contains(&path.display().to_string()),
            "{e}"
        );
        assert!(e.contains("--token-file"), "{e}");
        // Without the clash of names, the same token is refused too.
        let (_d2, path2, tokens2) = file_with(&[("bob", Role::Viewer)]);
        std::fs::write(&single, format!("{}\n", tokens2[0].value())).unwrap();
        let e = Credentials::load(Some(&path2), Some(&TokenSource::File(single.clone())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("the single token's own token"), "{e}");
        // Apart, each loads.
        assert!(Credentials::load(Some(&path), None).is_ok());
        std::fs::write(&single, "a-different-token-of-at-least-some-length\n").unwrap();
        assert!(Credentials::load(Some(&path2), Some(&TokenSource::File(single))).is_ok());
        drop(tokens);
    }

    #[test]
    fn roles_allow_what_their_doc_says() {
        assert!(Role::Worker.connects() && !Role::Worker.reads() && !Role::Worker.changes());
        assert!(!Role::Viewer.connects() && Role::Viewer.reads() && !Role::Viewer.changes());
        assert!(!Role::Porter.connects() && Role::Porter.reads() && Role::Porter.changes());
        assert!(Role::Admin.connects() && Role::Admin.reads() && Role::Admin.changes());
    }

    #[test]
    fn debug_shows_no_hash() {
        let p = Principal {
            name: "alice".into(),
            role: Role::Porter,
            key: Some(KeyHash::of("t")),
        };
        let d = format!("{p:?}");
        assert!(
            d.contains("alice") && !d.contains(&KeyHash::of("t").hex()),
            "{d}"
        );
    }
}
