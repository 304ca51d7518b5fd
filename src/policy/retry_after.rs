//! `Retry-After` parsing: delta-seconds or an HTTP-date (RFC 9110 §10.2.3).
//!
//! Owns turning a header value into a wait. It must not read the clock: the
//! caller passes the wall-clock time an HTTP-date is measured against (the data
//! plane reads it once, at the edge). Anything unparseable is ignored (`None`),
//! never an error — an upstream's odd header must not fail a request.

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
}
