//! One traced request (docs/reference/tracing.md#spans): its server span and
//! one child span per attempt, recorded as the request goes and handed to
//! the exporter's queue, whole, when it ends. A [`Trace`] exists only for a
//! request weir records; an untraced request carries `None` and pays
//! nothing here.

use super::context;
use super::export::Pipeline;
use crate::policy::{Cause, Outcome, StopReason};
use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// A traced request: cheap to clone (one `Arc`), shared by the request's
/// path and its attempts (a keyed write's task included).
#[derive(Debug, Clone)]
pub struct Trace(Arc<ServerSpan>);

#[derive(Debug)]
struct ServerSpan {
    pipeline: Arc<Pipeline>,
    trace_id: u128,
    span_id: u64,
    /// The caller's span, when the request came with a context.
    parent: Option<u64>,
    trace_state: TraceState,
    /// The caller's `tracestate`, bounded, as it is forwarded.
    state_text: Option<Box<str>>,
    /// Wall time at `t0`: span times are `wall0 + (instant - t0)`, so the
    /// whole tree reads one clock and follows tokio's.
    wall0: SystemTime,
    t0: Instant,
    record: Mutex<SpanRecord>,
}

#[derive(Debug, Default)]
struct SpanRecord {
    name: String,
    attributes: Vec<KeyValue>,
    events: Vec<Event>,
    attempts: Vec<Attempt>,
    error: Option<String>,
    end: Option<Instant>,
    done: bool,
}

#[derive(Debug)]
struct Attempt {
    /// Its number (1, 2, …): attempts are found by it, not by order, so
    /// that two in flight at once (a hedge) keep their own spans.
    n: u32,
    span_id: u64,
    start: Instant,
    end: Option<Instant>,
    attributes: Vec<KeyValue>,
    error: Option<String>,
}

/// What a request came to, as its server span records it (the access
/// log's line says the same).
#[derive(Debug, Clone, Copy, Default)]
pub struct Finish<'a> {
    pub status: u16,
    /// weir's error code, when weir answered itself.
    pub error: Option<&'a str>,
    pub attempts: Option<u32>,
    pub retry_stop: Option<&'a str>,
    pub took: Duration,
    /// `x-weir-cache`, when the response cache took the request up.
    pub cache: Option<&'a str>,
    /// Answered from a keyed write's record.
    pub replay: bool,
}

/// What the server span knows when it starts.
#[derive(Debug, Clone, Copy)]
pub struct SpanStart<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub upstream: &'a str,
    /// The request's deadline, from its arrival.
    pub deadline: Duration,
    /// `"1.1"` or `"2"`.
    pub protocol: &'static str,
}

/// The longest string weir records from a request in a span attribute
/// (`url.path`, `http.request.method_original`), in bytes: longer ones are
/// cut, on a character boundary (docs/reference/tracing.md#spans). Envoy
/// cuts its path tag at 256 too. A span's size is then bounded, and so is
/// the queue's memory.
pub const MAX_ATTRIBUTE_LEN: usize = 256;

/// `s` cut to [`MAX_ATTRIBUTE_LEN`] bytes.
fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_ATTRIBUTE_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The method as OpenTelemetry's HTTP conventions name it: one of the
/// methods RFC 9110 and RFC 5789 define, else `_OTHER`.
fn known_method(m: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    KNOWN.into_iter().find(|k| *k == m).unwrap_or("_OTHER")
}

/// weir's own refusals, which the server span records as an event.
const REFUSALS: [&str; 4] = ["rate_limited", "circuit_open", "overloaded", "budget"];

impl Trace {
    pub(super) fn new(
        pipeline: Arc<Pipeline>,
        parent: Option<(u128, u64)>,
        trace_state: Option<&str>,
        start: Instant,
        b: SpanStart<'_>,
    ) -> Trace {
        let (trace_id, parent) = match parent {
            Some((t, s)) => (t, Some(s)),
            None => (super::ids::trace_id(), None),
        };
        let state_text = trace_state.filter(|_| parent.is_some()).map(Box::from);
        let trace_state = match (parent, trace_state) {
            (Some(_), Some(s)) => s.parse().unwrap_or_default(),
            _ => TraceState::NONE,
        };
        let method = known_method(b.method);
        let mut attributes = vec![
            KeyValue::new("http.request.method", method),
            KeyValue::new("url.path", cut(b.path)),
            KeyValue::new("weir.upstream", b.upstream.to_string()),
            KeyValue::new("weir.deadline_ms", b.deadline.as_millis() as i64),
            KeyValue::new("network.protocol.version", b.protocol),
        ];
        if method == "_OTHER" {
            attributes.push(KeyValue::new("http.request.method_original", cut(b.method)));
        }
        Trace(Arc::new(ServerSpan {
            wall0: pipeline.wall(),
            pipeline,
            trace_id,
            span_id: super::ids::span_id(),
            parent,
            trace_state,
            state_text,
            t0: start,
            record: Mutex::new(SpanRecord {
                // OpenTelemetry: `HTTP` for a method it does not know.
                name: if method == "_OTHER" { "HTTP" } else { method }.to_string(),
                attributes,
                ..SpanRecord::default()
            }),
        }))
    }

    fn record(&self) -> std::sync::MutexGuard<'_, SpanRecord> {
        self.0.record.lock().expect("trace record lock poisoned")
    }

    /// The trace id as 32 hex digits, for the access log.
    pub fn trace_id_text<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        context::write_hex(&self.0.trace_id.to_be_bytes(), buf);
        std::str::from_utf8(buf).unwrap_or_default()
    }

    /// The caller's `tracestate` as it is forwarded, bounded
    /// ([`super::context::tracestate`]); `None` when weir began the trace.
    pub fn tracestate(&self) -> Option<&str> {
        self.0.state_text.as_deref()
    }

    /// The `traceparent` the upstream gets when no attempt span names it
    /// (a request sent outside the attempt loop): weir's server span.
    pub fn traceparent(&self) -> [u8; 55] {
        context::format(self.0.trace_id, self.0.span_id)
    }

    /// Starts attempt `n`'s span at `started`, after `backoff` of waiting,
    /// with the breaker's state when it admitted it; returns the
    /// `traceparent` the attempt carries, naming its span.
    pub fn attempt(&self, n: u32, started: Instant, backoff: Duration, probe: bool) -> [u8; 55] {
        let span_id = super::ids::span_id();
        let mut attributes = vec![
            KeyValue::new("weir.attempt", i64::from(n)),
            KeyValue::new("weir.hedge", false),
            KeyValue::new("weir.breaker", if probe { "half_open" } else { "closed" }),
            KeyValue::new("weir.backoff_ms", backoff.as_secs_f64() * 1000.0),
        ];
        if n > 1 {
            attributes.push(KeyValue::new("http.request.resend_count", i64::from(n - 1)));
        }
        let mut r = self.record();
        if let Some(m) = r.attributes.first() {
            attributes.push(m.clone()); // http.request.method
        }
        r.attempts.push(Attempt {
            n,
            span_id,
            start: started,
            end: None,
            attributes,
            error: None,
        });
        context::format(self.0.trace_id, span_id)
    }

    /// Attempt `n` was a hedge (docs/reference/hedging.md#hedging): its span
    /// says so (`weir.hedge = true`).
    pub fn mark_hedge(&self, n: u32) {
        let mut r = self.record();
        if let Some(a) = r.attempt(n) {
            for kv in a.attributes.iter_mut() {
                if kv.key.as_str() == "weir.hedge" {
                    *kv = KeyValue::new("weir.hedge", true);
                }
            }
        }
    }

    /// Ends attempt `n`'s span with its outcome (`error`: weir's code for a
    /// failed one) and the endpoint it went to, when known.
    pub fn attempt_ended(
        &self,
        n: u32,
        outcome: &Outcome,
        error: Option<&str>,
        ended: Instant,
        endpoint: Option<crate::address::Address>,
        server: &str,
    ) {
        let mut r = self.record();
        let Some(a) = r.attempt(n) else {
            return;
        };
        a.end = Some(ended);
        a.attributes
            .push(KeyValue::new("weir.outcome", outcome.result_label()));
        a.attributes
            .push(KeyValue::new("server.address", server.to_string()));
        if let Some(e) = endpoint {
            a.attributes
                .push(KeyValue::new("weir.endpoint", e.to_string()));
            match e {
                crate::address::Address::Tcp(e) => {
                    a.attributes
                        .push(KeyValue::new("network.peer.address", e.ip().to_string()));
                    a.attributes
                        .push(KeyValue::new("network.peer.port", i64::from(e.port())));
                }
                crate::address::Address::Unix(path) => {
                    let path = path.display().to_string();
                    a.attributes
                        .push(KeyValue::new("network.peer.address", path));
                    a.attributes
                        .push(KeyValue::new("network.transport", "unix"));
                }
            }
        }
        match outcome {
            Outcome::Response { status, .. } => {
                a.attributes.push(KeyValue::new(
                    "http.response.status_code",
                    i64::from(*status),
                ));
                if *status >= 500 {
                    a.error = Some(status.to_string());
                }
            }
            _ => a.error = Some(error.unwrap_or(outcome.result_label()).to_string()),
        }
        if let Some(e) = &a.error {
            a.attributes.push(KeyValue::new("error.type", e.clone()));
        }
    }

    /// Attempt `n` is retried: why, and after how long a wait.
    pub fn retried(&self, n: u32, cause: Cause, delay: Duration) {
        let mut r = self.record();
        if let Some(a) = r.attempt(n) {
            a.attributes
                .push(KeyValue::new("weir.retry_cause", cause.to_string()));
            a.attributes.push(KeyValue::new(
                "weir.retry_delay_ms",
                delay.as_secs_f64() * 1000.0,
            ));
        }
    }

    /// Attempt `n`'s retryable outcome was not retried: why, as an event
    /// on the server span (`weir.refused` for weir's own refusals) and on
    /// the attempt.
    pub fn stopped(&self, n: u32, reason: StopReason, at: Instant) {
        let reason = reason.as_str();
        let time = self.0.wall(at);
        let mut r = self.record();
        if let Some(a) = r.attempt(n) {
            a.attributes.push(KeyValue::new("weir.retry_stop", reason));
        }
        let name = if REFUSALS.contains(&reason) {
            "weir.refused"
        } else {
            "weir.retry_stopped"
        };
        r.events.push(Event::new(
            name,
            time,
            vec![KeyValue::new("weir.reason", reason)],
            0,
        ));
    }

    /// Forgets the request: nothing of it is exported (it is served
    /// elsewhere, and traced there).
    pub fn discard(&self) {
        self.record().done = true;
    }

    /// Ends the server span with what the request came to, and hands the
    /// tree to the exporter. Once only; later calls do nothing.
    pub fn finish(&self, f: Finish<'_>) {
        let mut r = self.record();
        if r.done {
            return;
        }
        let end = self.0.t0 + f.took;
        if f.status != 0 {
            r.attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(f.status),
            ));
        }
        if let Some(n) = f.attempts {
            r.attributes
                .push(KeyValue::new("weir.attempts", i64::from(n)));
        }
        if let Some(s) = f.retry_stop {
            r.attributes
                .push(KeyValue::new("weir.retry_stop", s.to_string()));
        }
        if let Some(c) = f.cache {
            r.attributes
                .push(KeyValue::new("weir.cache", c.to_string()));
        }
        if f.replay {
            r.attributes
                .push(KeyValue::new("weir.idempotent_replay", true));
        }
        if let Some(e) = f.error {
            r.attributes
                .push(KeyValue::new("weir.error", e.to_string()));
            r.attributes
                .push(KeyValue::new("error.type", e.to_string()));
            if REFUSALS.contains(&e) {
                let ev = vec![KeyValue::new("weir.reason", e.to_string())];
                r.events
                    .push(Event::new("weir.refused", self.0.wall(end), ev, 0));
            }
            r.error = Some(e.to_string());
        } else if f.status >= 500 {
            r.error = Some(f.status.to_string());
        }
        r.end = Some(end);
        self.0.export(&mut r);
    }
}

impl ServerSpan {
    fn wall(&self, at: Instant) -> SystemTime {
        self.wall0 + at.saturating_duration_since(self.t0)
    }

    /// Builds the spans and queues them: the attempts in turn, then the
    /// server span (children before their parent, as `exporter = "log"`
    /// prints them, docs/reference/tracing.md#without-a-collector); the
    /// queue never waits.
    fn export(&self, r: &mut SpanRecord) {
        r.done = true;
        let end = r.end.unwrap_or_else(Instant::now);
        let i = self;
        let server = SpanId::from_bytes(i.span_id.to_be_bytes());
        let name: std::borrow::Cow<'static, str> = std::mem::take(&mut r.name).into();
        let mut spans = Vec::with_capacity(1 + r.attempts.len());
        for a in r.attempts.drain(..) {
            spans.push(SpanData {
                span_context: self.context(a.span_id),
                parent_span_id: server,
                parent_span_is_remote: false,
                span_kind: SpanKind::Client,
                name: name.clone(),
                start_time: self.wall(a.start),
                end_time: self.wall(a.end.unwrap_or(end)),
                attributes: a.attributes,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: status(a.error),
                instrumentation_scope: i.pipeline.scope(),
            });
        }
        let mut events = SpanEvents::default();
        events.events = std::mem::take(&mut r.events);
        spans.push(SpanData {
            span_context: self.context(i.span_id),
            parent_span_id: i
                .parent
                .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.to_be_bytes())),
            parent_span_is_remote: i.parent.is_some(),
            span_kind: SpanKind::Server,
            name,
            start_time: i.wall0,
            end_time: self.wall(end),
            attributes: std::mem::take(&mut r.attributes),
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: status(r.error.take()),
            instrumentation_scope: i.pipeline.scope(),
        });
        i.pipeline.send(spans);
    }

    fn context(&self, span_id: u64) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id.to_be_bytes()),
            SpanId::from_bytes(span_id.to_be_bytes()),
            TraceFlags::SAMPLED,
            false,
            self.trace_state.clone(),
        )
    }
}

impl SpanRecord {
    fn attempt(&mut self, n: u32) -> Option<&mut Attempt> {
        self.attempts.iter_mut().rev().find(|a| a.n == n)
    }
}

fn status(error: Option<String>) -> Status {
    match error {
        Some(e) => Status::error(e),
        None => Status::Unset,
    }
}

impl Drop for ServerSpan {
    /// A request that never finished (its client went away, or it was
    /// dropped on an error path): its spans go out with
    /// `weir.error = client_gone`.
    fn drop(&mut self) {
        let Ok(r) = self.record.get_mut() else { return };
        if r.done {
            return;
        }
        let mut r = std::mem::take(r);
        r.attributes
            .push(KeyValue::new("weir.error", "client_gone"));
        self.export(&mut r);
    }
}
