//! `endpoints`, `balance`, `max_endpoints` and `[ejection]` of an upstream
//! (docs/reference/endpoints.md).

use super::super::raw::{RawEjection, RawUpstream, DEFAULT_BALANCE, DEFAULT_MAX_ENDPOINTS};
use super::{quote, ErrorSink};
use crate::config::EndpointsConfig;
use crate::policy::balance::Balance;
use crate::policy::eject::EjectParams;
use crate::policy::BalanceParams;

/// The most endpoints an upstream may use (`max_endpoints`' ceiling).
const MAX_ENDPOINTS_CEILING: u32 = 1024;

/// One `host:port` entry, or why it is not one.
/// A `host:port` entry, or `unix:/path` (an absolute socket path, kept as
/// written with port 0: `upstream::resolve::literal` makes it an
/// `Address`).
fn entry(s: &str) -> Result<(String, u16), String> {
    if let Some(path) = s.strip_prefix("unix:") {
        if !path.starts_with('/') || path.ends_with('/') {
            return Err(format!(
                "{s:?}: a socket path must be absolute: \"unix:/run/app.sock\""
            ));
        }
        return Ok((s.to_string(), 0));
    }
    let bad =
        || format!("{s:?} is not `host:port` (e.g. \"10.0.0.7:8080\" or \"api-2.internal:443\")");
    let a: http::uri::Authority = s.parse().map_err(|_| bad())?;
    if a.as_str() != s || s.contains('@') {
        return Err(bad());
    }
    let port = a.port_u16().ok_or_else(bad)?;
    if port == 0 {
        return Err(format!("{s:?}: port 0 is not an endpoint's port"));
    }
    let host = a.host();
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

pub(super) fn endpoints(
    cx: &mut ErrorSink,
    name: &str,
    up: &RawUpstream,
    url: Option<&crate::config::UpstreamUrl>,
) -> Option<EndpointsConfig> {
    let q = quote(name);
    let n_errors = cx.errors.len();
    let mut entries: Vec<(String, u16)> = Vec::new();
    if let Some(list) = &up.endpoints {
        if list.is_empty() {
            cx.err(
                format!("upstreams.{q}.endpoints"),
                "lists no endpoint: give at least one `host:port`, or leave `endpoints` out to use the url's host",
            );
        }
        let mut seen: Vec<(usize, String)> = Vec::new();
        for (i, raw) in list.iter().enumerate() {
            match entry(raw) {
                Ok(e) => {
                    let canon = format!("{}:{}", e.0.to_ascii_lowercase(), e.1);
                    if let Some((j, _)) = seen.iter().find(|(_, c)| *c == canon) {
                        cx.err(
                            format!("upstreams.{q}.endpoints[{i}]"),
                            format!("{raw:?} repeats endpoints[{j}]: each endpoint once"),
                        );
                    } else {
                        seen.push((i, canon));
                        entries.push(e);
                    }
                }
                Err(m) => cx.err(format!("upstreams.{q}.endpoints[{i}]"), m),
            }
        }
    }
    let balance = match up.balance.as_deref().unwrap_or(DEFAULT_BALANCE) {
        "peak_ewma" => Balance::PeakEwma,
        "round_robin" => Balance::RoundRobin,
        other => {
            cx.err(
                format!("upstreams.{q}.balance"),
                format!(
                    "unknown balance {other:?}: {}expected peak_ewma or round_robin",
                    crate::policy::suggest::hint(other, ["peak_ewma", "round_robin"])
                ),
            );
            Balance::PeakEwma
        }
    };
    let max_endpoints = up.max_endpoints.unwrap_or(DEFAULT_MAX_ENDPOINTS);
    if max_endpoints == 0 || max_endpoints > MAX_ENDPOINTS_CEILING {
        cx.err(
            format!("upstreams.{q}.max_endpoints"),
            format!("must be between 1 and {MAX_ENDPOINTS_CEILING}, got {max_endpoints}"),
        );
    } else if up
        .endpoints
        .as_ref()
        .is_some_and(|l| l.len() > max_endpoints as usize)
    {
        let n = up.endpoints.as_ref().map_or(0, Vec::len);
        cx.err(
            format!("upstreams.{q}.max_endpoints"),
            format!(
                "{max_endpoints} is below the {n} static endpoints listed: raise it or list fewer"
            ),
        );
    }
    let e = up
        .ejection
        .clone()
        .unwrap_or_default()
        .merge(RawEjection::builtin());
    let field = |f: &str| format!("upstreams.{q}.ejection.{f}");
    let consecutive_failures = e.consecutive_failures.unwrap_or(5);
    if consecutive_failures == 0 {
        cx.err(field("consecutive_failures"), "must be at least 1");
    }
    let failure_share_above = e.failure_share_above.unwrap_or(0.3);
    if !(failure_share_above > 0.0 && failure_share_above <= 1.0) {
        cx.err(
            field("failure_share_above"),
            format!("must be in (0, 1] (a share, not a percent), got {failure_share_above}"),
        );
    }
    let min_samples = e.min_samples.unwrap_or(20);
    if min_samples == 0 || min_samples > crate::policy::eject::WINDOW {
        cx.err(
            field("min_samples"),
            format!(
                "must be between 1 and {} (the outcomes an endpoint's share is kept over), got {min_samples}",
                crate::policy::eject::WINDOW
            ),
        );
    }
    let base = e.base.map(|d| d.0).unwrap_or_default();
    let max = e.max.map(|d| d.0).unwrap_or_default();
    if base.is_zero() {
        cx.err(field("base"), "must be greater than 0");
    }
    if max < base {
        cx.err(field("max"), "must be at least `base`");
    }
    let max_ejected = e.max_ejected.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&max_ejected) {
        cx.err(
            field("max_ejected"),
            format!("must be in [0, 1] (a share of the endpoints), got {max_ejected}"),
        );
    }
    if cx.errors.len() > n_errors {
        return None;
    }
    let fixed = up.endpoints.is_some();
    if !fixed {
        // The url's host and port; `url` reports its own errors.
        let url = url?;
        match &url.socket {
            Some(path) => entries.push((format!("unix:{}", path.display()), 0)),
            None => entries.push((url.host.clone(), url.port)),
        }
    }
    Some(EndpointsConfig {
        entries,
        fixed,
        params: BalanceParams {
            balance,
            ejection: EjectParams {
                consecutive_failures,
                failure_share_above,
                min_samples,
                base,
                max,
                max_ejected,
            },
            max_endpoints,
        },
    })
}

/// `[upstreams.NAME.grpc] idempotent_methods`, compiled; a bad pattern is
/// an error naming the field.
pub(super) fn idempotent_methods(
    cx: &mut ErrorSink,
    name: &str,
    up: &RawUpstream,
) -> crate::policy::grpc::IdempotentMethods {
    let patterns = up
        .grpc
        .as_ref()
        .and_then(|g| g.idempotent_methods.as_deref());
    match crate::policy::grpc::IdempotentMethods::parse(patterns.unwrap_or_default()) {
        Ok(m) => m,
        Err(e) => {
            let at = format!("upstreams.{}.grpc.idempotent_methods", quote(name));
            cx.err(at, e);
            Default::default()
        }
    }
}

/// The `Host` / `:authority` sent to an upstream on a Unix-domain socket
/// when `authority` is not set: a socket has no authority of its own.
const DEFAULT_SOCKET_AUTHORITY: &str = "localhost";

/// `url = "unix:PATH"`: cleartext HTTP on the Unix-domain socket at the
/// absolute `PATH`, sent with `authority` (default `localhost`).
pub(super) fn socket_url(
    cx: &mut ErrorSink,
    name: &str,
    up: &RawUpstream,
    path: &str,
    bad: &dyn Fn(&str) -> String,
) -> Option<crate::config::UpstreamUrl> {
    let q = quote(name);
    let field = format!("upstreams.{q}.url");
    if !path.starts_with('/') {
        cx.err(
            field,
            bad("a socket path must be absolute: \"unix:/run/app.sock\""),
        );
        return None;
    }
    if path.contains(['?', '#']) || path.ends_with('/') {
        cx.err(
            field,
            bad("a socket path, with no query, fragment or base path"),
        );
        return None;
    }
    let given = up.authority.as_deref().unwrap_or(DEFAULT_SOCKET_AUTHORITY);
    let authority = match given.parse::<http::uri::Authority>() {
        Ok(a) if a.as_str() == given && !given.contains('@') && !a.host().is_empty() => a,
        _ => {
            cx.err(
                format!("upstreams.{q}.authority"),
                format!("{given:?} is not a `host` or `host:port` to send as Host"),
            );
            return None;
        }
    };
    if up.tunnel == Some(true) {
        cx.err(
            format!("upstreams.{q}.tunnel"),
            "a CONNECT tunnel goes to a TCP address, and this upstream is a Unix-domain socket",
        );
    }
    Some(crate::config::UpstreamUrl {
        scheme: crate::config::Scheme::Http,
        host: authority.host().to_string(),
        authority,
        port: 0,
        base_path: String::new(),
        socket: Some(std::path::PathBuf::from(path)),
    })
}

#[cfg(test)]
mod tests {
    use super::entry;

    #[test]
    fn entries_are_host_and_port() {
        assert_eq!(entry("10.0.0.7:8080"), Ok(("10.0.0.7".into(), 8080)));
        assert_eq!(entry("[::1]:80"), Ok(("[::1]".into(), 80)));
        assert_eq!(
            entry("api-2.internal:443"),
            Ok(("api-2.internal".into(), 443))
        );
        for bad in [
            "10.0.0.7",
            "http://a:80",
            "a:80/x",
            "a:",
            ":80",
            "a:99999",
            "u@a:80",
            "a:0",
            "",
        ] {
            assert!(entry(bad).is_err(), "{bad:?}");
        }
    }
}
