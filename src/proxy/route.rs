//! Routing on the shared listener: Host (or the absolute-form authority),
//! exact or `*.suffix`, case-insensitive, port ignored; then the longest
//! `path_prefix`. Built once per config snapshot; lookups allocate only to
//! lower-case a mixed-case host.

use crate::config::{Config, HostPattern, UpstreamConfig};
use http::request::Parts;

#[derive(Debug)]
struct Route {
    pattern: HostPattern,
    prefix: String,
    /// Index into the snapshot's upstream list.
    upstream: usize,
}

/// The routing table of one config snapshot.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Most specific first: host specificity, then prefix length.
    entries: Vec<Route>,
}

impl RouteTable {
    pub fn new(config: &Config) -> Self {
        let mut entries: Vec<Route> = config
            .upstreams
            .iter()
            .enumerate()
            .flat_map(|(i, u)| {
                u.hosts.iter().map(move |h| Route {
                    pattern: h.clone(),
                    prefix: u.path_prefix.clone(),
                    upstream: i,
                })
            })
            .collect();
        entries.sort_by(|a, b| {
            b.pattern
                .specificity()
                .cmp(&a.pattern.specificity())
                .then(b.prefix.len().cmp(&a.prefix.len()))
        });
        RouteTable { entries }
    }

    /// The upstream index for a request, if any route matches.
    pub fn lookup(&self, host: &str, path: &str) -> Option<usize> {
        let lowered;
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = host.to_ascii_lowercase();
            lowered.as_str()
        } else {
            host
        };
        let host = host.trim_end_matches('.');
        self.entries
            .iter()
            .find(|e| e.pattern.matches(host) && prefix_matches(&e.prefix, path))
            .map(|e| e.upstream)
    }
}

/// Segment-aware: `/api` matches `/api` and `/api/x`, not `/apix`.
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Where a request names userinfo (`user:password@host`), which HTTP
/// deprecates in a target (RFC 9110 §4.2.4) and never allows in `Host`: a
/// 400 on both paths, so that credentials are never forwarded in `Host`
/// under `preserve_host` nor a CONNECT dialled with them. `None` when
/// neither the target's authority nor any `Host` has an `@`.
pub(crate) fn userinfo_in(parts: &Parts) -> Option<&'static str> {
    if parts
        .uri
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        return Some(match parts.version {
            http::Version::HTTP_2 => "the :authority",
            _ => "the request target",
        });
    }
    parts
        .headers
        .get_all(http::header::HOST)
        .iter()
        .any(|h| h.as_bytes().contains(&b'@'))
        .then_some("the Host field")
}

/// The host of an authority or `Host` value: userinfo and port dropped, an
/// IPv6 literal kept whole (without its brackets).
pub(crate) fn host_of(authority: &str) -> &str {
    // Byte by byte: a `Host` value is short, and this runs for every
    // request (`str` patterns cost a searcher each).
    let b = authority.as_bytes();
    let from = b.iter().rposition(|c| *c == b'@').map_or(0, |at| at + 1);
    let a = &authority[from..];
    let (a, end) = match a.strip_prefix('[') {
        Some(rest) => (rest, b']'),
        None => (a, b':'),
    };
    match a.bytes().position(|c| c == end) {
        Some(i) => &a[..i],
        None => a,
    }
}

/// Where a request path goes on the upstream (docs/reference/routing.md#routing): the matched
/// `path_prefix` removed when `strip_prefix`, then the URL's base path in
/// front, joined by a `/` when the rest does not start with one. The three
/// pieces, in order; both data paths write them out.
pub(crate) fn upstream_path<'a>(
    cfg: &'a UpstreamConfig,
    path: &'a str,
) -> (&'a str, &'static str, &'a str) {
    let mut rest = path;
    if cfg.strip_prefix && cfg.path_prefix != "/" && prefix_matches(&cfg.path_prefix, path) {
        rest = &path[cfg.path_prefix.len()..];
    }
    let slash = if rest.starts_with('/') { "" } else { "/" };
    (&cfg.url.base_path, slash, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_authority() {
        for (a, host) in [
            ("svc", "svc"),
            ("svc:8080", "svc"),
            ("user:pw@svc:8080", "svc"),
            ("a@b@svc", "svc"),
            ("[::1]:80", "::1"),
            ("u@[::1]", "::1"),
            ("[::1", "::1"),
            ("", ""),
            ("é:1", "é"),
        ] {
            assert_eq!(host_of(a), host, "{a:?}");
        }
    }

    #[test]
    fn prefixes_respect_segments() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/v1"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(!prefix_matches("/api", "/"));
    }
}
