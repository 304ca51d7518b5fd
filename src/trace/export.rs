//! The exporter (docs/reference/tracing.md#what-is-dropped-when): finished
//! spans go into a bounded queue without waiting; one task takes them out
//! in batches and sends each batch with OpenTelemetry's OTLP exporter, or
//! writes it to standard output as JSON lines (`exporter = "log"`,
//! [`super::json`]).
//! When the collector is slow or away the queue fills and further spans
//! are dropped and counted: the data plane never waits for a collector.
//!
//! Why not the SDK's `BatchSpanProcessor`: it counts what it drops only in
//! a log line at shutdown, and runs its exporter on a thread of its own
//! outside tokio (the gRPC and hyper clients need a tokio runtime). The
//! queue here is the same idea, on tokio, with the count a metric.

use crate::config::{TraceExporter, TraceProtocol, TracingConfig};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use prometheus::IntCounter;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Spans held for export at most; past it, new spans are dropped.
pub const QUEUE_SPANS: usize = 4096;
/// Bytes of spans held for export at most (by [`span_bytes`]); past it,
/// new spans are dropped too. With attributes cut at
/// [`super::span::MAX_ATTRIBUTE_LEN`], 4096 spans stay well below it; it
/// bounds what the count alone would not.
pub(super) const QUEUE_BYTES: usize = 4 << 20;

/// What a span costs held in the queue, roughly: 256 bytes for the record
/// itself, its name, and each attribute's key and value (a number counts
/// 16), events included.
pub(super) fn span_bytes(s: &SpanData) -> usize {
    let kv = |kv: &opentelemetry::KeyValue| {
        kv.key.as_str().len()
            + match &kv.value {
                opentelemetry::Value::String(v) => v.as_str().len(),
                _ => 16,
            }
    };
    256 + s.name.len()
        + s.attributes.iter().map(kv).sum::<usize>()
        + s.events
            .iter()
            .map(|e| 64 + e.name.len() + e.attributes.iter().map(kv).sum::<usize>())
            .sum::<usize>()
}
/// Spans sent in one export at most.
pub const BATCH_SPANS: usize = 512;
/// How long a batch waits to fill after its first span.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);
/// The longest one export may take (it is then counted as failed).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the exporter is built from: a reload that leaves these alone keeps
/// the exporter, its connection and its queue.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    exporter: TraceExporter,
    /// Empty for the log exporter.
    endpoint: String,
    protocol: TraceProtocol,
    service_name: String,
    headers: Vec<(String, String)>,
}

impl Settings {
    pub(super) fn of(c: &TracingConfig) -> Option<Settings> {
        let endpoint = match c.exporter {
            TraceExporter::Otlp => c.endpoint.clone()?,
            TraceExporter::Log => String::new(),
        };
        Some(Settings {
            exporter: c.exporter,
            endpoint,
            protocol: c.protocol,
            service_name: c.service_name.clone(),
            headers: c.headers.clone(),
        })
    }
}

/// The queue's sending side, shared by every traced request.
#[derive(Debug)]
pub(super) struct Pipeline {
    pub(super) settings: Settings,
    tx: mpsc::Sender<SpanData>,
    /// [`span_bytes`] of the spans in the queue.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    queue_full: IntCounter,
    scope: InstrumentationScope,
    clock: crate::clock::Clock,
}

/// The counters the exporter keeps.
#[derive(Debug, Clone)]
pub(super) struct ExportCounters {
    pub exported: IntCounter,
    pub queue_full: IntCounter,
    pub failed: IntCounter,
}

impl Pipeline {
    /// Builds the OTLP exporter and starts the task that drains the queue
    /// (on the current tokio runtime). `Err`: the exporter could not be
    /// built (the endpoint was checked with the config; this is the
    /// exporter's own word).
    pub(super) fn start(
        settings: Settings,
        counters: ExportCounters,
    ) -> Result<Arc<Pipeline>, String> {
        let exporter = match settings.exporter {
            TraceExporter::Otlp => {
                let mut exporter = build(&settings)?;
                let resource = opentelemetry_sdk::Resource::builder_empty()
                    .with_service_name(settings.service_name.clone())
                    .build();
                exporter.set_resource(&resource);
                Sink::Otlp(Box::new(exporter))
            }
            TraceExporter::Log => Sink::Log(settings.service_name.clone(), Arc::default()),
        };
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(drain(rx, exporter, counters.clone(), queued.clone()));
        Ok(Arc::new(Pipeline {
            settings,
            tx,
            queued,
            queue_full: counters.queue_full,
            scope: InstrumentationScope::builder("weir")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            clock: crate::clock::Clock::new(),
        }))
    }

    /// Queues a request's spans; those that do not fit, by count or by
    /// bytes, are dropped and counted. Never waits.
    pub(super) fn send(&self, spans: Vec<SpanData>) {
        use std::sync::atomic::Ordering::Relaxed;
        for s in spans {
            let size = span_bytes(&s);
            let fits = self.queued.fetch_add(size, Relaxed) + size <= QUEUE_BYTES;
            if !fits || self.tx.try_send(s).is_err() {
                self.queued.fetch_sub(size, Relaxed);
                self.queue_full.inc();
            }
        }
    }

    pub(super) fn scope(&self) -> InstrumentationScope {
        self.scope.clone()
    }

    pub(super) fn wall(&self) -> SystemTime {
        self.clock.wall()
    }

    /// `at` on this pipeline's clock, for the tracing cap's bucket.
    pub(super) fn since_start(&self, at: tokio::time::Instant) -> Duration {
        self.clock.at(at)
    }
}

fn build(s: &Settings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{RetryPolicy, SpanExporter, WithExportConfig};
    let built = match s.protocol {
        TraceProtocol::Grpc => {
            use opentelemetry_otlp::WithTonicConfig;
            let mut h = http::HeaderMap::new();
            for (n, v) in &s.headers {
                if let (Ok(n), Ok(v)) = (
                    http::HeaderName::from_bytes(n.as_bytes()),
                    http::HeaderValue::from_str(v),
                ) {
                    h.insert(n, v);
                }
            }
            SpanExporter::builder()
                .with_tonic()
                .with_endpoint(s.endpoint.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .with_metadata(
                    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(h),
                )
                // A batch that fails is dropped and counted; the next one
                // tries again. Retrying would hold the queue meanwhile.
                .with_retry_policy(RetryPolicy::disabled())
                .build()
        }
        TraceProtocol::HttpProtobuf => {
            use opentelemetry_otlp::WithHttpConfig;
            SpanExporter::builder()
                .with_http()
                .with_endpoint(s.endpoint.clone())
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(EXPORT_TIMEOUT)
                .with_headers(s.headers.iter().cloned().collect())
                .with_retry_policy(RetryPolicy::disabled())
                .build()
        }
    };
    built.map_err(|e| format!("[tracing] cannot build the OTLP exporter: {e}"))
}

/// Where the drain sends a batch.
enum Sink {
    /// Boxed: one per pipeline, and far larger than the other.
    Otlp(Box<opentelemetry_otlp::SpanExporter>),
    /// Standard output, with this service name on each line; whether a
    /// batch is being written (a stuck standard output holds one blocking
    /// thread, never more).
    Log(String, Arc<std::sync::atomic::AtomicBool>),
}

impl Sink {
    async fn export(&self, batch: Vec<SpanData>) -> Result<(), String> {
        match self {
            Sink::Otlp(e) => match tokio::time::timeout(EXPORT_TIMEOUT, e.export(batch)).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("timed out".into()),
            },
            // A blocking write, off the runtime's worker threads: a
            // standard output nobody reads must not stall the data plane.
            Sink::Log(service, busy) => {
                use std::sync::atomic::Ordering::{AcqRel, Release};
                if busy.swap(true, AcqRel) {
                    return Err("standard output: still writing an earlier batch".into());
                }
                let (service, busy) = (service.clone(), busy.clone());
                let write = tokio::task::spawn_blocking(move || {
                    let r = super::json::write(&service, &batch);
                    busy.store(false, Release);
                    r
                });
                match tokio::time::timeout(EXPORT_TIMEOUT, write).await {
                    Ok(Ok(r)) => r.map_err(|e| format!("standard output: {e}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("standard output: timed out".into()),
                }
            }
        }
    }

    fn shutdown(&self) {
        if let Sink::Otlp(e) = self {
            let _ = e.shutdown();
        }
    }
}

/// Takes spans out of the queue in batches and exports them, one export at
/// a time, until every sender is gone (the last snapshot using this
/// pipeline and the last traced request of it), then flushes what is left.
async fn drain(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: Sink,
    c: ExportCounters,
    queued: Arc<std::sync::atomic::AtomicUsize>,
) {
    let taken = |spans: &[SpanData]| {
        let n = spans.iter().map(span_bytes).sum::<usize>();
        queued.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    };
    let mut batch = Vec::with_capacity(BATCH_SPANS);
    // Whether the last export failed: a warning when exports start to
    // fail, not one per batch.
    let mut failing = false;
    loop {
        if rx.recv_many(&mut batch, BATCH_SPANS).await == 0 {
            break;
        }
        let until = tokio::time::Instant::now() + BATCH_DELAY;
        let mut closed = false;
        while batch.len() < BATCH_SPANS {
            let room = BATCH_SPANS - batch.len();
            match tokio::time::timeout_at(until, rx.recv_many(&mut batch, room)).await {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        taken(&batch);
        let n = batch.len() as u64;
        let sent = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_SPANS));
        match exporter.export(sent).await {
            Ok(()) => {
                if failing {
                    tracing::info!("tracing: the collector accepts spans again");
                    failing = false;
                }
                c.exported.inc_by(n);
            }
            Err(e) => {
                failed(&mut failing, n, &e);
                c.failed.inc_by(n);
            }
        }
        if closed {
            break;
        }
    }
    exporter.shutdown();
}

/// Says that an export of `n` spans failed: a warning on the first failure
/// after a success, debug after that.
fn failed(failing: &mut bool, n: u64, why: &str) {
    if *failing {
        tracing::debug!(spans = n, error = why, "trace export failed");
    } else {
        tracing::warn!(spans = n, error = why, "tracing: export to the collector failed; spans are dropped (weir_trace_spans_dropped_total) until it accepts them again");
        *failing = true;
    }
}
