//! Admission limiters (docs/reference/admission.md#rate-limits): token bucket, sliding window, and a keyed
//! registry bounded by `max_keys`.
//!
//! Owns [`TokenBucket`], [`SlidingWindow`] and [`Limiter`] (both must admit);
//! the keyed registry built from them lives in [`super::keyed`]. It must not
//! read a clock, sleep or queue: `now` is passed in, and a `now` earlier
//! than one already seen counts as the latest one seen, so a clock stepping
//! back never creates tokens. Waiting (`max_wait`) is the data plane's job; it
//! asks [`Limiter::time_until`] how long.

use super::{Now, PolicyError, Scope};
use std::time::Duration;

/// Where a keyed limiter reads its key from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum KeySource {
    /// `header:NAME` — the (lower-cased) request header's value.
    Header(String),
}

/// Validated rate-limit parameters for one upstream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RateLimitParams {
    /// Token bucket: `(rps, burst)`.
    pub bucket: Option<(f64, u32)>,
    /// Sliding window: `(limit, period)`.
    pub window: Option<(u32, Duration)>,
    /// Where the per-key limiter's key comes from; `None` = one shared limiter.
    pub key: Option<KeySource>,
    /// The most keys the registry holds.
    pub max_keys: usize,
    /// How long a first attempt may wait for a token.
    pub max_wait: Duration,
    /// Whether the token bucket is shared by the fleet (`rate_limit.scope`,
    /// default [`Scope::Instance`]); a `window` is always the instance's.
    pub scope: Scope,
    /// How many instances share a fleet bucket, as configured: while the
    /// shared state is away each takes `rps / expected_instances` locally
    /// ([`RateLimitParams::fallback`]).
    pub expected_instances: Option<u32>,
}

impl RateLimitParams {
    /// Validates rate-limit parameters: at least one of bucket and window,
    /// positive rates and limits, `key = "header:NAME"`, `max_keys ≥ 1`.
    pub fn try_new(
        bucket: Option<(f64, u32)>,
        window: Option<(u32, Duration)>,
        key: Option<&str>,
        max_keys: usize,
        max_wait: Duration,
    ) -> Result<Self, PolicyError> {
        if let Some((rps, burst)) = bucket {
            if !(rps.is_finite() && rps > 0.0) {
                return Err(PolicyError::new(
                    "rps",
                    format!("must be a number > 0, got {rps}"),
                ));
            }
            if burst == 0 {
                return Err(PolicyError::new("burst", "must be at least 1"));
            }
        }
        if let Some((limit, period)) = window {
            if limit == 0 {
                return Err(PolicyError::new("window.limit", "must be at least 1"));
            }
            if period.is_zero() {
                return Err(PolicyError::new("window.period", "must be greater than 0"));
            }
        }
        if bucket.is_none() && window.is_none() {
            return Err(PolicyError::new(
                "rps",
                "a rate_limit table needs `rps` (with `burst`) or `window`, or both",
            ));
        }
        let key = match key {
            None => None,
            Some(k) => match k.strip_prefix("header:") {
                Some(name) if http::HeaderName::from_bytes(name.as_bytes()).is_ok() => {
                    Some(KeySource::Header(name.to_ascii_lowercase()))
                }
                _ => {
                    return Err(PolicyError::new(
                        "key",
                        format!("must be `header:NAME` with a valid header name, got {k:?}"),
                    ))
                }
            },
        };
        if max_keys == 0 {
            return Err(PolicyError::new("max_keys", "must be at least 1"));
        }
        Ok(RateLimitParams {
            bucket,
            window,
            key,
            max_keys,
            max_wait,
            scope: Scope::Instance,
            expected_instances: None,
        })
    }

    /// The same parameters shared as `scope`, with `expected_instances`
    /// (at least 1; `scope = "fleet"` needs the token bucket, `rps`).
    pub fn with_scope(
        mut self,
        scope: Scope,
        expected_instances: Option<u32>,
    ) -> Result<Self, PolicyError> {
        if expected_instances == Some(0) {
            return Err(PolicyError::new("expected_instances", "must be at least 1"));
        }
        if scope == Scope::Fleet && self.bucket.is_none() {
            return Err(PolicyError::new(
                "scope",
                "`scope = \"fleet\"` shares the token bucket: it needs `rps`",
            ));
        }
        if scope == Scope::Fleet && (self.window.is_some() || self.key.is_some()) {
            return Err(PolicyError::new(
                "scope",
                "`scope = \"fleet\"` shares one token bucket per upstream: it cannot be combined with `window` or `key` (use `scope = \"instance\"` for those)",
            ));
        }
        self.scope = scope;
        self.expected_instances = expected_instances;
        Ok(self)
    }

    /// The limits an instance applies alone while a fleet bucket's shared
    /// state is away (docs/reference/fleet.md#fleet-state): its share of the token
    /// bucket, `rps / expected_instances` with `burst / expected_instances`
    /// (rounded up, at least 1), or the whole bucket when
    /// `expected_instances` is unset; the `window` and everything else as
    /// configured. With `scope = "instance"`, the parameters themselves.
    pub fn fallback(&self) -> RateLimitParams {
        let mut p = self.clone();
        if self.scope == Scope::Fleet {
            p.bucket = self.bucket.map(|(rps, burst)| {
                super::leased_tokens::fallback_bucket(rps, burst, self.expected_instances)
            });
            p.scope = Scope::Instance;
        }
        p
    }
}

/// A token bucket refilled continuously at `rps` up to `burst`; starts full.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rps: f64,
    burst: f64,
    tokens: f64,
    last: Now,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rps: f64, burst: u32, now: Now) -> Self {
        TokenBucket {
            rps,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: now,
        }
    }

    fn refill(&mut self, now: Now) {
        if now > self.last {
            let dt = (now - self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rps).min(self.burst);
            self.last = now;
        }
    }

    fn has(&self, n: u32) -> bool {
        self.tokens >= f64::from(n)
    }

    /// Takes `n` tokens if there are that many at `now`.
    pub fn try_take(&mut self, n: u32, now: Now) -> bool {
        self.refill(now);
        if self.has(n) {
            self.tokens -= f64::from(n);
            true
        } else {
            false
        }
    }

    /// Puts back one token taken for a request weir then refused itself
    /// (never above `burst`).
    pub fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// The tokens available at `now` (after refill).
    pub fn available(&mut self, now: Now) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// How long from `now` until `n` tokens are available: zero if they are,
    /// `None` when `n` exceeds the bucket's capacity (it never will be).
    pub fn time_until(&self, n: u32, now: Now) -> Option<Duration> {
        let n = f64::from(n);
        if n > self.burst {
            return None;
        }
        let dt = now.saturating_sub(self.last).as_secs_f64();
        let tokens = (self.tokens + dt * self.rps).min(self.burst);
        let behind = self.last.saturating_sub(now);
        if tokens >= n {
            return Some(behind);
        }
        // Round up, plus a microsecond, so that refilling over exactly this
        // wait is never a hair short of `n` because of float rounding.
        let secs = (n - tokens) / self.rps + 1e-6;
        let wait = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        Some(wait.saturating_add(behind))
    }

    fn set_rate(&mut self, rps: f64, burst: u32) {
        self.rps = rps;
        self.burst = f64::from(burst);
        self.tokens = self.tokens.min(self.burst);
    }
}

/// Sub-buckets per period in [`SlidingWindow`].
const SUB: u64 = 10;
const RING: usize = SUB as usize + 1;

/// At most `limit` admissions in any sliding `period`.
///
/// Counts go into `period / 10` sub-buckets, and a sub-bucket is only
/// forgotten once its *end* is a full period old. Every admission that could
/// lie in the sliding window is therefore still counted: it never
/// over-admits, and under-admits by at most a tenth of a period's worth.
/// O(1) memory per limiter (unlike a sliding log of `limit` timestamps).
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    limit: u64,
    period: Duration,
    width_ns: u64,
    counts: [u64; RING],
    total: u64,
    head: u64,
    last: Now,
}

impl SlidingWindow {
    /// An empty window at `now`.
    pub fn new(limit: u32, period: Duration, now: Now) -> Self {
        let width_ns = u64::try_from(period.as_nanos() / u128::from(SUB))
            .unwrap_or(u64::MAX)
            .max(1);
        let mut w = SlidingWindow {
            limit: u64::from(limit),
            period,
            width_ns,
            counts: [0; RING],
            total: 0,
            head: 0,
            last: now,
        };
        w.head = w.slot_of(now);
        w
    }

    fn slot_of(&self, now: Now) -> u64 {
        u64::try_from(now.as_nanos() / u128::from(self.width_ns)).unwrap_or(u64::MAX)
    }

    fn advance(&mut self, now: Now) {
        if now <= self.last {
            return;
        }
        self.last = now;
        let target = self.slot_of(now);
        if target <= self.head {
            return;
        }
        if target - self.head >= RING as u64 {
            self.counts = [0; RING];
            self.total = 0;
        } else {
            for abs in self.head + 1..=target {
                let i = (abs % RING as u64) as usize;
                self.total -= self.counts[i];
                self.counts[i] = 0;
            }
        }
        self.head = target;
    }

    fn has(&self, n: u32) -> bool {
        self.total + u64::from(n) <= self.limit
    }

    fn add(&mut self, n: u32) {
        let i = (self.head % RING as u64) as usize;
        self.counts[i] += u64::from(n);
        self.total += u64::from(n);
    }

    /// Forgets one admission counted for a request weir then refused
    /// itself: from the newest sub-bucket that holds one.
    pub fn give_back(&mut self) {
        for back in 0..RING as u64 {
            let i = (self.head.wrapping_sub(back) % RING as u64) as usize;
            if self.counts[i] > 0 {
                self.counts[i] -= 1;
                self.total -= 1;
                return;
            }
        }
    }

    /// Admits `n` at `now` if that keeps every sliding period within `limit`.
    pub fn try_take(&mut self, n: u32, now: Now) -> bool {
        self.advance(now);
        if self.has(n) {
            self.add(n);
            true
        } else {
            false
        }
    }

    /// How long from `now` until `n` more would be admitted; `None` when `n`
    /// exceeds `limit`.
    pub fn time_until(&self, n: u32, now: Now) -> Option<Duration> {
        let n = u64::from(n);
        if n > self.limit {
            return None;
        }
        let mut probe = self.clone();
        probe.advance(now);
        let behind = self.last.saturating_sub(now);
        if probe.total + n <= probe.limit {
            return Some(behind);
        }
        let need = probe.total + n - probe.limit;
        let from = probe.last;
        let mut freed = 0;
        for abs in probe.head.saturating_sub(SUB)..=probe.head {
            freed += probe.counts[(abs % RING as u64) as usize];
            if freed >= need {
                // sub-bucket `abs` is forgotten once the head reaches abs + RING
                let at_ns = u128::from(abs + RING as u64) * u128::from(probe.width_ns);
                let at = Duration::from_nanos(u64::try_from(at_ns).unwrap_or(u64::MAX));
                return Some(at.saturating_sub(from).saturating_add(behind));
            }
        }
        Some(probe.period.saturating_add(behind))
    }

    fn set_limit(&mut self, limit: u32, period: Duration) {
        if period != self.period {
            // Keep every live admission, conservatively, in the newest slot.
            let total = self.total;
            *self = SlidingWindow::new(limit, period, self.last);
            self.counts[(self.head % RING as u64) as usize] = total;
            self.total = total;
        }
        self.limit = u64::from(limit);
    }
}

/// What a [`Limiter`] has left, from [`Limiter::peek`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Left {
    /// The token bucket's tokens, when there is a bucket.
    pub bucket_tokens: Option<f64>,
    /// Admissions the sliding window still allows, when there is a window.
    pub window_remaining: Option<u64>,
}

/// One limiter: a token bucket, a sliding window, or both (both must admit).
#[derive(Debug, Clone)]
pub struct Limiter {
    bucket: Option<TokenBucket>,
    window: Option<SlidingWindow>,
}

impl Limiter {
    /// A fresh limiter (bucket full, window empty) at `now`.
    pub fn new(params: &RateLimitParams, now: Now) -> Self {
        Limiter {
            bucket: params
                .bucket
                .map(|(rps, burst)| TokenBucket::new(rps, burst, now)),
            window: params
                .window
                .map(|(limit, period)| SlidingWindow::new(limit, period, now)),
        }
    }

    /// Takes one token if both the bucket and the window admit at `now`;
    /// takes nothing from either otherwise.
    pub fn try_acquire(&mut self, now: Now) -> bool {
        if let Some(b) = &mut self.bucket {
            b.refill(now);
            if !b.has(1) {
                return false;
            }
        }
        if let Some(w) = &mut self.window {
            w.advance(now);
            if !w.has(1) {
                return false;
            }
            w.add(1);
        }
        if let Some(b) = &mut self.bucket {
            b.tokens -= 1.0;
        }
        true
    }

    /// Gives back what [`Limiter::try_acquire`] took, for a request weir
    /// refused afterwards (circuit open, concurrency gate full).
    pub fn give_back(&mut self) {
        if let Some(b) = &mut self.bucket {
            b.give_back();
        }
        if let Some(w) = &mut self.window {
            w.give_back();
        }
    }

    /// How long from `now` until [`Limiter::try_acquire`] could succeed (zero
    /// if it can now). For the first attempt's `max_wait` and `Retry-After`.
    pub fn time_until(&self, now: Now) -> Option<Duration> {
        let b = match &self.bucket {
            Some(b) => b.time_until(1, now)?,
            None => Duration::ZERO,
        };
        let w = match &self.window {
            Some(w) => w.time_until(1, now)?,
            None => Duration::ZERO,
        };
        Some(b.max(w))
    }

    /// What is left at `now`, without taking or changing anything: the
    /// bucket's tokens and the window's remaining admissions (for the status
    /// page, docs/reference/admin.md#status-page).
    pub fn peek(&self, now: Now) -> Left {
        Left {
            bucket_tokens: self.bucket.as_ref().map(|b| {
                let dt = now.saturating_sub(b.last).as_secs_f64();
                (b.tokens + dt * b.rps).min(b.burst)
            }),
            window_remaining: self.window.as_ref().map(|w| {
                let mut probe = w.clone();
                probe.advance(now);
                probe.limit.saturating_sub(probe.total)
            }),
        }
    }

    /// Updates the limits in place (config reload); tokens and counts survive
    /// (a smaller burst caps the tokens; a new period keeps the live count).
    pub fn set_params(&mut self, params: &RateLimitParams, now: Now) {
        self.bucket = match (self.bucket.take(), params.bucket) {
            (Some(mut b), Some((rps, burst))) => {
                b.set_rate(rps, burst);
                Some(b)
            }
            (None, Some((rps, burst))) => Some(TokenBucket::new(rps, burst, now)),
            (_, None) => None,
        };
        self.window = match (self.window.take(), params.window) {
            (Some(mut w), Some((limit, period))) => {
                w.set_limit(limit, period);
                Some(w)
            }
            (None, Some((limit, period))) => Some(SlidingWindow::new(limit, period, now)),
            (_, None) => None,
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn params(
        bucket: Option<(f64, u32)>,
        window: Option<(u32, Duration)>,
        max_keys: usize,
    ) -> RateLimitParams {
        RateLimitParams::try_new(bucket, window, Some("header:x-tenant"), max_keys, ms(0)).unwrap()
    }

    #[test]
    fn bucket_burst_then_refill() {
        let mut b = TokenBucket::new(10.0, 5, ms(0));
        assert_eq!((0..10).filter(|_| b.try_take(1, ms(0))).count(), 5);
        assert_eq!(
            b.time_until(1, ms(0)),
            Some(ms(100) + Duration::from_micros(1))
        );
        assert!(!b.try_take(1, ms(99)));
        assert!(b.try_take(1, ms(101)));
        assert_eq!(b.time_until(6, ms(101)), None);
        assert!(b.time_until(5, ms(101)).is_some());
    }

    #[test]
    fn a_token_given_back_is_there_again() {
        let params = RateLimitParams::try_new(
            Some((5.0, 5)),
            Some((5, ms(1000))),
            None,
            10,
            Duration::ZERO,
        )
        .unwrap();
        let mut l = Limiter::new(&params, ms(0));
        for _ in 0..5 {
            assert!(l.try_acquire(ms(0)));
        }
        assert!(!l.try_acquire(ms(0)));
        // Five refused by weir afterwards: all five are there again.
        for _ in 0..5 {
            l.give_back();
        }
        assert_eq!((0..10).filter(|_| l.try_acquire(ms(1))).count(), 5);
        // Never above the burst, never below an empty window.
        let mut fresh = Limiter::new(&params, ms(0));
        fresh.give_back();
        assert_eq!((0..10).filter(|_| fresh.try_acquire(ms(0))).count(), 5);
    }

    #[test]
    fn bucket_waiting_time_until_is_enough() {
        let mut b = TokenBucket::new(3.0, 2, ms(0));
        assert!(b.try_take(2, ms(0)));
        let wait = b.time_until(2, ms(7)).unwrap();
        assert!(b.try_take(2, ms(7) + wait));
    }

    #[test]
    fn bucket_clock_stepping_back_creates_nothing() {
        let mut b = TokenBucket::new(10.0, 1, ms(1_000));
        assert!(b.try_take(1, ms(1_000)));
        assert!(!b.try_take(1, ms(0)));
        assert!(!b.try_take(1, ms(1_050)));
        assert_eq!(
            b.time_until(1, ms(900)),
            Some(ms(200) + Duration::from_micros(1))
        );
        assert!(b.try_take(1, ms(1_100)));
    }

    #[test]
    fn window_never_over_admits() {
        let mut w = SlidingWindow::new(3, ms(1_000), ms(0));
        assert!(w.try_take(1, ms(0)));
        assert!(w.try_take(1, ms(500)));
        assert!(w.try_take(1, ms(999)));
        assert!(!w.try_take(1, ms(1_050)));
        // the admission at 0 is forgotten once its sub-bucket's end is 1 s old
        assert_eq!(w.time_until(1, ms(1_050)), Some(ms(50)));
        assert!(w.try_take(1, ms(1_100)));
        assert!(!w.try_take(1, ms(1_200)));
        assert_eq!(w.time_until(4, ms(1_200)), None);
    }

    #[test]
    fn window_clock_stepping_back_creates_nothing() {
        let mut w = SlidingWindow::new(1, ms(1_000), ms(5_000));
        assert!(w.try_take(1, ms(5_000)));
        assert!(!w.try_take(1, ms(0)));
        assert!(!w.try_take(1, ms(5_999)));
        assert!(w.try_take(1, ms(6_100)));
    }

    #[test]
    fn limiter_needs_both_and_takes_from_neither_on_refusal() {
        let p = params(Some((1.0, 2)), Some((1, ms(1_000))), 10);
        let mut l = Limiter::new(&p, ms(0));
        assert!(l.try_acquire(ms(0)));
        // window refuses: the bucket keeps its second token
        assert!(!l.try_acquire(ms(0)));
        assert_eq!(l.time_until(ms(0)), Some(ms(1_100)));
        assert!(l.try_acquire(ms(1_100)));
        let b = l.bucket.as_mut().unwrap();
        assert!(b.available(ms(1_100)) >= 1.0);
    }

    #[test]
    fn peek_reads_what_is_left_and_changes_nothing() {
        let p = params(Some((10.0, 5)), Some((3, ms(1_000))), 10);
        let mut l = Limiter::new(&p, ms(0));
        assert!(l.try_acquire(ms(0)));
        assert!(l.try_acquire(ms(0)));
        let left = l.peek(ms(100));
        assert!((left.bucket_tokens.unwrap() - 4.0).abs() < 1e-9, "{left:?}");
        assert_eq!(left.window_remaining, Some(1));
        assert_eq!(l.peek(ms(100)), left);
        // after a full period the window has forgotten both admissions
        assert_eq!(l.peek(ms(1_200)).window_remaining, Some(3));
        assert!(l.try_acquire(ms(100)));
        assert_eq!(l.peek(ms(100)).window_remaining, Some(0));
    }
}
