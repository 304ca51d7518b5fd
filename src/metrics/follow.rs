//! Counters that follow a store's own counts (the idempotency store's, the
//! response cache's): the store counts for itself, inside its lock, and
//! the series are brought up to its counts by difference when `/metrics`
//! is scraped, so a request pays nothing for them.

use prometheus::{IntCounter, IntCounterVec};
use std::sync::Mutex;

/// One upstream's counters of one family, by result, and the counts they
/// last showed.
#[derive(Debug)]
pub(super) struct Follow<const N: usize> {
    total: [IntCounter; N],
    seen: Mutex<[u64; N]>,
}

impl<const N: usize> Follow<N> {
    /// `upstream`'s series of `family`, one per result, created at zero.
    pub(super) fn new(family: &IntCounterVec, upstream: &str, results: [&str; N]) -> Self {
        Self::of(results.map(|r| family.with_label_values(&[upstream, r])))
    }

    /// Counters made by the caller.
    pub(super) fn of(total: [IntCounter; N]) -> Self {
        Follow {
            total,
            seen: Mutex::new([0; N]),
        }
    }

    /// Brings the counters up to `now`. A store that started anew (its
    /// counts below those seen) adds from zero.
    pub(super) fn show(&self, now: [u64; N]) {
        if let Ok(mut seen) = self.seen.lock() {
            for (i, c) in self.total.iter().enumerate() {
                let from = if now[i] < seen[i] { 0 } else { seen[i] };
                c.inc_by(now[i] - from);
            }
            *seen = now;
        }
    }
}

/// Removes `upstream`'s series of `family`.
pub(super) fn forget(family: &IntCounterVec, upstream: &str, results: &[&str]) {
    for r in results {
        family.remove_label_values(&[upstream, r]).ok();
    }
}
