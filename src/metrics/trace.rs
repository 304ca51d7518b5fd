//! The tracing exporter's series (docs/reference/tracing.md#what-is-dropped-when):
//! `weir_trace_spans_exported_total` and `weir_trace_spans_dropped_total`,
//! present only while tracing is on (docs/reference/metrics.md#which-series-exist).
//! The exporter holds the counters themselves (cheap clones of one series),
//! so it counts without knowing this module.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The label values of a family without labels.
const NO_LABELS: &[&str] = &[];

/// The two families, registered once.
#[derive(Debug, Clone)]
pub struct TraceFamilies {
    /// Spans the collector accepted (no labels: its one series exists while
    /// tracing is on).
    exported: IntCounterVec,
    dropped: IntCounterVec,
}

/// Why a span was dropped: the queue was full (the collector slow or
/// away), or an export failed.
pub const DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// An exporter's counters: exported, and dropped by each of
/// [`DROP_REASONS`].
#[derive(Debug, Clone)]
pub struct TraceCounters {
    pub exported: IntCounter,
    pub queue_full: IntCounter,
    pub export_failed: IntCounter,
}

impl TraceFamilies {
    pub fn register(r: &Registry) -> Self {
        let exported = IntCounterVec::new(
            Opts::new(
                "weir_trace_spans_exported_total",
                "Spans sent to the OTLP collector and accepted by it (only while tracing is on).",
            ),
            &[],
        )
        .expect("static metric definition");
        let dropped = IntCounterVec::new(
            Opts::new(
                "weir_trace_spans_dropped_total",
                "Spans recorded but never exported, by reason: queue_full (the export queue was full: the collector slow or away), export_failed (the collector refused or could not be reached). Only while tracing is on.",
            ),
            &["reason"],
        )
        .expect("static metric definition");
        r.register(Box::new(exported.clone()))
            .expect("metric registered once");
        r.register(Box::new(dropped.clone()))
            .expect("metric registered once");
        TraceFamilies { exported, dropped }
    }

    /// The counters of an exporter, every series at zero when new: tracing
    /// is on.
    pub fn counters(&self) -> TraceCounters {
        TraceCounters {
            exported: self.exported.with_label_values(NO_LABELS),
            queue_full: self.dropped.with_label_values(&["queue_full"]),
            export_failed: self.dropped.with_label_values(&["export_failed"]),
        }
    }

    /// Removes every series: tracing is off, nothing can be exported or
    /// dropped.
    pub fn forget(&self) {
        self.exported.remove_label_values(NO_LABELS).ok();
        for reason in DROP_REASONS {
            self.dropped.remove_label_values(&[reason]).ok();
        }
    }
}
