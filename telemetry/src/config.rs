//! Whether and where to export, decided from the `--otlp-endpoint` flag and
//! the standard `OTEL_*` environment variables, before anything is built.
//!
//! Export is on only when an endpoint is named (flag,
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
//! unlike the SDK's own default, fvd never dials `localhost:4317` on its
//! own. `OTEL_SDK_DISABLED=true` and `OTEL_TRACES_EXPORTER=none` turn it off.
//! A protocol other than `grpc` in `OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL`
//! is refused, naming the variable that holds it.
//! The remaining variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, …) are read by the OpenTelemetry SDK itself.

/// What the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportDecision {
    /// Nothing configured (or disabled): no exporter is built.
    Off,
    /// Export over OTLP/gRPC.
    Export(ExportConfig),
    /// Configured, but in a way fvd cannot honour; the message says why.
    Unsupported(String),
}

/// A resolved export configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportConfig {
    /// The flag's endpoint; `None` lets the exporter read the
    /// `OTEL_EXPORTER_OTLP_*ENDPOINT` variables itself (per signal).
    pub endpoint: Option<String>,
    /// `service.name` used when `OTEL_SERVICE_NAME` is not set.
    pub default_service: String,
    /// Whether metrics are exported too (`OTEL_METRICS_EXPORTER` not `none`).
    pub metrics: bool,
}

impl ExportDecision {
    /// Decides from the flag and an environment lookup (`std::env::var` in
    /// the binary; a map in tests).
    pub fn resolve(
        flag: Option<&str>,
        default_service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let set = |name: &str| {
            env(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Self::Off;
        }
        if set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none")) {
            return Self::Off;
        }
        let flag = flag.map(str::trim).filter(|f| !f.is_empty());
        let from_env = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
        if flag.is_none() && from_env.is_none() {
            return Self::Off;
        }
        let metrics = !set("OTEL_METRICS_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        // The per-signal variable wins over the general one; the message
        // names the variable that holds the refused value.
        let mut signals = vec!["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"];
        if metrics {
            signals.push("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL");
        }
        for signal in signals {
            let protocol = [signal, "OTEL_EXPORTER_OTLP_PROTOCOL"]
                .into_iter()
                .find_map(|name| set(name).map(|v| (name, v)));
            if let Some((name, p)) = protocol
                && p != "grpc"
            {
                return Self::Unsupported(format!(
                    "{name} is {p}; fvd exports OTLP over grpc only (unset it or set it to grpc)"
                ));
            }
        }
        Self::Export(ExportConfig {
            endpoint: flag.map(str::to_string),
            default_service: default_service.to_string(),
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn decide(flag: Option<&str>, vars: &[(&str, &str)]) -> ExportDecision {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ExportDecision::resolve(flag, "fvd", |k| vars.get(k).cloned())
    }

    #[test]
    fn nothing_configured_is_off() {
        assert_eq!(decide(None, &[]), ExportDecision::Off);
        // Variables that only tune an exporter do not start one.
        assert_eq!(
            decide(
                None,
                &[
                    ("OTEL_SERVICE_NAME", "x"),
                    ("OTEL_TRACES_SAMPLER", "always_on"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")
                ]
            ),
            ExportDecision::Off
        );
    }

    #[test]
    fn flag_or_endpoint_variable_turns_export_on() {
        let ExportDecision::Export(c) = decide(Some("http://127.0.0.1:4317"), &[]) else {
            panic!("flag should enable export");
        };
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert!(c.metrics);
        let ExportDecision::Export(c) = decide(
            None,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")],
        ) else {
            panic!("the standard variable should enable export");
        };
        // The exporter reads the variable itself (and its per-signal forms).
        assert_eq!(c.endpoint, None);
        assert!(matches!(
            decide(
                None,
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")]
            ),
            ExportDecision::Export(_)
        ));
    }

    #[test]
    fn disabling_variables_win() {
        for (k, v) in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(
                decide(Some("http://127.0.0.1:4317"), &[(k, v)]),
                ExportDecision::Off,
                "{k}={v}"
            );
        }
        let ExportDecision::Export(c) = decide(
            Some("http://127.0.0.1:4317"),
            &[("OTEL_METRICS_EXPORTER", "none")],
        ) else {
            panic!("traces stay on");
        };
        assert!(!c.metrics);
    }

    #[test]
    fn http_protocol_is_refused_naming_the_variable_that_says_so() {
        let refused = |vars: &[(&str, &str)]| match decide(Some("http://127.0.0.1:4318"), vars) {
            ExportDecision::Unsupported(m) => m,
            d => panic!("{vars:?} should be refused, got {d:?}"),
        };
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ] {
            let m = refused(&[(name, "http/protobuf")]);
            assert!(m.starts_with(&format!("{name} is http/protobuf;")), "{m}");
        }
        // The per-signal variable wins over the general one, both ways.
        let m = refused(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ]);
        assert!(
            m.starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is http/json"),
            "{m}"
        );
        assert!(matches!(
            decide(
                Some("http://127.0.0.1:4317"),
                &[
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
                ]
            ),
            ExportDecision::Export(_)
        ));
        // Metrics that are not exported need no protocol.
        assert!(matches!(
            decide(
                Some("http://127.0.0.1:4317"),
                &[
                    ("OTEL_METRICS_EXPORTER", "none"),
                    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
                ]
            ),
            ExportDecision::Export(_)
        ));
    }
}
