//! Trace and span ids, and the sampling draw: `clock::splitmix64` over one
//! atomic counter seeded per process (`clock::fresh_seed`). Lock-free, no
//! thread-local state; unique and unpredictable enough for ids, which is
//! all W3C asks of them.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

static STATE: OnceLock<AtomicU64> = OnceLock::new();

/// A uniformly distributed u64.
pub(super) fn draw() -> u64 {
    let s = STATE.get_or_init(|| AtomicU64::new(crate::clock::fresh_seed()));
    crate::clock::splitmix64(s)
}

/// A new span id: never zero.
pub(super) fn span_id() -> u64 {
    loop {
        let id = draw();
        if id != 0 {
            return id;
        }
    }
}

/// A new trace id: never zero.
pub(super) fn trace_id() -> u128 {
    (u128::from(draw()) << 64) | u128::from(span_id())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_differ_and_are_never_zero() {
        let a: Vec<u64> = (0..1000).map(|_| super::span_id()).collect();
        let set: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(set.len(), a.len());
        assert!(a.iter().all(|i| *i != 0));
        assert_ne!(super::trace_id(), super::trace_id());
    }
}
