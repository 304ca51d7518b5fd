//! The shared state's series (docs/reference/fleet.md#fleet-state):
//! `weir_state_backend_up`, `weir_state_commands_total{op}`,
//! `weir_state_errors_total{op}`, `weir_state_roundtrip_seconds{op}` and
//! `weir_state_leased_tokens_total{upstream}`, `weir_state_unreplicated_total{op}`
//! and `weir_state_keyed_fallback_total{action}`. `op` is one of [`OPS`], a
//! fixed set; every series exists at zero while a Redis backend is in use,
//! and none with the memory backend.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The `op` label values: every kind of call weir makes to the backend.
/// `ping` is the connection's own check: connecting, and one PING a second
/// while up (src/state/fleet/mod.rs); `idempotency_begin` counts begins and
/// claims, `idempotency_finish` fingerprints filled in and outcomes.
pub const OPS: [&str; 9] = [
    "ping",
    "breaker_open",
    "breaker_probe",
    "breaker_close",
    "breaker_refresh",
    "lease",
    "idempotency_begin",
    "idempotency_finish",
    "idempotency_forget",
];

/// The `op` values of `weir_state_unreplicated_total`.
pub const UNREPLICATED_OPS: [&str; 2] = ["idempotency_begin", "idempotency_finish"];

/// The `action` values of `weir_state_keyed_fallback_total`.
pub const FALLBACK_ACTIONS: [&str; 2] = ["local", "refused"];

/// Round trips from well under a millisecond (a Redis on the same node) to
/// the 50 ms past which no sane `timeout` goes.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
];

/// The label values of a family without labels.
const NO_LABELS: &[&str] = &[];

/// The families, registered once; cheap to clone (handles).
#[derive(Debug, Clone)]
pub struct StateMetrics {
    /// No labels: its one series exists only while a Redis backend is in
    /// use (with `backend = "memory"` there is nothing to be up or down).
    up: IntGaugeVec,
    commands: IntCounterVec,
    errors: IntCounterVec,
    roundtrip: HistogramVec,
    leased: IntCounterVec,
    /// `weir_state_unreplicated_total{op}`.
    unreplicated: IntCounterVec,
    /// `weir_state_keyed_fallback_total{action}`.
    fallback: IntCounterVec,
    /// Whether a Redis backend is in use: from [`StateMetrics::precreate_ops`]
    /// to [`StateMetrics::forget_backend`]. A fleet a reload replaced may
    /// still finish a call or a health check after it; it then counts into
    /// series of its own, so the memory backend's `/metrics` stays without.
    on: Arc<AtomicBool>,
}

/// One `op`'s series, resolved once.
#[derive(Debug, Clone)]
pub struct OpSeries {
    pub commands: IntCounter,
    pub errors: IntCounter,
    pub roundtrip: Histogram,
}

impl StateMetrics {
    pub fn register(r: &Registry) -> Self {
        let up = IntGaugeVec::new(
            Opts::new(
                "weir_state_backend_up",
                "1 while the shared-state Redis answers, else 0 (no series with backend = \"memory\").",
            ),
            &[],
        )
        .expect("static metric definition");
        let commands = IntCounterVec::new(
            Opts::new(
                "weir_state_commands_total",
                "Calls made to the shared-state backend (one round trip each), by operation.",
            ),
            &["op"],
        )
        .expect("static metric definition");
        let errors = IntCounterVec::new(
            Opts::new(
                "weir_state_errors_total",
                "Calls to the shared-state backend that failed, timed out or were not made because it was down, by operation; the caller fell back to local state.",
            ),
            &["op"],
        )
        .expect("static metric definition");
        let roundtrip = HistogramVec::new(
            HistogramOpts::new(
                "weir_state_roundtrip_seconds",
                "Time of calls to the shared-state backend that answered, by operation.",
            )
            .buckets(BUCKETS.to_vec()),
            &["op"],
        )
        .expect("static metric definition");
        let leased = IntCounterVec::new(
            Opts::new(
                "weir_state_leased_tokens_total",
                "Rate-limit tokens this instance leased from fleet-wide buckets.",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let unreplicated = IntCounterVec::new(
            Opts::new(
                "weir_state_unreplicated_total",
                "Keyed writes' claims (op=\"idempotency_begin\") and records (op=\"idempotency_finish\") that went ahead without the acknowledgement of [state] wait_replicas within wait_timeout.",
            ),
            &["op"],
        )
        .expect("static metric definition");
        let fallback = IntCounterVec::new(
            Opts::new(
                "weir_state_keyed_fallback_total",
                "Keyed writes the shared store could not guard (no primary, or no acknowledgement from its replicas), by what [state] on_unavailable made of them: local (decided by this instance alone) or refused (503 state_unavailable).",
            ),
            &["action"],
        )
        .expect("static metric definition");
        for c in [&commands, &errors, &unreplicated, &fallback] {
            r.register(Box::new(c.clone()))
                .expect("metric registered once");
        }
        r.register(Box::new(up.clone()))
            .expect("metric registered once");
        r.register(Box::new(roundtrip.clone()))
            .expect("metric registered once");
        r.register(Box::new(leased.clone()))
            .expect("metric registered once");
        // The backend's series exist only with a Redis backend: a fleet
        // creates them when it starts ([`StateMetrics::precreate_ops`]) and
        // a reload to the memory backend removes them ([`StateMetrics::forget_backend`]).
        StateMetrics {
            up,
            commands,
            errors,
            roundtrip,
            leased,
            unreplicated,
            fallback,
            on: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Families on a registry of their own (tests, tools).
    pub fn unregistered() -> Self {
        StateMetrics::register(&Registry::new())
    }

    /// A Redis backend starts: every command's series at zero, so that a
    /// rate over them reads 0 before the first.
    pub fn precreate_ops(&self) {
        self.on.store(true, Ordering::Relaxed);
        for op in OPS {
            self.op(op);
        }
        for op in UNREPLICATED_OPS {
            self.unreplicated.with_label_values(&[op]);
        }
        for action in FALLBACK_ACTIONS {
            self.fallback.with_label_values(&[action]);
        }
    }

    /// A keyed write's claim or record (`op`) not acknowledged by the
    /// replicas `wait_replicas` asks for.
    pub fn unreplicated(&self, op: &str) {
        if self.on.load(Ordering::Relaxed) {
            self.unreplicated.with_label_values(&[op]).inc();
        }
    }

    /// A keyed write the store could not guard: `local` or `refused`.
    pub fn fallback(&self, action: &str) {
        if self.on.load(Ordering::Relaxed) {
            self.fallback.with_label_values(&[action]).inc();
        }
    }

    /// `weir_state_keyed_fallback_total{action}` (tests).
    pub fn fallbacks(&self, action: &str) -> u64 {
        self.fallback
            .get_metric_with_label_values(&[action])
            .map_or(0, |c| c.get())
    }

    /// `weir_state_unreplicated_total{op}` (tests).
    pub fn unreplicated_count(&self, op: &str) -> u64 {
        self.unreplicated
            .get_metric_with_label_values(&[op])
            .map_or(0, |c| c.get())
    }

    /// `op`'s series (any name; the callers use [`OPS`]); unregistered
    /// ones while no Redis backend is in use.
    pub fn op(&self, op: &str) -> OpSeries {
        if !self.on.load(Ordering::Relaxed) {
            return OpSeries {
                commands: IntCounter::new("weir_state_commands_total", "-")
                    .expect("static metric definition"),
                errors: IntCounter::new("weir_state_errors_total", "-")
                    .expect("static metric definition"),
                roundtrip: Histogram::with_opts(HistogramOpts::new(
                    "weir_state_roundtrip_seconds",
                    "-",
                ))
                .expect("static metric definition"),
            };
        }
        OpSeries {
            commands: self.commands.with_label_values(&[op]),
            errors: self.errors.with_label_values(&[op]),
            roundtrip: self.roundtrip.with_label_values(&[op]),
        }
    }

    pub fn set_up(&self, up: bool) {
        if self.on.load(Ordering::Relaxed) {
            self.up.with_label_values(NO_LABELS).set(i64::from(up));
        }
    }

    /// Whether the backend answers (`false` with none).
    pub fn up(&self) -> bool {
        self.up
            .get_metric_with_label_values(NO_LABELS)
            .is_ok_and(|g| g.get() == 1)
    }

    /// Removes the backend's series (`weir_state_backend_up` and every
    /// command's): the memory backend, which sends no command, has none
    /// (docs/reference/metrics.md#which-series-exist).
    pub fn forget_backend(&self) {
        self.on.store(false, Ordering::Relaxed);
        self.up.remove_label_values(NO_LABELS).ok();
        for op in OPS {
            self.commands.remove_label_values(&[op]).ok();
            self.errors.remove_label_values(&[op]).ok();
            self.roundtrip.remove_label_values(&[op]).ok();
        }
        for op in UNREPLICATED_OPS {
            self.unreplicated.remove_label_values(&[op]).ok();
        }
        for action in FALLBACK_ACTIONS {
            self.fallback.remove_label_values(&[action]).ok();
        }
    }

    pub fn errors(&self, op: &str) -> u64 {
        self.errors
            .get_metric_with_label_values(&[op])
            .map_or(0, |c| c.get())
    }

    pub fn commands(&self, op: &str) -> u64 {
        self.commands
            .get_metric_with_label_values(&[op])
            .map_or(0, |c| c.get())
    }

    /// `weir_state_leased_tokens_total` for `upstream`.
    pub fn leased(&self, upstream: &str) -> IntCounter {
        self.leased.with_label_values(&[upstream])
    }

    /// Drops an upstream's series (removed by a reload).
    pub fn forget(&self, upstream: &str) {
        self.leased.remove_label_values(&[upstream]).ok();
    }
}
