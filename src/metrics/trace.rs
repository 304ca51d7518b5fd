//! The tracing exporter's series (docs/reference/tracing.md#what-is-dropped-when):
//! `weir_trace_spans_exported_total` and `weir_trace_spans_dropped_total`.
//! The exporter holds the counters themselves (cheap clones of one series),
//! so it counts without knowing this module.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The two families, registered once.
#[derive(Debug, Clone)]
pub struct TraceFamilies {
    /// Spans the collector accepted.
    pub exported: IntCounter,
    dropped: IntCounterVec,
}

/// Why a span was dropped: the queue was full (the collector slow or
/// away), or an export failed.
pub const DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

impl TraceFamilies {
    pub fn register(r: &Registry) -> Self {
        let exported = IntCounter::new(
            "weir_trace_spans_exported_total",
            "Spans sent to the OTLP collector and accepted by it.",
        )
        .expect("static metric definition");
        let dropped = IntCounterVec::new(
            Opts::new(
                "weir_trace_spans_dropped_total",
                "Spans recorded but never exported, by reason: queue_full (the export queue was full: the collector slow or away), export_failed (the collector refused or could not be reached).",
            ),
            &["reason"],
        )
        .expect("static metric definition");
        for reason in DROP_REASONS {
            dropped.with_label_values(&[reason]);
        }
        r.register(Box::new(exported.clone()))
            .expect("metric registered once");
        r.register(Box::new(dropped.clone()))
            .expect("metric registered once");
        TraceFamilies { exported, dropped }
    }

    /// The series of one drop reason (one of [`DROP_REASONS`]).
    pub fn dropped(&self, reason: &str) -> IntCounter {
        self.dropped.with_label_values(&[reason])
    }
}
