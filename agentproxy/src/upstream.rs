//! The upstream model API: its address, and one HTTP/1.1 connection to it
//! per request (plain on loopback and in tests, TLS checked against
//! Mozilla's roots otherwise). An agent makes a request every few seconds;
//! a pool would save a handshake per turn and add state to get wrong.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::ProxyError;

/// `http[s]://host[:port][/base]`, as a `*_BASE_URL` variable gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path every request's path starts with, without a trailing `/`
    /// (`/v1` for OpenAI's API, empty for Anthropic's).
    pub base_path: String,
}

impl Upstream {
    pub fn parse(url: &str) -> Result<Self, ProxyError> {
        if url.contains('@') {
            // Not echoed: what precedes the @ may be a password.
            return Err(ProxyError::Upstream(
                "a base URL with credentials in it is not supported".into(),
            ));
        }
        let bad = |why: &str| ProxyError::Upstream(format!("{url}: {why}"));
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("not an http:// or https:// URL"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
            ),
            _ => (authority, if tls { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if path.contains('?') || path.contains('#') {
            return Err(bad("a base URL takes no query or fragment"));
        }
        Ok(Self {
            tls,
            host: host.trim_start_matches('[').trim_end_matches(']').into(),
            port,
            base_path: path.trim_end_matches('/').into(),
        })
    }

    /// `scheme://host:port` plus the base path, for messages.
    pub fn url(&self) -> String {
        format!(
            "{}://{}:{}{}",
            if self.tls { "https" } else { "http" },
            self.host,
            self.port,
            self.base_path
        )
    }

    /// The `Host` header's value.
    pub fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Sends `req` on a fresh connection and returns the response head
    /// with its body still to be read.
    pub async fn send(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>, String> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.url()))?;
        let _ = tcp.set_nodelay(true);
        if self.tls {
            let name = rustls::pki_types::ServerName::try_from(self.host.clone())
                .map_err(|e| format!("{}: {e}", self.host))?;
            let tls = tokio_rustls::TlsConnector::from(tls_config())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {}: {e}", self.url()))?;
            send_on(TokioIo::new(tls), req).await
        } else {
            send_on(TokioIo::new(tcp), req).await
        }
    }
}

async fn send_on<T>(
    io: TokioIo<T>,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    // The connection runs until the response body is read or dropped.
    fvd_telemetry::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_parse_with_their_defaults() {
        let u = Upstream::parse("https://api.openai.com/v1/").unwrap();
        assert_eq!(
            u,
            Upstream {
                tls: true,
                host: "api.openai.com".into(),
                port: 443,
                base_path: "/v1".into()
            }
        );
        assert_eq!(u.authority(), "api.openai.com");
        let u = Upstream::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.port, u.base_path.as_str()), (8080, ""));
        assert_eq!(u.authority(), "127.0.0.1:8080");
        for bad in [
            "api.anthropic.com",
            "https://user:pw@host",
            "http://:80",
            "http://h:x",
            "http://h/v1?key=1",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }
}
