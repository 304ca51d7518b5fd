//! The operator's view of a retry policy: what `weir schedule` prints.
//!
//! Owns turning a [`RetryPolicy`] and a timeout into a human-readable report:
//! each retry's delay envelope, the worst-case total wait, and a warning when
//! `max_attempts` attempts cannot fit in the timeout. It must not print, read
//! a clock or draw randomness: it returns a `String` built from
//! [`envelope`] alone, so the report is the same on every run.

use super::backoff::{envelope, Growth, Jitter};
use super::decide::RetryPolicy;
use std::fmt::Write as _;
use std::time::Duration;

/// The schedule report for one upstream, without a per-try timeout.
pub fn schedule_report(name: &str, policy: &RetryPolicy, timeout: Duration) -> String {
    schedule_report_with(name, policy, timeout, None)
}

/// The schedule report for one upstream. With `per_try`, the warning also
/// considers `max_attempts` attempts each running to their per-try timeout.
pub fn schedule_report_with(
    name: &str,
    policy: &RetryPolicy,
    timeout: Duration,
    per_try: Option<Duration>,
) -> String {
    let b = &policy.backoff;
    let retries = policy.max_attempts.saturating_sub(1);
    let env = envelope(b, retries);
    let mut out = String::new();
    let jitter = match b.jitter {
        Jitter::Full => "full".to_string(),
        Jitter::Equal => "equal".to_string(),
        Jitter::Decorrelated => "decorrelated".to_string(),
        Jitter::None => "none".to_string(),
        Jitter::Proportional(p) => format!("proportional {p}"),
    };
    let growth = match b.growth {
        Growth::Exponential => "exponential",
        Growth::Linear => "linear",
        Growth::Constant => "constant",
    };
    // Writing to a String cannot fail; the results are ignored on purpose.
    let _ = writeln!(
        out,
        "upstream {name}: max_attempts {}, timeout {}, backoff {growth} base {} max {} ×{} jitter {jitter}",
        policy.max_attempts,
        fmt_duration(timeout),
        fmt_duration(b.base),
        fmt_duration(b.max),
        b.multiplier,
    );
    if retries == 0 {
        let _ = writeln!(out, "  no retries (max_attempts = 1)");
    }
    for (i, (lo, hi)) in env.per_retry.iter().enumerate() {
        let _ = writeln!(
            out,
            "  retry {}: {} – {}",
            i + 1,
            fmt_duration(*lo),
            fmt_duration(*hi)
        );
    }
    let worst = env.worst_case_total;
    let _ = writeln!(out, "  worst-case total wait: {}", fmt_duration(worst));
    let attempts = policy.max_attempts;
    if retries > 0 && worst >= timeout {
        let _ = writeln!(
            out,
            "  warning: the worst-case backoff alone ({}) does not fit in timeout ({}): \
             {attempts} attempts cannot all be made",
            fmt_duration(worst),
            fmt_duration(timeout)
        );
    } else if let Some(per_try) = per_try {
        let total = worst.saturating_add(per_try.saturating_mul(attempts));
        if retries > 0 && total > timeout {
            let _ = writeln!(
                out,
                "  warning: {attempts} attempts of up to {} each plus the worst-case backoff ({}) \
                 take up to {}, more than timeout ({}): the last attempts may not be made",
                fmt_duration(per_try),
                fmt_duration(worst),
                fmt_duration(total),
                fmt_duration(timeout)
            );
        }
    } else {
        let total = worst.saturating_add(policy.min_attempt_time.saturating_mul(attempts));
        if retries > 0 && total > timeout {
            let _ = writeln!(
                out,
                "  warning: the worst-case backoff plus min_attempt_time per attempt ({}) \
                 exceeds timeout ({})",
                fmt_duration(total),
                fmt_duration(timeout)
            );
        }
    }
    out
}

/// `250ms`, `1.5s`, `2m30s`: short and exact to the millisecond.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let s = ms as f64 / 1000.0;
        format!("{s}s")
    } else {
        let m = ms / 60_000;
        let rest = ms % 60_000;
        if rest == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", rest as f64 / 1000.0)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::contract::PolicyJson;

    fn policy(max_attempts: u32) -> RetryPolicy {
        PolicyJson {
            max_attempts,
            ..PolicyJson::default()
        }
        .to_policy()
        .unwrap()
    }

    #[test]
    fn defaults_fit() {
        let r = schedule_report("payments", &policy(3), Duration::from_secs(15));
        assert!(r.contains("retry 1: 0ms – 25ms"), "{r}");
        assert!(r.contains("retry 2: 0ms – 50ms"), "{r}");
        assert!(r.contains("worst-case total wait: 75ms"), "{r}");
        assert!(!r.contains("warning"), "{r}");
    }

    #[test]
    fn warns_when_backoff_exceeds_timeout() {
        // 25 + 50 + … + 800 ms, then 1 s three times.
        let r = schedule_report("slow", &policy(10), Duration::from_secs(3));
        assert!(r.contains("retry 9: 0ms – 1s"), "{r}");
        assert!(r.contains("worst-case total wait: 4.575s"), "{r}");
        assert!(r.contains("warning: the worst-case backoff alone"), "{r}");
    }

    #[test]
    fn warns_with_per_try() {
        let r = schedule_report_with(
            "p",
            &policy(3),
            Duration::from_secs(5),
            Some(Duration::from_secs(2)),
        );
        assert!(r.contains("warning: 3 attempts of up to 2s"), "{r}");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_secs(300)), "5m");
    }
}
