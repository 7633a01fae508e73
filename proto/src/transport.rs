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

/// The endpoint for `url`; with `https://`, `tls_ca` (PEM) must be given.
pub fn endpoint(url: &str, tls_ca: Option<&[u8]>) -> Result<Endpoint, EndpointError> {
    let ep = Endpoint::from_shared(url.to_string()).map_err(|e| EndpointError::BadUrl {
        url: url.to_string(),
        message: e.to_string(),
    })?;
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
