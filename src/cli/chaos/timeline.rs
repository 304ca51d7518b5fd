//! What a client saw over time: success per second, and how soon after an
//! upstream came back its clients were served again. Pure functions over the
//! driver's records, so the report and the CI gates compute them one way.

use super::driver::RequestRecord;
use std::time::Duration;

/// The success share (0–100) of requests started in each whole second of the
/// run; `None` for a second in which no request started.
pub fn per_second(records: &[RequestRecord]) -> Vec<Option<f64>> {
    let Some(last) = records.iter().map(|r| r.start).max() else {
        return Vec::new();
    };
    let seconds = last.as_secs() as usize + 1;
    let mut counts = vec![(0u64, 0u64); seconds];
    for r in records {
        let c = &mut counts[r.start.as_secs() as usize];
        c.0 += 1;
        c.1 += u64::from(r.ok);
    }
    counts
        .into_iter()
        .map(|(n, ok)| (n > 0).then(|| ok as f64 * 100.0 / n as f64))
        .collect()
}

/// How long after `back` the clients were served again: the offset from
/// `back` of the first one-second window of request starts (slid in 50 ms
/// steps, and lying wholly inside the run) in which at least `share` percent
/// of the requests succeeded. `None` if no such window exists.
pub fn to_success(records: &[RequestRecord], back: Duration, share: f64) -> Option<Duration> {
    const WINDOW: Duration = Duration::from_secs(1);
    const STEP: Duration = Duration::from_millis(50);
    let last = records.iter().map(|r| r.start).max()?;
    let mut t = back;
    while t + WINDOW <= last + STEP {
        let (n, ok) = records
            .iter()
            .filter(|r| r.start >= t && r.start < t + WINDOW)
            .fold((0u64, 0u64), |(n, ok), r| (n + 1, ok + u64::from(r.ok)));
        if n > 0 && ok as f64 * 100.0 >= share * n as f64 {
            return Some(t - back);
        }
        t += STEP;
    }
    None
}

/// How long after `back` the first successful response arrived (a request
/// sent before `back` that succeeded after it counts too).
pub fn first_success_after(records: &[RequestRecord], back: Duration) -> Option<Duration> {
    records
        .iter()
        .filter(|r| r.ok)
        .map(|r| r.start + r.latency)
        .filter(|done| *done >= back)
        .min()
        .map(|done| done - back)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    /// One request every 10 ms for `secs` seconds, failing in `[down, up)`.
    fn run(secs: u64, down: u64, up: u64) -> Vec<RequestRecord> {
        (0..secs * 100)
            .map(|i| {
                let start = ms(i * 10);
                RequestRecord {
                    start,
                    latency: ms(2),
                    ok: !(start >= ms(down) && start < ms(up)),
                    key: None,
                }
            })
            .collect()
    }

    #[test]
    fn per_second_shares() {
        let p = per_second(&run(4, 1000, 2500));
        assert_eq!(p, vec![Some(100.0), Some(0.0), Some(50.0), Some(100.0)]);
        assert!(per_second(&[]).is_empty());
    }

    #[test]
    fn success_returns_when_the_failures_stop() {
        let r = run(10, 2000, 5000);
        // Failing until 5 s, upstream back at 4 s: one second of failures
        // after it, and the first window that is ≥ 95 % starts at ~4.95 s.
        let d = to_success(&r, ms(4000), 95.0).unwrap();
        assert!(d >= ms(950) && d <= ms(1000), "{d:?}");
        assert_eq!(to_success(&r, ms(5000), 95.0), Some(Duration::ZERO));
        // Never back within the run.
        assert_eq!(to_success(&run(3, 1000, 5000), ms(1000), 95.0), None);
    }

    #[test]
    fn first_success_counts_completions() {
        let r = run(6, 2000, 4500);
        assert_eq!(first_success_after(&r, ms(4000)), Some(ms(502)));
        assert_eq!(first_success_after(&r, ms(7000)), None);
    }
}
