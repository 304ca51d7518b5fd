//! The retry budget (docs/reference/budget.md#retry-budget): the retry-storm defence.
//!
//! Owns [`RetryBudget`], shaped like Finagle's / tower's `TpsBudget`: first
//! attempts deposit `ratio` tokens, retries withdraw `1` (or `timeout_cost`),
//! deposits and withdrawals both expire after `ttl`, and a constant reserve of
//! `min_per_sec × ttl` tokens lets a quiet upstream still retry. It must not
//! read a clock or sleep: `now` is passed in, and a `now` earlier than one
//! already seen is treated as the latest one seen (a clock stepping back never
//! expires a withdrawal early, so it never creates tokens).

use super::{Now, PolicyError};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetParams {
    /// Tokens deposited by every first attempt.
    pub ratio: f64,
    /// Retries per second always allowed, whatever the deposits.
    pub min_per_sec: u32,
    /// How long a deposit lasts.
    pub ttl: Duration,
    /// Tokens a retry after an uncertain timeout withdraws.
    pub timeout_cost: u32,
}

impl BudgetParams {
    /// Validates budget parameters: `ratio` finite in `[0, 1000]`, `ttl`
    /// between 1 s and 60 s, `timeout_cost ≥ 1`.
    pub fn try_new(
        ratio: f64,
        min_per_sec: u32,
        ttl: Duration,
        timeout_cost: u32,
    ) -> Result<Self, PolicyError> {
        if !ratio.is_finite() || !(0.0..=1000.0).contains(&ratio) {
            return Err(PolicyError::new(
                "ratio",
                format!("must be a finite number ≥ 0, got {ratio}"),
            ));
        }
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(PolicyError::new(
                "ttl",
                format!("must be between 1s and 60s, got {ttl:?}"),
            ));
        }
        if timeout_cost == 0 {
            return Err(PolicyError::new("timeout_cost", "must be at least 1"));
        }
        Ok(BudgetParams {
            ratio,
            min_per_sec,
            ttl,
            timeout_cost,
        })
    }
}

/// How many time slots one `ttl` is divided into. An entry expires between
/// `ttl − ttl/SLOTS` and `ttl` after it was written.
pub const SLOTS: usize = 10;

/// Tokens are kept as integer milli-tokens so sums never drift.
const MILLI: i64 = 1000;

/// One upstream's retry budget. Cheap: a fixed ring of [`SLOTS`] counters and
/// a running sum, so every operation is O(1) amortised.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    params: BudgetParams,
    /// Net milli-tokens written in each slot (deposits minus withdrawals).
    slots: [i64; SLOTS],
    /// Sum of `slots`.
    sum: i64,
    /// Absolute index (`now / slot_width`) of the newest slot.
    head: u64,
    /// The latest `now` seen.
    last: Now,
    slot_nanos: u64,
    deposit: i64,
    reserve: i64,
}

impl RetryBudget {
    /// A fresh budget: nothing deposited, the `min_per_sec` reserve available.
    pub fn new(params: BudgetParams, now: Now) -> Self {
        let mut b = RetryBudget {
            slots: [0; SLOTS],
            sum: 0,
            head: 0,
            last: now,
            slot_nanos: 1,
            deposit: 0,
            reserve: 0,
            params,
        };
        b.derive();
        b.head = b.slot_of(now);
        b
    }

    /// The parameters in force.
    pub fn params(&self) -> &BudgetParams {
        &self.params
    }

    fn derive(&mut self) {
        let ttl_ms = i64::try_from(self.params.ttl.as_millis()).unwrap_or(i64::MAX);
        self.slot_nanos = u64::try_from(self.params.ttl.as_nanos() / SLOTS as u128)
            .unwrap_or(u64::MAX)
            .max(1);
        // `ratio` is validated ≤ 1000, so this fits comfortably.
        self.deposit = (self.params.ratio * MILLI as f64).round() as i64;
        // min_per_sec × ttl tokens, in milli-tokens: min_per_sec × ttl_ms.
        self.reserve = i64::from(self.params.min_per_sec).saturating_mul(ttl_ms);
    }

    /// Updates the parameters in place (config reload). Live deposits and
    /// withdrawals survive; if `ttl` changed they are all kept in the newest
    /// slot, so they expire one new `ttl` from now — never earlier.
    pub fn set_params(&mut self, params: BudgetParams) {
        let ttl_changed = params.ttl != self.params.ttl;
        self.params = params;
        self.derive();
        if ttl_changed {
            self.slots = [0; SLOTS];
            self.head = self.slot_of(self.last);
            self.slots[self.index(self.head)] = self.sum;
        }
    }

    fn slot_of(&self, now: Now) -> u64 {
        u64::try_from(now.as_nanos() / u128::from(self.slot_nanos)).unwrap_or(u64::MAX)
    }

    fn index(&self, abs: u64) -> usize {
        (abs % SLOTS as u64) as usize
    }

    /// Moves the ring forward to `now`, expiring slots older than `ttl`.
    fn advance(&mut self, now: Now) {
        if now <= self.last {
            return; // a clock stepping back expires nothing
        }
        self.last = now;
        let target = self.slot_of(now);
        if target <= self.head {
            return;
        }
        if target - self.head >= SLOTS as u64 {
            self.slots = [0; SLOTS];
            self.sum = 0;
        } else {
            for abs in self.head + 1..=target {
                let i = self.index(abs);
                self.sum -= self.slots[i];
                self.slots[i] = 0;
            }
        }
        self.head = target;
    }

    fn put(&mut self, milli: i64) {
        let i = self.index(self.head);
        self.slots[i] += milli;
        self.sum += milli;
    }

    /// A first attempt was made: deposit `ratio` tokens.
    pub fn deposit(&mut self, now: Now) {
        self.advance(now);
        self.put(self.deposit);
    }

    /// A retry wants to go: withdraw `cost` tokens if the balance (reserve
    /// included) covers them. Returns whether the retry may go.
    pub fn try_withdraw(&mut self, cost: u32, now: Now) -> bool {
        self.advance(now);
        let cost = i64::from(cost) * MILLI;
        if self.reserve + self.sum >= cost {
            self.put(-cost);
            true
        } else {
            false
        }
    }

    /// The tokens available now, reserve included: the value of the
    /// `weir_retry_budget_tokens` gauge.
    pub fn balance(&mut self, now: Now) -> f64 {
        self.advance(now);
        (self.reserve + self.sum) as f64 / MILLI as f64
    }

    /// The cost of a retry: `timeout_cost` after an uncertain per-try timeout,
    /// else 1.
    pub fn cost(&self, after_timeout: bool) -> u32 {
        if after_timeout {
            self.params.timeout_cost
        } else {
            1
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params(ratio: f64, min_per_sec: u32) -> BudgetParams {
        BudgetParams::try_new(ratio, min_per_sec, Duration::from_secs(10), 2).unwrap()
    }

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn ratio_of_first_attempts() {
        let mut b = RetryBudget::new(params(0.1, 0), s(0.0));
        assert!(!b.try_withdraw(1, s(0.0)));
        for _ in 0..100 {
            b.deposit(s(1.0));
        }
        let ok = (0..100).filter(|_| b.try_withdraw(1, s(1.0))).count();
        assert_eq!(ok, 10);
    }

    #[test]
    fn reserve_allows_a_quiet_upstream_to_retry() {
        let mut b = RetryBudget::new(params(0.1, 1), s(0.0));
        assert_eq!(b.balance(s(0.0)), 10.0);
        let ok = (0..50).filter(|_| b.try_withdraw(1, s(0.5))).count();
        assert_eq!(ok, 10);
        // the withdrawals expire after ttl and the reserve is whole again
        assert_eq!(b.balance(s(10.6)), 10.0);
    }

    #[test]
    fn deposits_expire_after_ttl() {
        let mut b = RetryBudget::new(params(1.0, 0), s(0.0));
        b.deposit(s(0.0));
        assert_eq!(b.balance(s(8.9)), 1.0);
        assert_eq!(b.balance(s(10.0)), 0.0);
        assert!(!b.try_withdraw(1, s(10.0)));
    }

    #[test]
    fn timeout_costs_more() {
        let mut b = RetryBudget::new(params(1.0, 0), s(0.0));
        b.deposit(s(0.0));
        assert_eq!(b.cost(true), 2);
        assert!(!b.try_withdraw(b.cost(true), s(0.0)));
        assert!(b.try_withdraw(b.cost(false), s(0.0)));
    }

    #[test]
    fn clock_stepping_back_creates_nothing() {
        let mut b = RetryBudget::new(params(0.0, 1), s(100.0));
        let ok = (0..20).filter(|_| b.try_withdraw(1, s(100.0))).count();
        assert_eq!(ok, 10);
        // back in time, then forward to just before the withdrawals expire
        assert!(!b.try_withdraw(1, s(1.0)));
        assert!(!b.try_withdraw(1, s(108.9)));
        assert!(b.try_withdraw(1, s(110.0)));
    }

    #[test]
    fn set_params_keeps_live_state() {
        let mut b = RetryBudget::new(params(1.0, 0), s(0.0));
        b.deposit(s(0.0));
        b.deposit(s(0.0));
        b.set_params(BudgetParams::try_new(0.5, 0, Duration::from_secs(20), 3).unwrap());
        assert_eq!(b.balance(s(5.0)), 2.0);
        b.deposit(s(5.0));
        assert_eq!(b.balance(s(5.0)), 2.5);
        assert_eq!(b.cost(true), 3);
        assert_eq!(b.balance(s(25.0)), 0.0);
    }
}
