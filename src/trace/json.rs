//! `[tracing] exporter = "log"` (docs/reference/tracing.md#without-a-collector):
//! a finished span as one line of JSON on standard output, for a laptop or
//! a CI job with no collector. The shape is the one an OTLP receiver would
//! record, flattened: ids in hex, kind and status in OpenTelemetry's words,
//! times in unix nanoseconds.
//!
//! What it must not do: write a span over more than one line (serde_json
//! escapes every line break), or interleave two spans (one `write_all` of
//! a whole batch on a locked standard output).

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::time::SystemTime;

/// Writes `spans` to standard output, one JSON object a line, with
/// `service` as each one's `service`. `Err`: standard output refused them
/// (closed, or full with nobody reading).
pub(super) fn write(service: &str, spans: &[SpanData]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(spans.len() * 512);
    for s in spans {
        // A Value serialises only to a String: no error to handle.
        out.extend_from_slice(line(service, s).to_string().as_bytes());
        out.push(b'\n');
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&out)?;
    stdout.flush()
}

/// One span as its JSON object.
pub(super) fn line(service: &str, s: &SpanData) -> Value {
    let parent = if s.parent_span_id == SpanId::INVALID {
        String::new()
    } else {
        s.parent_span_id.to_string()
    };
    let (status, message) = match &s.status {
        Status::Unset => ("UNSET", ""),
        Status::Ok => ("OK", ""),
        Status::Error { description } => ("ERROR", description.as_ref()),
    };
    let mut v = json!({
        "service": service,
        "trace_id": s.span_context.trace_id().to_string(),
        "span_id": s.span_context.span_id().to_string(),
        "parent_span_id": parent,
        "name": s.name.as_ref(),
        "kind": kind(&s.span_kind),
        "attributes": attributes(&s.attributes),
        "events": s.events.iter().map(|e| json!({
            "name": e.name.as_ref(),
            "time": nanos(e.timestamp),
            "attributes": attributes(&e.attributes),
        })).collect::<Vec<_>>(),
        "status": status,
        "start": nanos(s.start_time),
        "end": nanos(s.end_time),
    });
    if !message.is_empty() {
        v["status_message"] = message.into();
    }
    v
}

fn kind(k: &SpanKind) -> &'static str {
    match k {
        SpanKind::Server => "SERVER",
        SpanKind::Client => "CLIENT",
        SpanKind::Producer => "PRODUCER",
        SpanKind::Consumer => "CONSUMER",
        SpanKind::Internal => "INTERNAL",
    }
}

fn attributes(kvs: &[opentelemetry::KeyValue]) -> Map<String, Value> {
    kvs.iter()
        .map(|kv| {
            let v = match &kv.value {
                OtelValue::Bool(b) => Value::from(*b),
                OtelValue::I64(i) => Value::from(*i),
                OtelValue::F64(f) => Value::from(*f),
                OtelValue::String(s) => Value::from(s.as_str()),
                other => Value::from(other.to_string()),
            };
            (kv.key.as_str().to_string(), v)
        })
        .collect()
}

/// Unix nanoseconds; 0 for a time before the epoch (a wall clock set back).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
