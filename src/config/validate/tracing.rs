//! `[tracing]`: where weir's spans go (docs/reference/tracing.md#configuration),
//! validated into a [`TracingConfig`]. The endpoint is checked as text,
//! never dialled: the config layer touches no network.

use super::super::raw::RawTracing;
use super::super::{TraceExporter, TraceProtocol, TracingConfig};
use super::ErrorSink;

/// The longest `service_name`, in bytes.
const MAX_SERVICE_NAME: usize = 255;

pub(super) fn tracing(cx: &mut ErrorSink, t: &RawTracing) -> Option<TracingConfig> {
    let n_errors = cx.errors.len();
    let protocol = t.protocol.unwrap_or_default();
    let exporter = t.exporter.unwrap_or_default();
    if exporter == TraceExporter::Log && t.endpoint.is_some() {
        cx.err(
            "tracing.endpoint",
            "is for exporter = \"otlp\": exporter = \"log\" writes spans to standard output (unset one or the other)",
        );
    }
    let endpoint = t
        .endpoint
        .as_deref()
        .and_then(|e| endpoint(cx, e, protocol));
    let sample = t.sample.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&sample) {
        cx.err(
            "tracing.sample",
            format!("must be a share between 0 and 1 (0.01 traces one request in a hundred), got {sample}"),
        );
    }
    let max_traces_per_second = t.max_traces_per_second.unwrap_or(100.0);
    if !(max_traces_per_second.is_finite() && max_traces_per_second > 0.0) {
        cx.err(
            "tracing.max_traces_per_second",
            format!("must be a rate above 0 (requests traced a second; set it high to lift the cap), got {max_traces_per_second}"),
        );
    }
    let trust_caller_sampling = t.trust_caller_sampling.unwrap_or(true);
    let service_name = t.service_name.clone().unwrap_or_default();
    if service_name.trim().is_empty()
        || service_name.len() > MAX_SERVICE_NAME
        || service_name.chars().any(char::is_control)
    {
        cx.err(
            "tracing.service_name",
            format!("must be 1 to {MAX_SERVICE_NAME} bytes of text, got {service_name:?}"),
        );
    }
    let mut headers = Vec::new();
    for (name, value) in t.headers.iter().flatten() {
        let field = format!("tracing.headers.{name}");
        let lower = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            cx.err(&field, format!("{name:?} is not a header name"));
        } else if http::HeaderValue::from_str(value).is_err()
            || !value
                .bytes()
                .all(|b| b.is_ascii_graphic() || b == b' ' || b == b'\t')
        {
            cx.err(&field, "the value must be visible ASCII text");
        } else {
            headers.push((lower, value.clone()));
        }
    }
    (cx.errors.len() == n_errors).then_some(TracingConfig {
        exporter,
        endpoint,
        protocol,
        sample,
        max_traces_per_second,
        trust_caller_sampling,
        service_name,
        headers,
    })
}

/// `[tracing]` as the effective config shows it: header values (API keys)
/// masked.
pub(super) fn effective(mut t: RawTracing) -> RawTracing {
    if let Some(h) = &mut t.headers {
        for v in h.values_mut() {
            *v = "***".into();
        }
    }
    t
}

/// The collector's URL: `http://host:port`, a path only with
/// `http/protobuf` (which otherwise gets `/v1/traces`).
fn endpoint(cx: &mut ErrorSink, s: &str, protocol: TraceProtocol) -> Option<String> {
    let field = "tracing.endpoint";
    let bad = |why: &str| format!("invalid endpoint {s:?}: {why}");
    let uri: http::Uri = match s.parse() {
        Ok(u) => u,
        Err(e) => {
            cx.err(field, bad(&e.to_string()));
            return None;
        }
    };
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            cx.err(
                field,
                bad("https is not supported: weir sends spans in cleartext, to a collector on the same host or network (docs/reference/tracing.md#configuration)"),
            );
            return None;
        }
        _ => {
            cx.err(
                field,
                bad("expected http://host:port, e.g. \"http://127.0.0.1:4317\""),
            );
            return None;
        }
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        cx.err(field, bad("no host"));
        return None;
    };
    if uri.query().is_some() || s.contains('#') || authority.as_str().contains('@') {
        cx.err(
            field,
            bad("credentials, a query or a fragment: use `headers` for credentials"),
        );
        return None;
    }
    let path = uri.path();
    match protocol {
        TraceProtocol::Grpc if path != "/" && !path.is_empty() => {
            cx.err(
                field,
                bad("a gRPC endpoint has no path (the service is named by OTLP)"),
            );
            None
        }
        TraceProtocol::Grpc => Some(format!("http://{authority}")),
        TraceProtocol::HttpProtobuf if path == "/" || path.is_empty() => {
            Some(format!("http://{authority}/v1/traces"))
        }
        TraceProtocol::HttpProtobuf => Some(s.to_string()),
    }
}
