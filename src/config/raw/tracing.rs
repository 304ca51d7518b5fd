//! `[tracing]`, its raw form and built-in defaults
//! (docs/reference/tracing.md#configuration).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[tracing]`: where weir's spans go, and which requests it traces.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    /// `otlp` (default): spans go to the collector at `endpoint`. `log`:
    /// each span is written to standard output as one line of JSON, no
    /// collector needed (a laptop, a CI job).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exporter: Option<crate::config::TraceExporter>,
    /// The OTLP collector, `http://host:port` (an HTTP/protobuf endpoint
    /// without a path gets `/v1/traces`). Unset: weir records no spans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<crate::config::TraceProtocol>,
    /// The share of requests without a trace context that weir traces,
    /// 0 to 1. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<f64>,
    /// The most requests weir traces a second, whatever `sample` and the
    /// callers' flags ask: a token bucket of this rate, a second's worth
    /// deep. Default 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_traces_per_second: Option<f64>,
    /// Whether a caller's sampled flag decides (`traceparent` flags, `b3`).
    /// `false`: `sample` decides for every request, a caller's context
    /// still joined when picked. Default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust_caller_sampling: Option<bool>,
    /// `service.name` on weir's spans. Default `weir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Sent with every export (gRPC metadata or HTTP fields), e.g. an API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
}
mergeable!(RawTracing { exporter, endpoint, protocol, sample, max_traces_per_second, trust_caller_sampling, service_name, headers } nested {});

impl RawTracing {
    pub fn builtin() -> Self {
        RawTracing {
            exporter: Some(crate::config::TraceExporter::Otlp),
            endpoint: None,
            protocol: Some(crate::config::TraceProtocol::Grpc),
            sample: Some(0.0),
            max_traces_per_second: Some(100.0),
            trust_caller_sampling: Some(true),
            service_name: Some("weir".into()),
            headers: None,
        }
    }
}
