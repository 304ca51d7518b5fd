//! The series of gRPC calls (docs/reference/metrics.md#grpc): a gRPC call's
//! outcome is its `grpc-status`, so its counts in `weir_requests_total` and
//! `weir_upstream_attempts_total` carry a `grpc_code` label (gRPC's names:
//! `OK`, `Unavailable`, …) beside the HTTP status the client received.
//!
//! A Prometheus family may hold series with different label sets; the
//! prometheus crate's registry does not allow one family two, so these
//! vectors live in a registry of their own and [`merge`] folds its families
//! into the main registry's when they are gathered. A request that is not
//! gRPC has no `grpc_code` label at all.

use crate::policy::grpc::{label, CODES};
use crate::policy::Outcome;
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::sync::OnceLock;

/// The gRPC vectors and their registry.
#[derive(Debug)]
pub struct GrpcFamilies {
    registry: Registry,
    requests: IntCounterVec,
    attempts: IntCounterVec,
}

impl GrpcFamilies {
    /// The vectors, named and described as the main registry's families
    /// they join.
    pub fn new(requests_help: &str, attempts_help: &str) -> Self {
        let registry = Registry::new();
        let vec = |name: &str, help: &str, labels: &[&str]| {
            let v = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("static metric definition");
            registry
                .register(Box::new(v.clone()))
                .expect("metric registered once");
            v
        };
        let requests = vec(
            "weir_requests_total",
            requests_help,
            &["upstream", "code", "error", "grpc_code"],
        );
        let attempts = vec(
            "weir_upstream_attempts_total",
            attempts_help,
            &["upstream", "result", "grpc_code"],
        );
        GrpcFamilies {
            registry,
            requests,
            attempts,
        }
    }

    /// One upstream's handles.
    pub fn upstream(&self, name: &str) -> GrpcSeries {
        GrpcSeries {
            name: name.to_string(),
            ok_answers: CODES.map(|_| OnceLock::new()),
            requests: self.requests.clone(),
            attempts: self.attempts.clone(),
        }
    }

    /// The families gathered, to fold into the main registry's ([`merge`]).
    pub fn gather(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }

    /// The requests family alone (the status page's sampler reads it).
    pub fn requests(&self) -> Vec<MetricFamily> {
        use prometheus::core::Collector;
        self.requests.collect()
    }
}

/// Folds `extra` into `families`: a family of the same name takes its
/// series (kept sorted, as the registry sorts them); any other is added.
pub fn merge(families: &mut Vec<MetricFamily>, extra: Vec<MetricFamily>) {
    for mut f in extra {
        match families.iter_mut().find(|g| g.name() == f.name()) {
            Some(g) => {
                for m in f.take_metric() {
                    g.mut_metric().push(m);
                }
            }
            None => families.push(f),
        }
    }
}

/// One upstream's gRPC series.
#[derive(Debug)]
pub struct GrpcSeries {
    name: String,
    /// `weir_requests_total{code="200", error="", grpc_code}` by code: the
    /// upstream's answers, the common case.
    ok_answers: [OnceLock<IntCounter>; 17],
    requests: IntCounterVec,
    attempts: IntCounterVec,
}

impl GrpcSeries {
    /// A call answered: HTTP `status` (200 for any gRPC answer), weir's
    /// `error` when weir answered itself, and the gRPC code the client got.
    pub fn request(&self, status: u16, error: &str, code: u8) {
        if status == 200 && error.is_empty() {
            if let Some(slot) = self.ok_answers.get(usize::from(code)) {
                return slot
                    .get_or_init(|| {
                        self.requests
                            .with_label_values(&[&self.name, "200", "", label(code)])
                    })
                    .inc();
            }
        }
        self.requests
            .with_label_values(&[&self.name, &status.to_string(), error, label(code)])
            .inc();
    }

    /// An attempt's result, with the code its answer carried.
    pub fn attempt(&self, outcome: &Outcome, code: u8) {
        self.attempts
            .with_label_values(&[&self.name, outcome.result_label(), label(code)])
            .inc();
    }
}
