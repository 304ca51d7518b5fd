//! Tracing (docs/reference/tracing.md#tracing): W3C trace context in and
//! out, one server span per request and one child span per attempt, sent
//! over OTLP with OpenTelemetry's own exporter.
//!
//! - [`context`]: `traceparent` and B3 read off a request, the sampling
//!   decision, the `traceparent` forwarded (pure).
//! - [`span`]: a traced request's record ([`Trace`]), which the data plane
//!   feeds (both paths, and the attempt driver through one small hook).
//! - `export`: the bounded queue and the task that sends its batches.
//! - `json`: a span as a line of JSON, for `exporter = "log"`.
//!
//! What it must not do: make an untraced request pay (a [`Tracer`] that is
//! off is one check, and a request not sampled never allocates here), or
//! make any request wait for the collector. It knows nothing of the data
//! plane: the request side calls it, never the reverse.

pub mod context;
mod export;
mod ids;
mod json;
pub mod span;

pub use context::Incoming;
pub use export::{BATCH_DELAY, BATCH_SPANS, EXPORT_TIMEOUT, QUEUE_SPANS};
pub use span::{Finish, SpanStart, Trace};

use crate::config::TracingConfig;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// A snapshot's tracing: off, or the exporter's queue and the share of
/// requests without a context that are traced. Cloned into each snapshot;
/// the queue behind it outlives reloads that keep its settings.
#[derive(Debug, Clone, Default)]
pub struct Tracer {
    pipeline: Option<Arc<export::Pipeline>>,
    sample: f64,
    trust_caller: bool,
    /// `max_traces_per_second`: a token per traced request.
    cap: Option<Arc<Mutex<crate::policy::TokenBucket>>>,
}

impl Tracer {
    /// Tracing off: no span is recorded, trace context passes through.
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// Whether weir records spans at all (`[tracing] endpoint` is set, or
    /// `exporter = "log"`).
    #[inline]
    pub fn is_on(&self) -> bool {
        self.pipeline.is_some()
    }

    /// Reads a request's context off its fields and decides whether weir
    /// records it; `Some` starts its server span at `start()` (the clock
    /// is read only for a request that is traced). Called only when
    /// [`Tracer::is_on`].
    pub fn begin<'a, 'b, I: Iterator<Item = (&'a str, &'a [u8])>>(
        &self,
        fields: impl Fn() -> I,
        start: impl FnOnce() -> Instant,
        b: impl FnOnce() -> SpanStart<'b>,
    ) -> Option<Trace> {
        let pipeline = self.pipeline.as_ref()?;
        let mut incoming = context::read(fields());
        if !self.trust_caller {
            incoming = context::untrusted(incoming);
        }
        // The common case, said at once: no context, and `sample` picks none.
        if incoming == Incoming::None && self.sample <= 0.0 {
            return None;
        }
        let parent = context::decide(incoming, self.sample, ids::draw)?;
        // The cap: past it the request is not traced, its context passed
        // on untouched (docs/reference/tracing.md#configuration).
        let t0 = start();
        if let Some(cap) = &self.cap {
            let now = pipeline.since_start(t0);
            let mut bucket = cap.lock().unwrap_or_else(|p| p.into_inner());
            if !bucket.try_take(1, now) {
                return None;
            }
        }
        let state = match parent {
            Some(_) => context::tracestate(
                fields()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(context::TRACESTATE))
                    .map(|(_, v)| v),
            ),
            None => None,
        };
        Some(Trace::new(
            pipeline.clone(),
            parent,
            state.as_deref(),
            t0,
            b(),
        ))
    }
}

/// The exporter a running weir keeps across reloads: rebuilt only when
/// `[tracing]`'s endpoint, protocol, service name or headers change
/// (`sample` is read per snapshot).
#[derive(Debug, Default)]
pub struct Registry {
    current: Mutex<Option<Arc<export::Pipeline>>>,
}

impl Registry {
    /// The tracer for a snapshot of `config`, counting into `metrics`.
    /// Must run on the tokio runtime the exporter is to live on.
    pub fn sync(
        &self,
        config: &TracingConfig,
        metrics: &crate::metrics::trace::TraceFamilies,
    ) -> Result<Tracer, String> {
        let mut current = self.current.lock().expect("tracing registry lock poisoned");
        let Some(settings) = export::Settings::of(config) else {
            *current = None;
            // Off: no span to export or drop, so no series.
            metrics.forget();
            return Ok(Tracer::off());
        };
        let pipeline = match current.as_ref() {
            Some(p) if p.settings == settings => p.clone(),
            _ => {
                let c = metrics.counters();
                let counters = export::ExportCounters {
                    exported: c.exported,
                    queue_full: c.queue_full,
                    failed: c.export_failed,
                };
                let p = export::Pipeline::start(settings, counters)?;
                match config.exporter {
                    crate::config::TraceExporter::Otlp => {
                        tracing::info!(endpoint = ?config.endpoint, protocol = ?config.protocol, "tracing: exporting spans over OTLP")
                    }
                    crate::config::TraceExporter::Log => tracing::info!(
                        sample = config.sample,
                        "tracing: writing spans to standard output, one JSON line each"
                    ),
                }
                *current = Some(p.clone());
                p
            }
        };
        let rate = config.max_traces_per_second;
        // A second's worth deep, at least one.
        let burst = rate.ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
        let now = pipeline.since_start(Instant::now());
        let bucket = crate::policy::TokenBucket::new(rate, burst, now);
        Ok(Tracer {
            pipeline: Some(pipeline),
            sample: config.sample,
            trust_caller: config.trust_caller_sampling,
            cap: Some(Arc::new(Mutex::new(bucket))),
        })
    }
}
