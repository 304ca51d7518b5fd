//! `[state]`: where the state a fleet shares is kept
//! (docs/reference/fleet.md#fleet-state), validated into a [`StateConfig`]. The
//! URL is checked as text (and by the Redis client's own parser), never
//! dialled: the config layer touches no network.

use super::super::raw::RawState;
use super::super::{redact_url, StateBackend, StateConfig};
use super::ErrorSink;
use std::time::Duration;

/// The longest `timeout`: a call slower than this would hold requests up
/// longer than falling back to local state is worth.
const MAX_TIMEOUT: Duration = Duration::from_secs(1);
/// `refresh` bounds: read at least once a minute, at most ten times a second.
const MIN_REFRESH: Duration = Duration::from_millis(100);
const MAX_REFRESH: Duration = Duration::from_secs(60);
/// The longest `key_prefix`, in bytes.
const MAX_PREFIX: usize = 64;

pub(super) fn state(cx: &mut ErrorSink, s: &RawState) -> Option<StateConfig> {
    let n_errors = cx.errors.len();
    let backend = s.backend.unwrap_or_default();
    match (&s.url, backend) {
        (Some(u), _) => url(cx, u),
        (None, StateBackend::Redis) => cx.err(
            "state.url",
            "missing `url`: backend = \"redis\" needs the server, e.g. url = \"redis://127.0.0.1:6379/0\"",
        ),
        (None, StateBackend::Memory) => {}
    }
    let key_prefix = s.key_prefix.clone().unwrap_or_default();
    if key_prefix.len() > MAX_PREFIX {
        cx.err(
            "state.key_prefix",
            format!(
                "must be at most {MAX_PREFIX} bytes, got {}",
                key_prefix.len()
            ),
        );
    } else if key_prefix
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        cx.err(
            "state.key_prefix",
            format!("{key_prefix:?} has whitespace or a control character: use e.g. \"weir:\" or \"prod:weir:\""),
        );
    }
    let timeout = s.timeout.map(|d| d.0).unwrap_or_default();
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        cx.err(
            "state.timeout",
            format!("must be greater than 0 and at most 1s (past it a request decides with local state), got {timeout:?}"),
        );
    }
    let refresh = s.refresh.map(|d| d.0).unwrap_or_default();
    if !(MIN_REFRESH..=MAX_REFRESH).contains(&refresh) {
        cx.err(
            "state.refresh",
            format!("must be between 100ms and 1m, got {refresh:?}"),
        );
    }
    (cx.errors.len() == n_errors).then(|| StateConfig {
        backend,
        url: s.url.clone(),
        key_prefix,
        timeout,
        refresh,
    })
}

/// `[state]` as the effective config shows it: a password in `url` masked.
pub(super) fn effective(mut s: RawState) -> RawState {
    s.url = s.url.as_deref().map(redact_url);
    s
}

fn url(cx: &mut ErrorSink, s: &str) {
    let field = "state.url";
    let bad = |why: &str| format!("invalid url {s:?}: {why}");
    let uri: http::Uri = match s.parse() {
        Ok(u) => u,
        Err(e) => return cx.err(field, bad(&e.to_string())),
    };
    match uri.scheme_str() {
        Some("redis" | "rediss") => {}
        Some(other) => {
            return cx.err(
                field,
                bad(&format!("scheme {other:?} is not redis or rediss (TLS)")),
            )
        }
        None => {
            return cx.err(
                field,
                bad("expected redis://host:port/db, or rediss://host:port/db for TLS"),
            )
        }
    }
    if uri.authority().is_none_or(|a| a.host().is_empty()) {
        return cx.err(field, bad("no host"));
    }
    if uri.query().is_some() || s.contains('#') {
        return cx.err(
            field,
            bad("a query string or fragment is not supported (weir always verifies a rediss:// server's certificate)"),
        );
    }
    let db = uri.path().trim_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return cx.err(
            field,
            bad(&format!("the path is the database number, got {db:?}")),
        );
    }
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(s) {
        cx.err(field, bad(&e.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::redact_url;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            redact_url("redis://:s3cret@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redact_url("rediss://weir:p@ss@cache/1"),
            "rediss://weir:***@cache/1"
        );
        assert_eq!(redact_url("redis://cache:6379/0"), "redis://cache:6379/0");
        assert_eq!(redact_url("redis://weir@cache/0"), "redis://weir@cache/0");
        assert_eq!(redact_url("nonsense"), "nonsense");
    }
}
