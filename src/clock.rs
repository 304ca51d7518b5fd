//! The one module that reads clocks and seeds randomness.
//!
//! Everything else gets time from here (or from `tokio::time`, which tests
//! pause and advance), so `.clippy.toml` bans `std::time::Instant::now`,
//! `SystemTime::now` and the thread-local RNG everywhere but this file.

use std::time::{Duration, SystemTime};

/// Monotonic time for the policy core, measured on tokio's clock so that
/// `tokio::time::pause` moves it too.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            origin: tokio::time::Instant::now(),
        }
    }

    /// Time since this clock's origin: the policy core's `now`.
    pub fn now(&self) -> Duration {
        tokio::time::Instant::now().saturating_duration_since(self.origin)
    }

    /// The policy-core time of an instant already read (saves a clock read).
    pub fn at(&self, i: tokio::time::Instant) -> Duration {
        i.saturating_duration_since(self.origin)
    }

    /// Converts a policy-core time back into a tokio instant.
    pub fn instant(&self, at: Duration) -> tokio::time::Instant {
        self.origin + at
    }

    /// Wall-clock time, for HTTP-dates in `Retry-After`.
    #[allow(clippy::disallowed_methods)] // this module owns the wall clock
    pub fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A seed for a per-upstream random source, different on every call.
#[allow(clippy::disallowed_methods)] // this module owns entropy
pub fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    // splitmix64's finaliser spreads nearby inputs over the whole range.
    mix64(t ^ c.wrapping_mul(GOLDEN_GAMMA) ^ u64::from(std::process::id()))
}

/// splitmix64's increment: 2^64 / φ, odd.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finaliser (Steele, Lea and Flood): a bijection on `u64`
/// whose outputs look independent for nearby inputs.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The next draw of the splitmix64 sequence whose state is `state`: one
/// atomic add, no lock, no thread-local state. The one generator of the
/// random draws weir makes off the policy's seeded sources (trace ids, the
/// balancer's two choices); seed `state` with [`fresh_seed`].
pub fn splitmix64(state: &std::sync::atomic::AtomicU64) -> u64 {
    let z = state
        .fetch_add(GOLDEN_GAMMA, std::sync::atomic::Ordering::Relaxed)
        .wrapping_add(GOLDEN_GAMMA);
    mix64(z)
}
