//! A fleet-wide token bucket spent locally (docs/reference/fleet.md#fleet-state):
//! the bucket itself lives in the shared state (`src/state/fleet/limiter.rs`, one
//! atomic Lua script), and each instance *leases* tokens from it in batches
//! and spends them here, so that admission never waits on the shared state
//! and the shared state sees a small fraction of the requests.
//!
//! Owns [`LeasedBucket`] (the local stock, the credit, when to fetch more and
//! how much), [`batch_size`] and the fallback while the shared state is away
//! ([`fallback_bucket`]). Pure like the rest of `policy`: `now` is passed in,
//! and the fetch itself is the caller's (it asks [`LeasedBucket::want`], runs
//! the script in the background, and reports [`LeasedBucket::granted`] or
//! [`LeasedBucket::failed`]).
//!
//! **The bound.** Let `b` be an instance's batch. Its position — leased
//! tokens held unspent, minus tokens admitted on credit and not yet repaid —
//! stays within `[−⌈b/4⌉, b + ⌈b/4⌉)`: it fetches when its stock falls
//! below `⌈b/4⌉` (one fetch at a time), and borrows at most `⌈b/4⌉` ahead
//! of a grant. Over any window, the fleet's admissions differ from what the
//! shared bucket granted in that window by at most the swing of the
//! positions, `Σ 1.5·b` over the instances, plus (on the low side only)
//! leased tokens that expired unspent ([`LEASE`] after they arrived). So
//! the fleet never admits more than the bucket's own bound (`burst + rps·T`
//! over any `T`) plus `1.5·b` per instance; with the default batch of 10,
//! three instances stay within 45 tokens of it. One exception: when a burst
//! spends an instance's stock and credit before its next lease is back,
//! and the fleet has not said its bucket is empty, the rest of the burst is
//! [`Take::Fallback`] — decided by the instance's local fallback limit, as
//! when the shared state is away — rather than refused for a round trip;
//! those admissions add at most the fallback bucket's own bound.
//!
//! **The cost.** A fetch asks for a whole batch, so while the fleet bucket
//! has tokens the shared state sees one command per `b` ≥ [`MIN_BATCH`]
//! admissions (≤ 0.1 per request). When it has none, a short grant holds
//! the next fetch off until the shortfall could have refilled *and* the
//! instance was asked for about a batch more requests, doubling (up to
//! [`MAX_STRETCH`] times) while grants stay short, never longer than
//! [`LEASE`]: an instance over its share makes at most one command per
//! batch of requests it is offered, or one a second when it is offered
//! fewer than a batch a second — never one per refused request.

use super::Now;
use std::collections::VecDeque;
use std::time::Duration;

/// The smallest batch (unless `burst` is smaller): the shared state sees at
/// most one command per this many admissions while it has tokens.
pub const MIN_BATCH: u32 = 10;

/// A batch covers about this long of the instance's own demand (above
/// [`MIN_BATCH`]): a busy instance fetches about ten times a second.
pub const BATCH_TIME: Duration = Duration::from_millis(100);

/// Leased tokens still unspent this long after they arrived are dropped, so
/// that an instance that went quiet cannot spend an old lease in a burst.
pub const LEASE: Duration = Duration::from_secs(1);

/// While the fleet bucket is ample (the last grant was whole and left at
/// least another [`ample_cap`] of tokens), a batch covers this long of the instance's
/// demand instead of [`BATCH_TIME`], at most [`ample_cap`] tokens: an
/// instance offered 20 requests a second fetches once in 3 s, not twice a
/// second. Precision matters when the bucket runs low, and then batches
/// are short again.
pub const AMPLE_BATCH_TIME: Duration = Duration::from_secs(3);

/// How long an ample batch lasts: [`AMPLE_BATCH_TIME`] and a [`LEASE`].
pub const AMPLE_LEASE: Duration = Duration::from_secs(4);

/// The largest ample batch for a bucket of `burst`: an eighth of it (at
/// least [`MIN_BATCH`], at most `burst`).
pub fn ample_cap(burst: u32) -> u32 {
    (burst / 8).max(MIN_BATCH).min(burst)
}

/// After a failed fetch, the next is no sooner than this.
pub const RETRY_AFTER_ERROR: Duration = Duration::from_millis(250);

/// Consecutive short grants stretch the wait before the next fetch up to
/// this many times the shortfall's refill time.
pub const MAX_STRETCH: u32 = 4;

/// The batch for a bucket of `rps` and `burst` when this instance is asked
/// for about `demand` tokens a second: [`BATCH_TIME`] of its demand (never
/// counting demand above `rps`), at least [`MIN_BATCH`], at most `burst`.
pub fn batch_size(rps: f64, burst: u32, demand: f64) -> u32 {
    let own = (demand.min(rps).max(0.0) * BATCH_TIME.as_secs_f64()).ceil();
    let b = own.max(f64::from(MIN_BATCH)).min(f64::from(burst));
    (b as u32).max(1)
}

/// The batch while the fleet bucket is ample: [`AMPLE_BATCH_TIME`] of the
/// demand (never counting demand above `rps`), at least [`batch_size`], at
/// most [`ample_cap`] (unless `batch_size` is larger).
pub fn ample_batch_size(rps: f64, burst: u32, demand: f64) -> u32 {
    let short = batch_size(rps, burst, demand);
    let own = (demand.min(rps).max(0.0) * AMPLE_BATCH_TIME.as_secs_f64()).ceil();
    let b = own.min(f64::from(ample_cap(burst))) as u32;
    b.max(short)
}

/// The token bucket an instance applies alone while the shared state is
/// away: `(rps, burst)` divided by `expected_instances` (burst rounded up,
/// at least 1), or the whole bucket when that is unset or 1.
pub fn fallback_bucket(rps: f64, burst: u32, expected_instances: Option<u32>) -> (f64, u32) {
    match expected_instances {
        Some(n) if n > 1 => (rps / f64::from(n), burst.div_ceil(n).max(1)),
        _ => (rps, burst),
    }
}

/// What [`LeasedBucket::take`] says about one admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Take {
    /// Admitted: a leased token, or credit repaid from the next grant.
    Admit,
    /// The fleet bucket is empty: refuse (429). A token may be there in
    /// `retry_in`.
    Refuse { retry_in: Duration },
    /// The shared state is away and the stock is spent: decide with the
    /// local fallback limiter ([`fallback_bucket`]).
    Fallback,
}

/// The shared state's answer to a fetch of `wanted` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub wanted: u32,
    pub granted: u32,
    /// When the shortfall (if any) could have refilled, as the script saw it.
    pub retry_in: Duration,
    /// Whole tokens left in the fleet bucket after this grant.
    pub left: u32,
}

#[derive(Debug, Clone, Copy)]
struct Lot {
    tokens: u32,
    expires: Now,
}

/// Admissions counted per second, for the batch size.
#[derive(Debug, Clone, Copy, Default)]
struct AdmissionRate {
    start: Now,
    this: u32,
    last: u32,
}

impl AdmissionRate {
    fn record(&mut self, now: Now) {
        let second = Duration::from_secs(1);
        if now >= self.start + second {
            self.last = if now < self.start + 2 * second {
                self.this
            } else {
                0
            };
            self.this = 0;
            self.start = now;
        }
        self.this = self.this.saturating_add(1);
    }

    /// Admissions asked for per second, about.
    fn rate(&self) -> f64 {
        f64::from(self.last.max(self.this))
    }

    /// The admissions asked for in the last whole second, once there was
    /// one (`None` while the meter is cold).
    fn settled(&self) -> Option<f64> {
        (self.last > 0).then(|| f64::from(self.last))
    }
}

/// One instance's side of a fleet-wide token bucket (see the module doc).
#[derive(Debug, Clone)]
pub struct LeasedBucket {
    rps: f64,
    burst: u32,
    lots: VecDeque<Lot>,
    debt: u32,
    fetching: bool,
    next_fetch: Now,
    /// The last grant was short: no credit until `next_fetch`.
    exhausted: bool,
    short_streak: u32,
    /// The last fetch failed: the shared state is away.
    failed: bool,
    /// The last grant was whole and left at least [`ample_cap`] tokens.
    ample: bool,
    meter: AdmissionRate,
}

impl LeasedBucket {
    /// An empty stock for a fleet bucket of `rps` and `burst`.
    pub fn new(rps: f64, burst: u32) -> Self {
        LeasedBucket {
            rps,
            burst: burst.max(1),
            lots: VecDeque::new(),
            debt: 0,
            fetching: false,
            next_fetch: Duration::ZERO,
            exhausted: false,
            short_streak: 0,
            failed: false,
            ample: false,
            meter: AdmissionRate::default(),
        }
    }

    /// New rates (a reload); the stock is kept.
    pub fn set_rate(&mut self, rps: f64, burst: u32) {
        self.rps = rps;
        self.burst = burst.max(1);
    }

    pub fn rate(&self) -> (f64, u32) {
        (self.rps, self.burst)
    }

    /// Leased tokens held now (expired ones included until the next take).
    pub fn stock(&self) -> u32 {
        self.lots.iter().map(|l| l.tokens).sum()
    }

    /// Tokens admitted on credit, to be repaid from the next grant.
    pub fn debt(&self) -> u32 {
        self.debt
    }

    /// Whether the last fetch failed (the shared state is away).
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// The batch size now ([`batch_size`] of the demand seen, or
    /// [`ample_batch_size`] while the fleet bucket is ample).
    pub fn batch(&self) -> u32 {
        match self.ample {
            true => ample_batch_size(self.rps, self.burst, self.meter.rate()),
            false => batch_size(self.rps, self.burst, self.meter.rate()),
        }
    }

    /// How long a lot granted now lasts.
    fn lot_life(&self) -> Duration {
        match self.ample {
            true => AMPLE_LEASE,
            false => LEASE,
        }
    }

    fn credit(&self) -> u32 {
        self.batch().div_ceil(4)
    }

    fn expire(&mut self, now: Now) {
        while self.lots.front().is_some_and(|l| l.expires <= now) {
            self.lots.pop_front();
        }
    }

    /// Asks for one admission at `now`. Never waits: a fetch, when one is
    /// due, is the caller's to start ([`LeasedBucket::want`]).
    pub fn take(&mut self, now: Now) -> Take {
        self.meter.record(now);
        self.expire(now);
        if let Some(lot) = self.lots.front_mut() {
            lot.tokens -= 1;
            if lot.tokens == 0 {
                self.lots.pop_front();
            }
            return Take::Admit;
        }
        if self.failed {
            return Take::Fallback;
        }
        if self.exhausted && now >= self.next_fetch {
            self.exhausted = false;
        }
        if !self.exhausted && self.debt < self.credit() {
            self.debt += 1;
            return Take::Admit;
        }
        if !self.exhausted {
            // Stock and credit are spent before a lease came back, but the
            // fleet has not said its bucket is empty: a burst beyond what
            // was leased is not refused for Redis's round trip. The local
            // fallback limit decides it, as when Redis is away.
            return Take::Fallback;
        }
        let per_token = Duration::try_from_secs_f64(1.0 / self.rps).unwrap_or(LEASE);
        Take::Refuse {
            retry_in: self.next_fetch.saturating_sub(now).max(per_token),
        }
    }

    /// Gives back an admission [`LeasedBucket::take`] made for a request
    /// weir then refused itself: a debt is forgiven first, else the token
    /// goes back into the stock (lasting one more lease at most).
    pub fn give_back(&mut self, now: Now) {
        if self.debt > 0 {
            self.debt -= 1;
            return;
        }
        match self.lots.front_mut() {
            Some(lot) => lot.tokens += 1,
            None => self.lots.push_back(Lot {
                tokens: 1,
                expires: now + LEASE,
            }),
        }
    }

    /// The tokens to fetch now, if a fetch is due: none in flight, not held
    /// off, and the stock below a quarter batch (or credit to repay). The
    /// fetch is then taken as started; report its end with
    /// [`LeasedBucket::granted`] or [`LeasedBucket::failed`].
    pub fn want(&mut self, now: Now) -> Option<u32> {
        if self.fetching || now < self.next_fetch {
            return None;
        }
        self.expire(now);
        let b = self.batch();
        if self.stock() >= b.div_ceil(4) && self.debt == 0 {
            return None;
        }
        self.fetching = true;
        Some((b + self.debt).min(self.burst))
    }

    /// A fetch answered at `now`: credit is repaid first, the rest is stock
    /// for [`LEASE`]. A short grant holds the next fetch off (see the
    /// module doc).
    pub fn granted(&mut self, now: Now, g: Grant) {
        self.fetching = false;
        self.failed = false;
        let repay = g.granted.min(self.debt);
        self.debt -= repay;
        let rest = g.granted - repay;
        self.ample = g.granted >= g.wanted && g.left >= ample_cap(self.burst);
        if rest > 0 {
            self.lots.push_back(Lot {
                tokens: rest,
                expires: now + self.lot_life(),
            });
        }
        if g.granted >= g.wanted {
            self.exhausted = false;
            self.short_streak = 0;
            self.next_fetch = now;
        } else {
            self.exhausted = true;
            self.short_streak = (self.short_streak + 1).min(MAX_STRETCH);
            let secs = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(LEASE);
            // Until the shortfall could have refilled, and until this
            // instance was asked for about a batch more.
            let refill = secs(f64::from(g.wanted - g.granted) / self.rps);
            let asked = match self.meter.settled() {
                Some(rate) => secs(f64::from(self.batch()) / rate),
                None => Duration::ZERO,
            };
            let wait = g.retry_in.max(refill).max(asked) * self.short_streak;
            self.next_fetch = now + wait.min(LEASE);
        }
    }

    /// A fetch failed (the shared state is slow or down) at `now`: the
    /// stock is still spent, then [`Take::Fallback`] until a fetch succeeds;
    /// the next fetch is no sooner than [`RETRY_AFTER_ERROR`].
    pub fn failed(&mut self, now: Now) {
        self.fetching = false;
        self.failed = true;
        self.next_fetch = now + RETRY_AFTER_ERROR;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn grant(wanted: u32, granted: u32) -> Grant {
        Grant {
            wanted,
            granted,
            retry_in: Duration::ZERO,
            left: 0,
        }
    }

    #[test]
    fn batch_is_a_tenth_of_a_second_of_demand_within_bounds() {
        assert_eq!(batch_size(100.0, 100, 0.0), MIN_BATCH);
        assert_eq!(batch_size(100.0, 100, 50.0), MIN_BATCH);
        assert_eq!(batch_size(10_000.0, 10_000, 3_000.0), 300);
        // Demand above the fleet's rate counts as the rate.
        assert_eq!(batch_size(1_000.0, 1_000, 1e9), 100);
        // Never above burst.
        assert_eq!(batch_size(5.0, 5, 100.0), 5);
        assert_eq!(batch_size(0.5, 1, 1.0), 1);
    }

    #[test]
    fn fallback_is_a_share_or_the_whole() {
        assert_eq!(fallback_bucket(100.0, 100, None), (100.0, 100));
        assert_eq!(fallback_bucket(100.0, 100, Some(1)), (100.0, 100));
        assert_eq!(fallback_bucket(100.0, 100, Some(3)), (100.0 / 3.0, 34));
        assert_eq!(fallback_bucket(1.0, 1, Some(50)), (0.02, 1));
    }

    #[test]
    fn first_admissions_ride_on_credit_until_the_first_grant() {
        let mut b = LeasedBucket::new(100.0, 100);
        let now = ms(0);
        // Credit: a quarter batch (⌈10/4⌉ = 3).
        for _ in 0..3 {
            assert_eq!(b.take(now), Take::Admit);
        }
        // Past the credit, with the fleet not known to be short: the local
        // fallback limit decides (a burst is not refused for a round trip).
        assert_eq!(b.take(now), Take::Fallback);
        // A batch plus the debt, once.
        assert_eq!(b.want(now), Some(13));
        assert_eq!(b.want(now), None, "one fetch at a time");
        b.granted(ms(1), grant(13, 13));
        assert_eq!((b.debt(), b.stock()), (0, 10));
        for _ in 0..7 {
            assert_eq!(b.take(ms(2)), Take::Admit);
        }
        assert_eq!(b.want(ms(2)), None, "3 left: not below a quarter batch");
        assert_eq!(b.take(ms(2)), Take::Admit);
        assert_eq!(b.want(ms(2)), Some(10));
    }

    #[test]
    fn a_short_grant_refuses_and_holds_the_next_fetch_off() {
        let mut b = LeasedBucket::new(100.0, 100);
        // A second at 100 rps with the fleet bucket full: every fetch whole.
        for i in 0..100 {
            assert_eq!(b.take(ms(i * 10)), Take::Admit);
            if let Some(w) = b.want(ms(i * 10)) {
                b.granted(ms(i * 10), grant(w, w));
            }
        }
        let t = ms(1000);
        while b.take(t) == Take::Admit {}
        // Stock and credit (a quarter batch) spent; a batch and the debt.
        assert_eq!((b.stock(), b.debt()), (0, 3));
        assert_eq!(b.want(t), Some(13));
        b.granted(t, grant(13, 3));
        // The grant repaid the credit; the bucket is empty: no more credit.
        assert_eq!((b.debt(), b.stock()), (0, 0));
        let Take::Refuse { retry_in } = b.take(t + ms(2)) else {
            panic!("refused expected")
        };
        // The shortfall, 10 tokens at 100 rps, refills in 100 ms (and a
        // batch of requests arrives in as long).
        assert_eq!(retry_in, ms(98));
        assert_eq!(b.want(t + ms(50)), None);
        assert_eq!(b.want(t + ms(100)), Some(10));
        b.granted(t + ms(101), grant(10, 0));
        // Twice as long the second time.
        assert_eq!(b.want(t + ms(250)), None);
        assert!(matches!(b.take(t + ms(250)), Take::Refuse { .. }));
        assert_eq!(b.want(t + ms(301)), Some(10));
        b.granted(t + ms(302), grant(10, 10));
        assert_eq!(b.take(t + ms(303)), Take::Admit);
    }

    #[test]
    fn a_quiet_instance_refused_asks_again_within_a_lease() {
        let mut b = LeasedBucket::new(100.0, 100);
        // A second with one request a second.
        b.take(ms(0));
        assert_eq!(b.want(ms(0)), Some(11));
        b.granted(ms(1), grant(11, 11));
        b.take(ms(1000));
        b.take(ms(1100));
        let w = b.want(ms(1100)).unwrap_or(0);
        b.granted(ms(1101), grant(w.max(10), 0));
        // A batch of requests would take 10 s: held off for a lease (1 s).
        assert_eq!(b.want(ms(2000)), None);
        assert!(matches!(b.take(ms(2000)), Take::Refuse { .. }));
        // A batch and the credit taken at 1.1 s.
        assert_eq!(b.want(ms(2101)), Some(11));
    }

    #[test]
    fn a_cold_instance_refused_asks_again_when_the_shortfall_refilled() {
        let mut b = LeasedBucket::new(100.0, 100);
        b.take(ms(0));
        assert_eq!(b.want(ms(0)), Some(11));
        b.granted(ms(1), grant(11, 1));
        // No whole second seen yet: the refill of 10 tokens, 100 ms.
        assert_eq!(b.want(ms(100)), None);
        assert_eq!(b.want(ms(101)), Some(10));
    }

    #[test]
    fn failure_spends_the_stock_then_falls_back_until_a_grant() {
        let mut b = LeasedBucket::new(100.0, 100);
        b.take(ms(0));
        let w = b.want(ms(0)).unwrap();
        b.granted(ms(1), grant(w, w));
        for _ in 0..8 {
            b.take(ms(2));
        }
        assert_eq!(b.want(ms(2)), Some(10));
        b.failed(ms(7));
        assert!(b.is_failed());
        for _ in 0..2 {
            assert_eq!(b.take(ms(8)), Take::Admit);
        }
        assert_eq!(b.take(ms(8)), Take::Fallback);
        assert_eq!(b.want(ms(100)), None, "held off after an error");
        assert_eq!(b.want(ms(257)), Some(10));
        b.granted(ms(258), grant(10, 10));
        assert!(!b.is_failed());
        assert_eq!(b.take(ms(259)), Take::Admit);
    }

    #[test]
    fn an_ample_bucket_is_leased_in_long_batches() {
        // A fleet bucket of 30,000 rps and burst 2,000; this instance is
        // offered 20 a second. Short batches while the bucket's level is
        // unknown, then 3 s of demand (60) while grants leave it ample.
        assert_eq!(ample_cap(2000), 250);
        assert_eq!(ample_batch_size(30_000.0, 2000, 20.0), 60);
        assert_eq!(
            ample_batch_size(30_000.0, 2000, 1e6),
            2000,
            "a busy instance's short batch is larger"
        );
        assert_eq!(
            ample_batch_size(100.0, 100, 50.0),
            12,
            "an eighth of the burst"
        );
        assert_eq!(ample_batch_size(100.0, 100, 0.0), MIN_BATCH);
        let mut b = LeasedBucket::new(30_000.0, 2000);
        let mut fetches = 0;
        let mut t = 0;
        while t < 30_000 {
            let now = ms(t);
            assert_eq!(b.take(now), Take::Admit, "at {t} ms");
            if let Some(w) = b.want(now) {
                fetches += 1;
                b.granted(
                    now + ms(1),
                    Grant {
                        left: 1900,
                        ..grant(w, w)
                    },
                );
            }
            t += 50;
        }
        // 600 admissions: a first batch of 10, then about one of 60 every 3 s.
        assert!((10..=13).contains(&fetches), "{fetches} fetches");
        assert_eq!(b.batch(), 60);
        // A grant that leaves the bucket low brings short batches back.
        let w = loop {
            t += 50;
            b.take(ms(t));
            if let Some(w) = b.want(ms(t)) {
                break w;
            }
        };
        b.granted(
            ms(t + 1),
            Grant {
                left: 249,
                ..grant(w, w)
            },
        );
        assert_eq!(b.batch(), MIN_BATCH);
        // An ample lot lasts AMPLE_LEASE, a short one LEASE.
        let mut c = LeasedBucket::new(30_000.0, 2000);
        c.take(ms(0));
        let w = c.want(ms(0)).unwrap();
        c.granted(
            ms(0),
            Grant {
                left: 1990,
                ..grant(w, w)
            },
        );
        assert_eq!(c.stock(), 10);
        c.take(ms(3_999));
        assert_eq!(c.stock(), 9);
        c.take(ms(4_000));
        assert_eq!((c.stock(), c.debt()), (0, 1), "expired after 4 s");
    }

    #[test]
    fn leased_tokens_expire() {
        let mut b = LeasedBucket::new(100.0, 100);
        b.take(ms(0));
        let w = b.want(ms(0)).unwrap();
        b.granted(ms(0), grant(w, w));
        assert_eq!(b.stock(), 10);
        // A second later the lease is gone; credit admits, and a fetch is due.
        assert_eq!(b.take(ms(1000)), Take::Admit);
        assert_eq!((b.stock(), b.debt()), (0, 1));
        assert_eq!(b.want(ms(1000)), Some(11));
    }

    /// The shared bucket as the Lua script keeps it.
    struct Remote {
        rps: f64,
        burst: f64,
        tokens: f64,
        last: Now,
        calls: u32,
    }

    impl Remote {
        fn grant(&mut self, want: u32, now: Now) -> Grant {
            self.calls += 1;
            let dt = now.saturating_sub(self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rps).min(self.burst);
            self.last = self.last.max(now);
            let want = want.min(self.burst as u32);
            let granted = (self.tokens.floor() as u32).min(want);
            self.tokens -= f64::from(granted);
            let short = f64::from(want - granted) - self.tokens;
            let retry_in = Duration::from_secs_f64((short / self.rps).max(0.0));
            Grant {
                wanted: want,
                granted,
                retry_in,
                left: self.tokens.floor() as u32,
            }
        }
    }

    /// `n` instances each offered `offered` rps (evenly spaced, offset from
    /// each other) for `secs` against one remote bucket of 100 rps (burst
    /// 100), fetches answered 1 ms later: (admitted, remote calls, offered).
    fn simulate(n: u64, offered: u64, secs: u64) -> (u64, u32, u64) {
        let mut remote = Remote {
            rps: 100.0,
            burst: 100.0,
            tokens: 100.0,
            last: Duration::ZERO,
            calls: 0,
        };
        let mut buckets: Vec<LeasedBucket> =
            (0..n).map(|_| LeasedBucket::new(100.0, 100)).collect();
        let mut pending: Vec<Option<(Now, u32)>> = vec![None; n as usize];
        let step = 1_000_000 / offered;
        let mut next: Vec<u64> = (0..n).map(|i| i * step / n).collect();
        let (mut admitted, mut asked) = (0, 0);
        let end = secs * 1_000_000;
        let mut t = 0;
        while t < end {
            let now = Duration::from_micros(t);
            for i in 0..n as usize {
                if let Some((at, want)) = pending[i].filter(|(at, _)| now >= *at) {
                    let g = remote.grant(want, at);
                    buckets[i].granted(at, g);
                    pending[i] = None;
                }
                if t >= next[i] {
                    next[i] += step;
                    asked += 1;
                    if buckets[i].take(now) == Take::Admit {
                        admitted += 1;
                    }
                    if let Some(w) = buckets[i].want(now) {
                        pending[i] = Some((now + ms(1), w));
                    }
                }
            }
            t += 100;
        }
        (admitted, remote.calls, asked)
    }

    #[test]
    fn a_fleet_offered_more_than_its_limit_holds_it_cheaply() {
        // Three instances offered 100 rps each, ten offered 100, three
        // offered 1000: the shared bucket allows burst + rps·T = 1100; the
        // fleet's positions swing by at most 1.5 of the largest batch (an
        // ample one: 12 of a burst of 100) per instance.
        for (n, offered) in [(3, 100), (10, 100), (3, 1000)] {
            let (admitted, calls, asked) = simulate(n, offered, 10);
            let bound = u64::from(ample_cap(100)) * 3 / 2 * n;
            assert!(
                (1100 - bound..=1100 + bound).contains(&admitted),
                "{n} × {offered}: {admitted}"
            );
            assert!(
                f64::from(calls) <= 0.1 * asked as f64,
                "{n} × {offered}: {calls} calls for {asked} requests"
            );
        }
    }

    #[test]
    fn a_fleet_under_its_limit_is_never_refused_and_costs_a_tenth() {
        let (admitted, calls, asked) = simulate(3, 30, 10);
        assert_eq!(admitted, asked);
        assert!(
            f64::from(calls) <= 0.1 * admitted as f64 + 3.0,
            "{calls} calls for {admitted} admissions"
        );
    }
}
