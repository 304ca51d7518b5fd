//! Durations in the config: strings with a unit (`"250ms"`, `"10s"`, `"5m"`).
//! A bare number is rejected — `timeout = 10` is ambiguous (seconds? ms?), and
//! guessing wrong turns a 10 s deadline into a 10 ms one.

use serde::de::{self, Deserializer, Visitor};
use serde::{Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A config duration; serialises back to the same human form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h` (the number may have
/// a fraction: `"1.5s"`), or several such parts (`"1m30s"`).
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration: write it with a unit, e.g. \"250ms\", \"10s\", \"5m\"".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        if num.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: expected a number before {after:?}"
            ));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let scale = match unit.trim() {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "duration {s:?} has no unit: write e.g. \"{num}s\" or \"{num}ms\""
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration unit {other:?} in {s:?}: use ms, s, m or h"
                ))
            }
        };
        let n: f64 = num
            .parse()
            .map_err(|_| format!("invalid number {num:?} in duration {s:?}"))?;
        let secs = n * scale;
        if !secs.is_finite() || secs > 365.0 * 24.0 * 3600.0 {
            return Err(format!("duration {s:?} is too large (at most a year)"));
        }
        total += Duration::from_secs_f64(secs);
        rest = next;
    }
    // Whole milliseconds: finer precision is noise for a network deadline.
    Ok(Duration::from_millis(total.as_millis() as u64))
}

/// The shortest exact human form: `"250ms"`, `"10s"`, `"5m"`, `"1500ms"`.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

impl<'de> serde::Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string with a unit, like \"250ms\", \"10s\" or \"5m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                parse(v).map(Dur).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "a bare number ({v}) is not a duration: write it as a string with a unit, e.g. \"{v}s\" or \"{v}ms\""
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                self.visit_i64(v as i64)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "a bare number ({v}) is not a duration: write it as a string with a unit, e.g. \"{v}s\""
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(self.0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_missing_or_unknown_units() {
        assert!(parse("10").is_err_and(|e| e.contains("no unit")));
        assert!(parse("10 parsecs").is_err());
        assert!(parse("").is_err());
        assert!(parse("s").is_err());
        assert!(parse("-1s").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for s in ["250ms", "10s", "5m", "1h", "1500ms", "0s"] {
            assert_eq!(format(parse(s).unwrap_or_default()), s);
        }
    }
}
