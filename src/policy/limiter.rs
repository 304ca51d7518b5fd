//! Admission limiters (SEMANTICS §5): token bucket, sliding window, and a keyed
//! registry bounded by `max_keys`.

use super::PolicyError;
use std::time::Duration;

/// Where a keyed limiter reads its key from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum KeySource {
    /// `header:NAME` — the (lower-cased) request header's value.
    Header(String),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RateLimitParams {
    /// Token bucket: `(rps, burst)`.
    pub bucket: Option<(f64, u32)>,
    /// Sliding window: `(limit, period)`.
    pub window: Option<(u32, Duration)>,
    pub key: Option<KeySource>,
    pub max_keys: usize,
    pub max_wait: Duration,
}

impl RateLimitParams {
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
        })
    }
}
