//! What an answer says of being retried: `Retry-After` (delta-seconds or an
//! HTTP-date, RFC 9110 §10.2.3) and pushback — gRPC's
//! `grpc-retry-pushback-ms` and a proxy's refusal
//! (docs/reference/retries.md#pushback).
//!
//! Owns turning those header values into a wait or a refusal; the decision
//! (`decide`) owns what they make of the retry. It must not read the clock:
//! the caller passes the wall-clock time an HTTP-date is measured against
//! (the data plane reads it once, at the edge). An unparseable `Retry-After`
//! is ignored (`None`), never an error — an upstream's odd header must not
//! fail a request; an unparseable pushback means "do not retry", as gRPC
//! reads it.

use std::time::{Duration, SystemTime};

/// Parses a `Retry-After` value into the wait it asks for.
///
/// - delta-seconds (`"3"`): that many seconds; a number too large for `u64`
///   saturates (it will exceed any `max_retry_after`);
/// - an HTTP-date in any of the three forms (IMF-fixdate, RFC 850, asctime):
///   the time from `now_wall` to it, `Some(0)` when it is in the past;
/// - anything else (empty, negative, fractional, garbage): `None`.
pub fn parse_retry_after(value: &str, now_wall: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now_wall).unwrap_or(Duration::ZERO))
}

/// What an answer says of being retried besides its status and
/// `Retry-After` (docs/reference/retries.md#pushback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// `grpc-retry-pushback-ms` of zero or more: the server asks for this
    /// wait before the next attempt (gRFC A6).
    After(Duration),
    /// `grpc-retry-pushback-ms` negative or malformed: the server asks that
    /// the call not be retried at all (gRFC A6).
    DoNotRetry,
    /// A proxy in the chain refused the request to shed load (Envoy's
    /// `x-envoy-overloaded` or `x-envoy-ratelimited`, another weir's
    /// `x-weir-error: overloaded | circuit_open | rate_limited`): a retry
    /// from every proxy of a chain would multiply the load it shed.
    Refused,
}

impl Pushback {
    /// An answer's pushback from what it carries: a proxy's refusal
    /// (`refused`) outranks any `grpc-retry-pushback-ms`.
    pub fn of(refused: bool, grpc_retry_pushback_ms: Option<&[u8]>) -> Option<Pushback> {
        if refused {
            return Some(Pushback::Refused);
        }
        grpc_retry_pushback_ms.map(parse_grpc_pushback)
    }
}

/// Parses a `grpc-retry-pushback-ms` value as gRFC A6 reads it: whole
/// milliseconds, zero or more, ask for that wait (too many for `u64`
/// saturate, and exceed any `max_retry_after`); anything else — negative,
/// fractional, empty, garbage — asks for no retry.
pub fn parse_grpc_pushback(value: &[u8]) -> Pushback {
    let v = value.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return Pushback::DoNotRetry;
    }
    let ms = v
        .iter()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .unwrap_or(u64::MAX);
    Pushback::After(Duration::from_millis(ms))
}

/// Rounds up to whole milliseconds: a wait the upstream asked for is never
/// cut short.
pub(super) fn ceil_ms(d: Duration) -> Duration {
    if d.subsec_nanos() % 1_000_000 == 0 {
        d
    } else {
        Duration::from_millis(
            u64::try_from(d.as_millis())
                .unwrap_or(u64::MAX)
                .saturating_add(1),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    // Sun, 06 Nov 1994 08:49:37 GMT
    const T: u64 = 784_111_777;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after("3", at(0)), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after(" 120 ", at(0)),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after("0", at(0)), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("99999999999999999999999", at(0)),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn three_date_forms() {
        let now = at(T - 10);
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(v, now),
                Some(Duration::from_secs(10)),
                "{v}"
            );
        }
    }

    #[test]
    fn past_date_is_zero() {
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at(T + 100)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn garbage_is_ignored() {
        for v in ["", "-1", "1.5", "soon", "Sun, 06 Nov 1994", "3 s"] {
            assert_eq!(parse_retry_after(v, at(T)), None, "{v}");
        }
    }

    #[test]
    fn grpc_pushback_as_grfc_a6_reads_it() {
        let ms = |n| Pushback::After(Duration::from_millis(n));
        assert_eq!(parse_grpc_pushback(b"2000"), ms(2000));
        assert_eq!(parse_grpc_pushback(b" 0 "), ms(0));
        assert_eq!(
            parse_grpc_pushback(b"99999999999999999999999"),
            ms(u64::MAX)
        );
        // grpcio writes a value it cannot parse as i64::MIN.
        for v in [
            &b"-1"[..],
            b"-9223372036854775808",
            b"",
            b"1.5",
            b"+5",
            b"soon",
            b"2000ms",
        ] {
            assert_eq!(
                parse_grpc_pushback(v),
                Pushback::DoNotRetry,
                "{}",
                String::from_utf8_lossy(v)
            );
        }
    }
}
