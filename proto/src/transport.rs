//! How clients (workers and the CLI) reach the orchestrator: a plain
//! `http://` endpoint, or `https://` verified against the CA certificate the
//! operator names (no system roots: fvd's servers use their own CA).

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("orchestrator address {url} is invalid: {message}")]
    BadUrl { url: String, message: String },
    #[error(
        "orchestrator address {url} is https: pass the CA certificate that signed it (--tls-ca)"
    )]
    HttpsNeedsCa { url: String },
    #[error(
        "orchestrator address {url} is plain http but a CA certificate was given; use https://"
    )]
    CaWithoutHttps { url: String },
    #[error("tls settings for {url} refused: {message}")]
    Tls { url: String, message: String },
}

/// How often each side of a gRPC connection pings the other (HTTP/2
/// PING), and how long it waits for the answer before it drops the
/// connection.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
/// The TCP keepalive idle time of fvd's gRPC sockets, both sides.
pub const TCP_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);

/// The endpoint for `url`; with `https://`, `tls_ca` (PEM) must be given.
pub fn endpoint(url: &str, tls_ca: Option<&[u8]>) -> Result<Endpoint, EndpointError> {
    let ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| EndpointError::BadUrl {
            url: url.to_string(),
            message: e.to_string(),
        })?
        // A stalled link (a NAT or a switch that dropped it silently) ends
        // within a minute instead of never, so a worker registers again
        // (issue #38): HTTP/2 pings while idle too, and TCP keepalive.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(TCP_KEEPALIVE));
    let https = url.starts_with("https://");
    match (https, tls_ca) {
        (false, None) => Ok(ep),
        (true, None) => Err(EndpointError::HttpsNeedsCa {
            url: url.to_string(),
        }),
        (false, Some(_)) => Err(EndpointError::CaWithoutHttps {
            url: url.to_string(),
        }),
        (true, Some(ca)) => ep
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
            .map_err(|e| EndpointError::Tls {
                url: url.to_string(),
                message: e.to_string(),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_needs_a_ca_and_a_ca_needs_https() {
        assert!(endpoint("http://127.0.0.1:1", None).is_ok());
        assert!(matches!(
            endpoint("https://127.0.0.1:1", None),
            Err(EndpointError::HttpsNeedsCa { .. })
        ));
        assert!(matches!(
            endpoint("http://127.0.0.1:1", Some(b"x")),
            Err(EndpointError::CaWithoutHttps { .. })
        ));
        assert!(matches!(
            endpoint("not a url", None),
            Err(EndpointError::BadUrl { .. })
        ));
    }
}
