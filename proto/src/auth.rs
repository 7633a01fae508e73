//! Bearer-token authentication for both services: clients (workers and the
//! CLI) attach `authorization: Bearer <token>`; the server looks the token
//! up in its [`Credentials`] and refuses a call without a known one with
//! `UNAUTHENTICATED`, and one whose role may not make it with
//! `PERMISSION_DENIED` (a worker's token reading ports, a viewer's
//! connecting as a worker). The caller's [`Principal`] rides in the
//! request's extensions to the handler, which checks what the call changes.
//!
//! A client's token is read from a file or from an environment variable
//! whose *name* the operator gives; its value is never printed: `Debug`
//! shows only whether a token is set.

use std::path::{Path, PathBuf};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub use crate::credentials::{Credentials, Principal, Refusal};

/// Where a token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    /// The name of an environment variable holding the token.
    Env(String),
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The cause is in the message, not chained as a source: an `{:#}`
    /// of the error would say it twice.
    #[error("cannot read token file {path}: {cause}")]
    File {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("token environment variable {0} is not set")]
    EnvUnset(String),
    #[error("token from {0} is empty")]
    Empty(String),
    #[error("token from {0} holds characters a gRPC header cannot carry")]
    NotAscii(String),
    #[error("cannot read random bytes for a token: {0}")]
    Random(std::io::Error),
}

/// A token, kept out of every `Debug` and log line.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Reads the token; surrounding whitespace (a trailing newline in a
    /// file) is not part of it.
    pub fn load(source: &TokenSource) -> Result<Self, AuthError> {
        let (raw, from) = match source {
            TokenSource::File(p) => (read_file(p)?, p.display().to_string()),
            TokenSource::Env(name) => (
                std::env::var(name).map_err(|_| AuthError::EnvUnset(name.clone()))?,
                format!("${name}"),
            ),
        };
        let t = raw.trim().to_string();
        if t.is_empty() {
            return Err(AuthError::Empty(from));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthError::NotAscii(from));
        }
        Ok(Token(t))
    }

    /// A fresh random token (embedded mode: orchestrator and worker share it
    /// in memory, so nothing else on the host can drive the loopback port).
    ///
    /// # Panics
    /// When the kernel gives no random bytes: a predictable token would be
    /// worse than none.
    pub fn random() -> Self {
        let bytes = random_bytes().expect("/dev/urandom gives random bytes");
        Token(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A token for a named credential (`fvd auth add`): `fvd_` and 256
    /// random bits in hex; the prefix lets secret scanners know it.
    pub fn generate() -> Result<Self, AuthError> {
        let bytes = random_bytes().map_err(AuthError::Random)?;
        Ok(Token(format!(
            "fvd_{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )))
    }

    /// Writes the token into a new file that only its owner may read
    /// (mode 0600 from its creation on), replacing an older one: how
    /// embedded mode lets `fvd cancel` reach the process running a port.
    pub fn write_private(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(self.0.as_bytes())
    }

    /// The value, for a redactor that keeps it out of what fvd stores and
    /// shows (`fvd_contracts::redactor`), for hashing it
    /// (`credentials::KeyHash`), and for the one print of a new credential
    /// (`fvd auth add`); never for a log line.
    pub fn value(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this token, compared in constant time (the
    /// dashboard's answer form; gRPC calls go through [`ServerAuth`]).
    pub fn verify(&self, candidate: &str) -> bool {
        constant_time_eq(candidate.trim().as_bytes(), self.0.as_bytes())
    }

    fn header(&self) -> MetadataValue<Ascii> {
        format!("Bearer {}", self.0)
            .parse()
            .expect("a token of graphic ascii makes a valid header")
    }
}

fn random_bytes() -> std::io::Result<[u8; 32]> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn read_file(p: &Path) -> Result<String, AuthError> {
    std::fs::read_to_string(p).map_err(|cause| AuthError::File {
        path: p.to_path_buf(),
        cause,
    })
}

/// Client side: adds the header when a token is configured.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    token: Option<Token>,
}

impl ClientAuth {
    pub fn new(token: Option<Token>) -> Self {
        Self { token }
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.header());
        }
        Ok(req)
    }
}

/// What a service asks of every call's credential before its handler
/// runs; handlers check more (what a call changes, whose port it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `WorkerService`: a `worker` (or `admin`) credential.
    Connect,
    /// `PortService`: any credential that reads (`viewer`, `porter`,
    /// `admin`).
    Read,
}

/// Server side: every call must carry a token the credentials know, of a
/// role that may make it; the caller's [`Principal`] goes into the
/// request's extensions. A server without credentials lets every call
/// through as [`Principal::anonymous`].
#[derive(Debug, Clone)]
pub struct ServerAuth {
    credentials: Credentials,
    need: Need,
}

impl ServerAuth {
    pub fn new(credentials: Credentials, need: Need) -> Self {
        Self { credentials, need }
    }
}

/// The refusal a caller sees when its credential is missing or unknown.
pub fn unauthenticated(r: &Refusal) -> Status {
    match r {
        Refusal::Missing => Status::unauthenticated(
            "no token: this orchestrator needs a credential (--token-file or --token-env)",
        ),
        Refusal::Unknown => {
            Status::unauthenticated("token not known to this orchestrator (wrong, or revoked)")
        }
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let header = req.metadata().get("authorization").map(|v| v.as_bytes());
        let who = self
            .credentials
            .resolve_header(header)
            .map_err(|r| unauthenticated(&r))?;
        let (ok, what, needs) = match self.need {
            Need::Connect => (
                who.role().connects(),
                "connect as a worker",
                "a worker or admin credential",
            ),
            Need::Read => (
                who.role().reads(),
                "use the port service",
                "a viewer, porter or admin credential",
            ),
        };
        if !ok {
            return Err(Status::permission_denied(format!(
                "credential {} may not {what}: that needs {needs}",
                who.describe()
            )));
        }
        req.extensions_mut().insert(who);
        Ok(req)
    }
}

/// Compares without an early exit, so response timing does not reveal how
/// much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_refuses_missing_and_wrong_tokens() {
        let token = Token("s3cret-value".into());
        let mut server = ServerAuth::new(Credentials::single(Some(&token)), Need::Read);
        assert_eq!(
            server.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let wrong = ClientAuth::new(Some(Token("s3cret-valuE".into())))
            .call(Request::new(()))
            .unwrap();
        assert!(server.call(wrong).is_err());
        let right = ClientAuth::new(Some(token)).call(Request::new(())).unwrap();
        let passed = server.call(right).unwrap();
        let who = passed.extensions().get::<Principal>().unwrap();
        assert_eq!(
            (who.name(), who.role()),
            ("", crate::credentials::Role::Admin)
        );
    }

    #[test]
    fn a_role_that_may_not_make_the_call_is_denied_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        use crate::credentials::{Role, add};
        let worker = add(&path, "fleet", Role::Worker).unwrap();
        let viewer = add(&path, "vera", Role::Viewer).unwrap();
        let creds = Credentials::load(Some(&path), None).unwrap();
        let call = |need: Need, t: &Token| {
            let req = ClientAuth::new(Some(t.clone()))
                .call(Request::new(()))
                .unwrap();
            ServerAuth::new(creds.clone(), need).call(req)
        };
        let e = call(Need::Read, &worker).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            e.message(),
            "credential fleet (worker) may not use the port service: that needs a viewer, porter or admin credential"
        );
        assert!(!e.message().contains(worker.value()));
        let e = call(Need::Connect, &viewer).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(call(Need::Connect, &worker).is_ok());
        assert!(call(Need::Read, &viewer).is_ok());
    }

    #[test]
    fn verify_accepts_only_the_token_itself() {
        let t = Token("s3cret-value".into());
        assert!(t.verify("s3cret-value"));
        assert!(t.verify("s3cret-value\n"));
        assert!(!t.verify("s3cret-valuE"));
        assert!(!t.verify("s3cret"));
        assert!(!t.verify(""));
    }

    #[test]
    fn no_token_configured_means_open() {
        let passed = ServerAuth::new(Credentials::open(), Need::Connect)
            .call(Request::new(()))
            .unwrap();
        assert_eq!(
            passed.extensions().get::<Principal>(),
            Some(&Principal::anonymous())
        );
    }

    #[test]
    fn debug_never_shows_the_value() {
        let t = Token("s3cret-value".into());
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(!format!("{:?}", ClientAuth::new(Some(t))).contains("s3cret"));
    }

    #[test]
    fn loads_from_file_and_env_and_names_the_source_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tok");
        std::fs::write(&p, "abc123\n").unwrap();
        assert_eq!(
            Token::load(&TokenSource::File(p)).unwrap(),
            Token("abc123".into())
        );
        let err = Token::load(&TokenSource::Env("FVD_TEST_SURELY_UNSET_VAR".into())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token environment variable FVD_TEST_SURELY_UNSET_VAR is not set"
        );
        assert_eq!(Token::random().0.len(), 64);
        assert_ne!(Token::random(), Token::random());
        let g = Token::generate().unwrap();
        assert!(g.0.starts_with("fvd_") && g.0.len() == 68, "{}", g.0.len());
    }
}
