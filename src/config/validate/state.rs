//! `[state]`: where the state a fleet shares is kept
//! (docs/reference/fleet.md#fleet-state), validated into a [`StateConfig`]. The
//! URL is checked as text (and by the Redis client's own parser), never
//! dialled: the config layer touches no network.

use super::super::raw::RawState;
use super::super::{redact_url, OnUnavailable, StateBackend, StateConfig};
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

/// The most replicas `wait_replicas` may ask for.
const MAX_WAIT_REPLICAS: u8 = 16;

pub(super) fn state(cx: &mut ErrorSink, s: &RawState) -> Option<StateConfig> {
    let n_errors = cx.errors.len();
    let backend = s.backend.unwrap_or_default();
    let sentinels = s.sentinels.clone().unwrap_or_default();
    let cluster = s.cluster.clone().unwrap_or_default();
    where_it_lives(cx, s, backend, &sentinels, &cluster);
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
    } else if !cluster.is_empty() && key_prefix.contains(['{', '}']) {
        cx.err(
            "state.key_prefix",
            format!("{key_prefix:?} has a brace: with `cluster`, weir puts each upstream's name in braces (a hash tag), and a brace before it would tag every key alike"),
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
    let wait_replicas = s.wait_replicas.unwrap_or_default();
    if wait_replicas > MAX_WAIT_REPLICAS {
        cx.err(
            "state.wait_replicas",
            format!("must be at most {MAX_WAIT_REPLICAS}, got {wait_replicas}"),
        );
    }
    let wait_timeout = s.wait_timeout.map(|d| d.0).unwrap_or_default();
    if wait_timeout.is_zero() || wait_timeout > MAX_TIMEOUT {
        cx.err(
            "state.wait_timeout",
            format!("must be greater than 0 and at most 1s (a keyed write waits this long for its replicas), got {wait_timeout:?}"),
        );
    }
    let on_unavailable = s.on_unavailable.unwrap_or_default();
    if wait_replicas > 0 && backend != StateBackend::Redis {
        cx.warn(
            "state.wait_replicas",
            "does nothing with backend = \"memory\": there are no replicas to wait for",
        );
    } else if wait_replicas > 0 && on_unavailable == OnUnavailable::Local {
        cx.note(
            "state.wait_replicas",
            "with on_unavailable = \"local\" (the default), a keyed write whose claim the replicas do not acknowledge in wait_timeout still goes ahead, decided by this instance alone (counted in weir_state_keyed_fallback_total); set on_unavailable = \"refuse\" to answer it 503 instead",
        );
    }
    (cx.errors.len() == n_errors).then(|| StateConfig {
        backend,
        url: s.url.clone(),
        sentinels,
        master_name: s.master_name.clone(),
        cluster,
        username: s.username.clone(),
        password: s.password.clone(),
        db: s.db.unwrap_or_default(),
        key_prefix,
        timeout,
        refresh,
        wait_replicas,
        wait_timeout,
        on_unavailable,
    })
}

/// Exactly one of `url`, `sentinels` (with `master_name`) and `cluster`
/// with `backend = "redis"`; each URL well formed; the primary's own
/// credentials only with `sentinels`.
fn where_it_lives(
    cx: &mut ErrorSink,
    s: &RawState,
    backend: StateBackend,
    sentinels: &[String],
    cluster: &[String],
) {
    let set = [
        ("url", s.url.is_some()),
        ("sentinels", s.sentinels.is_some()),
        ("cluster", s.cluster.is_some()),
    ];
    let named: Vec<&str> = set.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
    if named.len() > 1 {
        cx.err(
            format!("state.{}", named[1]),
            format!(
                "`{}` and `{}` are both set: the shared state lives on one server (`url`), a primary found through Sentinel (`sentinels` + `master_name`) or a Cluster (`cluster`)",
                named[0], named[1]
            ),
        );
    } else if named.is_empty() && backend == StateBackend::Redis {
        cx.err(
            "state.url",
            "missing `url`: backend = \"redis\" needs the server, e.g. url = \"redis://127.0.0.1:6379/0\" (or `sentinels` + `master_name`, or `cluster`)",
        );
    }
    if let Some(u) = &s.url {
        url(cx, "state.url", u, true);
    }
    for (i, u) in sentinels.iter().enumerate() {
        url(cx, &format!("state.sentinels[{i}]"), u, false);
    }
    for (i, u) in cluster.iter().enumerate() {
        url(cx, &format!("state.cluster[{i}]"), u, false);
    }
    if s.sentinels.is_some() && sentinels.is_empty() {
        cx.err(
            "state.sentinels",
            "is empty: list at least one Sentinel, e.g. [\"redis://10.0.0.1:26379\"]",
        );
    }
    if s.cluster.is_some() && cluster.is_empty() {
        cx.err(
            "state.cluster",
            "is empty: list at least one node, e.g. [\"redis://10.0.0.1:6379\"]",
        );
    }
    let schemes = |urls: &[String]| {
        let tls = urls.iter().filter(|u| u.starts_with("rediss:")).count();
        tls != 0 && tls != urls.len()
    };
    if schemes(sentinels) {
        cx.err("state.sentinels", "mixes redis:// and rediss://: the primary is reached the way the Sentinels are, so they must agree");
    }
    if schemes(cluster) {
        cx.err(
            "state.cluster",
            "mixes redis:// and rediss://: every node of a Cluster is reached the same way",
        );
    }
    match (&s.master_name, s.sentinels.is_some()) {
        (None, true) => cx.err("state.master_name", "missing: `sentinels` needs the name they know the primary by, e.g. master_name = \"mymaster\""),
        (Some(_), false) => cx.err("state.master_name", "is set without `sentinels`"),
        (Some(n), true) if n.is_empty() || n.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            cx.err("state.master_name", format!("{n:?} is not a Sentinel master name"))
        }
        _ => {}
    }
    if s.sentinels.is_none() {
        for (field, on) in [
            ("username", s.username.is_some()),
            ("password", s.password.is_some()),
            ("db", s.db.is_some()),
        ] {
            if on {
                cx.err(
                    format!("state.{field}"),
                    "is for the primary found through `sentinels`; with `url` or `cluster` it goes in the URL (redis://user:password@host:port/db)",
                );
            }
        }
    }
}

/// `[state]` as the effective config shows it: every password masked.
pub(super) fn effective(mut s: RawState) -> RawState {
    s.url = s.url.as_deref().map(redact_url);
    for list in [&mut s.sentinels, &mut s.cluster].into_iter().flatten() {
        for u in list.iter_mut() {
            *u = redact_url(u);
        }
    }
    if s.password.is_some() {
        s.password = Some("***".into());
    }
    s
}

/// One Redis URL: `redis://` or `rediss://`, a host, no query; a database
/// number in the path only where `db_path` (a server's `url`; a Sentinel
/// has no database, and a Cluster only 0).
fn url(cx: &mut ErrorSink, field: &str, s: &str, db_path: bool) {
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
    if !db_path && !db.is_empty() && db != "0" {
        return cx.err(
            field,
            bad("a Sentinel or a Cluster node has no database number: leave the path out"),
        );
    }
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
