//! `weir chaos catalogue-outage`: a read-mostly dependency (a catalogue)
//! that goes away for a while, and weir's response cache in front of it.
//!
//! The client reads [`KEYS`] distinct keys, `/item/1` … `/item/200`, in a
//! Zipf pattern (key `k` read in proportion to 1/k^[`ZIPF_S`]), drawn with
//! the scenario's seed, so every column reads the same keys in the same
//! order. The upstream answers every read with `Cache-Control:`
//! [`CACHE_CONTROL`] — its own word on how long an answer stays good and
//! how long it may stand in for an error — and refuses connections for 5 s
//! mid-run. weir's column runs with the cache on (`enabled = true`) and
//! nothing else: every freshness and staleness figure is the upstream's.
//!
//! The rows of its own: how many keys were answered before the outage,
//! the success of the reads sent during it for those keys and for the
//! others, and upstream requests per client request before it.

use super::driver::RequestRecord;
use super::{Column, Scenario, ScenarioReport};
use crate::policy::{Random, SeededRandom};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Distinct keys the client reads.
pub const KEYS: u32 = 200;
/// The Zipf exponent: key `k` is read in proportion to 1/k^s.
pub const ZIPF_S: f64 = 1.0;
/// What the upstream says of every 2xx.
pub const CACHE_CONTROL: &str = "max-age=1, stale-if-error=60";

/// Draws ranks `1..=n` with probability proportional to 1/k^s.
#[derive(Debug, Clone)]
pub struct Zipf {
    /// The cumulative distribution: `cdf[k - 1]` = P(rank ≤ k).
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: u32, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                acc += 1.0 / f64::from(k).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// One rank, from one uniform draw of `rng`.
    pub fn sample(&self, rng: &mut impl Random) -> u32 {
        let u = rng.next_f64();
        let i = self
            .cdf
            .partition_point(|c| *c <= u)
            .min(self.cdf.len() - 1);
        i as u32 + 1
    }
}

/// The keys of a run of `requests` reads, by request id (`Load::keys`):
/// `None` but for this scenario.
pub fn keys(scenario: Scenario, seed: u64, requests: usize) -> Option<Arc<[u32]>> {
    if scenario != Scenario::CatalogueOutage {
        return None;
    }
    let zipf = Zipf::new(KEYS, ZIPF_S);
    let mut rng = SeededRandom::new(seed);
    Some((0..requests).map(|_| zipf.sample(&mut rng)).collect())
}

/// What one column's client saw of the outage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OutageReads {
    /// Distinct keys read in the whole run.
    pub keys_read: u64,
    /// Reads sent before the outage began.
    pub reads_before: u64,
    /// Keys answered 2xx before the outage began (what a cache could hold).
    pub seen: u64,
    /// Reads sent during the outage for those keys, and how many got a 2xx.
    pub seen_reads: u64,
    pub seen_ok: u64,
    /// Reads sent during the outage for the other keys, and their 2xx.
    pub new_reads: u64,
    pub new_ok: u64,
}

impl OutageReads {
    /// Success of the reads during the outage of keys answered before it, %.
    pub fn seen_success(&self) -> f64 {
        pct(self.seen_ok, self.seen_reads)
    }

    pub fn new_success(&self) -> f64 {
        pct(self.new_ok, self.new_reads)
    }
}

fn pct(n: u64, of: u64) -> f64 {
    if of == 0 {
        return 0.0;
    }
    n as f64 * 100.0 / of as f64
}

/// The reads of `records` around an outage from `down` to `back`: a key
/// counts as seen when a read of it was answered 2xx by `down`; a read is
/// during the outage when it was sent in `[down, back)`.
pub fn outage_reads(records: &[RequestRecord], down: Duration, back: Duration) -> OutageReads {
    let all: BTreeSet<u32> = records.iter().filter_map(|r| r.key).collect();
    let seen: BTreeSet<u32> = records
        .iter()
        .filter(|r| r.ok && r.start + r.latency <= down)
        .filter_map(|r| r.key)
        .collect();
    let mut o = OutageReads {
        keys_read: all.len() as u64,
        reads_before: records.iter().filter(|r| r.start < down).count() as u64,
        seen: seen.len() as u64,
        ..OutageReads::default()
    };
    for r in records.iter().filter(|r| r.start >= down && r.start < back) {
        let Some(k) = r.key else { continue };
        if seen.contains(&k) {
            o.seen_reads += 1;
            o.seen_ok += u64::from(r.ok);
        } else {
            o.new_reads += 1;
            o.new_ok += u64::from(r.ok);
        }
    }
    o
}

/// `c`'s reads around the scenario's outage (on `c`'s timeline): `None`
/// but for this scenario.
pub fn reads(r: &ScenarioReport, c: &Column) -> Option<OutageReads> {
    if r.scenario != Scenario::CatalogueOutage {
        return None;
    }
    let back = c.back?;
    let len = r.scenario.profile().outages.last().map(|(_, l)| *l)?;
    Some(outage_reads(
        &c.observed.records,
        back.saturating_sub(len),
        back,
    ))
}

/// Requests that reached the upstream before the outage, per read sent
/// before it: the load on the upstream while it is up, cold cache included
/// (a ratio over the whole run would count the outage, when nothing
/// reaches it, in the cache's favour).
pub fn upstream_per_read(r: &ScenarioReport, c: &Column) -> Option<f64> {
    let o = reads(r, c)?;
    let before = c.upstream_before_outage?;
    (o.reads_before > 0).then(|| before as f64 / o.reads_before as f64)
}

/// This scenario's rows, as (label, one cell per column); none for the
/// others.
pub fn rows(r: &ScenarioReport) -> Vec<(String, Vec<String>)> {
    if r.scenario != Scenario::CatalogueOutage {
        return Vec::new();
    }
    let cell = |f: &dyn Fn(&Column, OutageReads) -> String| {
        r.columns
            .iter()
            .map(|c| f(c, reads(r, c).unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    vec![
        (
            "distinct keys read".into(),
            cell(&|_, o| o.keys_read.to_string()),
        ),
        (
            "keys answered before the outage".into(),
            cell(&|_, o| o.seen.to_string()),
        ),
        (
            "success during the outage, keys answered before it".into(),
            cell(&|_, o| format!("{}/{} ({:.2} %)", o.seen_ok, o.seen_reads, o.seen_success())),
        ),
        (
            "success during the outage, other keys".into(),
            cell(&|_, o| format!("{}/{} ({:.2} %)", o.new_ok, o.new_reads, o.new_success())),
        ),
        (
            "upstream requests per client request, before the outage".into(),
            cell(&|c, _| match upstream_per_read(r, c) {
                Some(x) => format!("{x:.3}"),
                None => "—".into(),
            }),
        ),
    ]
}

/// `c`'s figures of this scenario, for the JSON report.
pub fn json(r: &ScenarioReport, c: &Column) -> Option<serde_json::Value> {
    let o = reads(r, c)?;
    let mut v = serde_json::to_value(o).ok()?;
    v["seen_success_percent"] = o.seen_success().into();
    v["new_success_percent"] = o.new_success().into();
    v["upstream_requests_before_outage"] = c.upstream_before_outage.into();
    v["upstream_requests_per_client_request_before_outage"] = upstream_per_read(r, c).into();
    Some(v)
}

/// What the upstream and the client do, for under the table; `None` for
/// the other scenarios.
pub fn story(r: &ScenarioReport) -> Option<String> {
    if r.scenario != Scenario::CatalogueOutage {
        return None;
    }
    let (down, len) = r.scenario.profile().outages.last().copied()?;
    Some(format!(
        "the client reads {KEYS} keys (/item/1 … /item/{KEYS}) in a Zipf pattern (s = {ZIPF_S}); \
         the upstream answers every read with Cache-Control: {CACHE_CONTROL} and refuses \
         connections from {} s to {} s. A key counts as answered before the outage when a read \
         of it got a 2xx before the outage began; a read is during the outage when it was sent \
         in it. weir's column has its cache on and every freshness and staleness figure from the \
         upstream's Cache-Control.",
        down.as_secs(),
        (down + len).as_secs(),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn zipf_reads_rank_k_in_proportion_to_one_over_k() {
        let z = Zipf::new(KEYS, 1.0);
        let mut rng = SeededRandom::new(3);
        let mut n = vec![0u32; KEYS as usize + 1];
        let draws = 200_000;
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=KEYS).contains(&k));
            n[k as usize] += 1;
        }
        let h: f64 = (1..=KEYS).map(|k| 1.0 / f64::from(k)).sum();
        for k in [1u32, 2, 10] {
            let want = f64::from(draws) / (f64::from(k) * h);
            let got = f64::from(n[k as usize]);
            assert!(
                (got - want).abs() < want * 0.05,
                "rank {k}: {got} vs {want}"
            );
        }
        // The last rank is drawn too, ~1/200 as often as the first.
        assert!(n[KEYS as usize] > 50, "{}", n[KEYS as usize]);
    }

    #[test]
    fn the_keys_are_the_seeds() {
        let a = keys(Scenario::CatalogueOutage, 1, 100).unwrap();
        assert_eq!(a, keys(Scenario::CatalogueOutage, 1, 100).unwrap());
        assert_ne!(a, keys(Scenario::CatalogueOutage, 2, 100).unwrap());
        assert!(keys(Scenario::Outage, 1, 100).is_none());
    }

    #[test]
    fn reads_during_the_outage_split_by_keys_answered_before_it() {
        let ms = Duration::from_millis;
        let rec = |start: u64, key: u32, ok: bool| RequestRecord {
            start: ms(start),
            latency: ms(5),
            ok,
            key: Some(key),
        };
        let records = [
            rec(0, 1, true),
            rec(10, 2, false),
            // Answered after the outage began: not seen.
            rec(98, 3, true),
            rec(100, 1, true),
            rec(150, 1, false),
            rec(160, 2, false),
            rec(170, 3, true),
            // After it.
            rec(200, 4, true),
        ];
        let o = outage_reads(&records, ms(100), ms(200));
        assert_eq!(
            o,
            OutageReads {
                keys_read: 4,
                reads_before: 3,
                seen: 1,
                seen_reads: 2,
                seen_ok: 1,
                new_reads: 2,
                new_ok: 1,
            }
        );
        assert_eq!(o.seen_success(), 50.0);
    }
}
