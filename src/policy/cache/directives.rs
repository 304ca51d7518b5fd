//! What the response cache reads from a request and a response (RFC 9111
//! §5, RFC 5861): `Cache-Control` directives, `Expires`, `Date`, `Age`,
//! `Vary` and the rest, from header name/value bytes into plain facts.
//! Anything malformed is read the conservative way (each field says which),
//! never an error: an odd header must not fail a request.

use super::Bypass;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest delta-seconds value (RFC 9111 §1.2.2): a larger one counts
/// as 2^31 seconds.
pub const DELTA_SECONDS_MAX: u64 = 1 << 31;

/// Whether a header name is `want` (ASCII case-insensitive).
pub(super) fn name_is(name: &[u8], want: &str) -> bool {
    name.eq_ignore_ascii_case(want.as_bytes())
}

/// The directives of one `Cache-Control` field value, in order: (name,
/// argument), the argument unquoted. Commas inside a quoted argument
/// (`no-cache="a, b"`) do not split it.
pub(super) fn directives(value: &[u8]) -> Directives<'_> {
    Directives { rest: value }
}

pub(super) struct Directives<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Directives<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.rest.is_empty() {
            let (mut quoted, mut escaped) = (false, false);
            let mut end = self.rest.len();
            for (i, &b) in self.rest.iter().enumerate() {
                if quoted {
                    match b {
                        _ if escaped => escaped = false,
                        b'\\' => escaped = true,
                        b'"' => quoted = false,
                        _ => {}
                    }
                } else if b == b'"' {
                    quoted = true;
                } else if b == b',' {
                    end = i;
                    break;
                }
            }
            let element = self.rest[..end].trim_ascii();
            self.rest = self.rest.get(end + 1..).unwrap_or_default();
            if element.is_empty() {
                continue;
            }
            return Some(match element.iter().position(|&b| b == b'=') {
                Some(eq) => (
                    element[..eq].trim_ascii(),
                    Some(unquote(element[eq + 1..].trim_ascii())),
                ),
                None => (element, None),
            });
        }
        None
    }
}

fn unquote(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

/// A delta-seconds value (digits only; quotes already removed), capped at
/// [`DELTA_SECONDS_MAX`]; `None` when it is not one.
pub(super) fn delta_seconds(v: &[u8]) -> Option<Duration> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    });
    Some(Duration::from_secs(n.min(DELTA_SECONDS_MAX)))
}

/// An HTTP-date (any of the three forms); `None` when it is not one.
pub(super) fn http_date(v: &[u8]) -> Option<SystemTime> {
    let s = std::str::from_utf8(v).ok()?;
    httpdate::parse_http_date(s.trim()).ok()
}

/// What the cache reads from a request it handles (GET or HEAD); built by
/// [`CacheRequest::parse`]. Directive names are case-insensitive; the first
/// occurrence of a directive counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheRequest {
    /// A HEAD: answered from a GET's entry; its own response is never stored.
    pub head: bool,
    /// `no-store`: the response to it is not stored (a stored one may still
    /// answer it).
    pub no_store: bool,
    /// `no-cache`: a stored response is revalidated before it is used.
    pub no_cache: bool,
    /// `max-age=N`: a stored response older than N is not fresh for this
    /// request (`max-age=0`: always revalidated). An invalid N counts as 0.
    pub max_age: Option<Duration>,
    /// `max-stale[=N]`: a response stale by at most N is acceptable
    /// (`Duration::MAX` without N). An invalid N is ignored.
    pub max_stale: Option<Duration>,
    /// `min-fresh=N`: a response must stay fresh N longer. An invalid N is
    /// ignored.
    pub min_fresh: Option<Duration>,
    /// The request carries `Authorization`: its response is stored only
    /// when it says `public`.
    pub authorization: bool,
}

impl CacheRequest {
    /// The facts of a request with `method` and `headers` (names and values
    /// as received), or why the cache leaves it alone ([`Bypass`]).
    pub fn parse<'a, H>(method: &str, headers: H) -> Result<CacheRequest, Bypass>
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    {
        let head = match method {
            "GET" => false,
            "HEAD" => true,
            _ => return Err(Bypass::Method),
        };
        let mut r = CacheRequest {
            head,
            ..CacheRequest::default()
        };
        const CONDITIONAL: [&str; 5] = [
            "if-none-match",
            "if-modified-since",
            "if-match",
            "if-unmodified-since",
            "if-range",
        ];
        for (name, value) in headers {
            if name_is(name, "cache-control") {
                r.directives(value);
            } else if name_is(name, "authorization") {
                r.authorization = true;
            } else if name_is(name, "range") {
                return Err(Bypass::Range);
            } else if CONDITIONAL.iter().any(|c| name_is(name, c)) {
                return Err(Bypass::Conditional);
            } else if name_is(name, "upgrade") {
                return Err(Bypass::Upgrade);
            } else if name_is(name, "transfer-encoding")
                || (name_is(name, "content-length") && value.trim_ascii() != b"0")
            {
                return Err(Bypass::Body);
            }
        }
        Ok(r)
    }

    fn directives(&mut self, value: &[u8]) {
        for (d, arg) in directives(value) {
            let secs = || arg.and_then(delta_seconds);
            if name_is(d, "no-store") {
                self.no_store = true;
            } else if name_is(d, "no-cache") {
                self.no_cache = true;
            } else if name_is(d, "max-age") && self.max_age.is_none() {
                self.max_age = Some(secs().unwrap_or(Duration::ZERO));
            } else if name_is(d, "max-stale") && self.max_stale.is_none() {
                self.max_stale = match arg {
                    None => Some(Duration::MAX),
                    Some(_) => secs(),
                };
            } else if name_is(d, "min-fresh") && self.min_fresh.is_none() {
                self.min_fresh = secs();
            }
        }
    }
}

/// What the cache reads from a response; built by [`ResponseFacts::parse`].
/// Directive names are case-insensitive; the first occurrence of a
/// directive or of a single-valued field counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponseFacts {
    pub status: u16,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache`, with or without field names (the qualified form is read
    /// as the unqualified one, RFC 9111 §5.2.2.4).
    pub no_cache: bool,
    /// `must-revalidate` or `proxy-revalidate`: never served stale.
    pub must_revalidate: bool,
    /// `public`: a response to a request with `Authorization` may be stored.
    pub public: bool,
    /// `max-age=N`; an invalid N counts as 0 (already stale). `s-maxage` is
    /// ignored: weir is a private cache.
    pub max_age: Option<Duration>,
    /// `Expires`; an invalid date (`0`, garbage) counts as the epoch: in
    /// the past (RFC 9111 §5.3).
    pub expires: Option<SystemTime>,
    /// `Date`; an invalid one is ignored.
    pub date: Option<SystemTime>,
    /// `Age` from upstream caches; an invalid one is ignored.
    pub age: Option<Duration>,
    /// `stale-while-revalidate=N` (RFC 5861); an invalid N is ignored.
    pub stale_while_revalidate: Option<Duration>,
    /// `stale-if-error=N` (RFC 5861); an invalid N is ignored.
    pub stale_if_error: Option<Duration>,
    /// An `ETag` is present.
    pub etag: bool,
    /// A `Last-Modified` is present.
    pub last_modified: bool,
    /// `Vary` names at least one field.
    pub vary: bool,
    /// `Vary: *`: never stored.
    pub vary_star: bool,
    /// A `Set-Cookie` is present.
    pub set_cookie: bool,
}

impl ResponseFacts {
    /// The facts of a response with `status` and `headers`.
    pub fn parse<'a, H>(status: u16, headers: H) -> ResponseFacts
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    {
        let mut r = ResponseFacts {
            status,
            ..ResponseFacts::default()
        };
        let (mut expires_seen, mut date_seen, mut age_seen) = (false, false, false);
        for (name, value) in headers {
            if name_is(name, "cache-control") {
                r.directives(value);
            } else if name_is(name, "expires") && !expires_seen {
                expires_seen = true;
                r.expires = Some(http_date(value).unwrap_or(UNIX_EPOCH));
            } else if name_is(name, "date") && !date_seen {
                date_seen = true;
                r.date = http_date(value);
            } else if name_is(name, "age") && !age_seen {
                age_seen = true;
                r.age = delta_seconds(value.trim_ascii());
            } else if name_is(name, "etag") {
                r.etag = true;
            } else if name_is(name, "last-modified") {
                r.last_modified = true;
            } else if name_is(name, "set-cookie") {
                r.set_cookie = true;
            } else if name_is(name, "vary") {
                for v in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    r.vary_star |= v == b"*";
                    r.vary |= !v.is_empty() && v != b"*";
                }
            }
        }
        r
    }

    fn directives(&mut self, value: &[u8]) {
        for (d, arg) in directives(value) {
            let secs = || arg.and_then(delta_seconds);
            if name_is(d, "no-store") {
                self.no_store = true;
            } else if name_is(d, "no-cache") {
                self.no_cache = true;
            } else if name_is(d, "must-revalidate") || name_is(d, "proxy-revalidate") {
                self.must_revalidate = true;
            } else if name_is(d, "public") {
                self.public = true;
            } else if name_is(d, "max-age") && self.max_age.is_none() {
                self.max_age = Some(secs().unwrap_or(Duration::ZERO));
            } else if name_is(d, "stale-while-revalidate") && self.stale_while_revalidate.is_none()
            {
                self.stale_while_revalidate = secs();
            } else if name_is(d, "stale-if-error") && self.stale_if_error.is_none() {
                self.stale_if_error = secs();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::policy::cache::tests::HeaderPairs;

    fn req(method: &str, h: &HeaderPairs) -> Result<CacheRequest, Bypass> {
        CacheRequest::parse(method, h.iter().copied())
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn directives_split_on_commas_outside_quotes() {
        let got: Vec<_> =
            directives(br#" max-age=60 , no-cache="set-cookie, x",, private ,X="a\"," "#).collect();
        assert_eq!(
            got,
            [
                (&b"max-age"[..], Some(&b"60"[..])),
                (b"no-cache", Some(b"set-cookie, x")),
                (b"private", None),
                (b"X", Some(br#"a\","#)),
            ]
        );
        assert_eq!(directives(b"").count(), 0);
        assert_eq!(directives(b" , ,").count(), 0);
    }

    #[test]
    fn delta_seconds_are_digits_capped_at_2_pow_31() {
        assert_eq!(delta_seconds(b"0"), Some(s(0)));
        assert_eq!(delta_seconds(b"60"), Some(s(60)));
        assert_eq!(delta_seconds(b"99999999999999999999999"), Some(s(1 << 31)));
        for bad in [&b""[..], b"-1", b"1.5", b"+3", b"6 0", b"abc"] {
            assert_eq!(delta_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn request_methods_and_bypasses() {
        assert!(!req("GET", &[]).unwrap().head);
        assert!(req("HEAD", &[]).unwrap().head);
        for m in ["POST", "PUT", "get", "OPTIONS", "CONNECT"] {
            assert_eq!(req(m, &[]), Err(Bypass::Method), "{m}");
        }
        let one = |n: &'static str, v: &'static str| req("GET", &[(n.as_bytes(), v.as_bytes())]);
        assert_eq!(one("Range", "bytes=0-9"), Err(Bypass::Range));
        for c in [
            "if-none-match",
            "If-Modified-Since",
            "if-match",
            "if-unmodified-since",
            "if-range",
        ] {
            assert_eq!(one(c, "x"), Err(Bypass::Conditional), "{c}");
        }
        assert_eq!(one("upgrade", "websocket"), Err(Bypass::Upgrade));
        assert_eq!(one("transfer-encoding", "chunked"), Err(Bypass::Body));
        assert_eq!(one("content-length", "3"), Err(Bypass::Body));
        assert!(one("content-length", " 0 ").is_ok());
        assert!(one("authorization", "Bearer x").unwrap().authorization);
    }

    #[test]
    fn request_cache_control() {
        let cc = |v: &'static str| req("GET", &[(b"Cache-Control", v.as_bytes())]).unwrap();
        assert!(cc("no-store").no_store);
        assert!(cc("No-Cache").no_cache);
        assert_eq!(cc("max-age=0").max_age, Some(s(0)));
        assert_eq!(cc("max-age=\"30\"").max_age, Some(s(30)));
        assert_eq!(cc("max-age=abc").max_age, Some(s(0)));
        assert_eq!(cc("max-age=5, max-age=9").max_age, Some(s(5)));
        assert_eq!(cc("max-stale").max_stale, Some(Duration::MAX));
        assert_eq!(cc("max-stale=10").max_stale, Some(s(10)));
        assert_eq!(cc("max-stale=x").max_stale, None);
        assert_eq!(cc("min-fresh=7").min_fresh, Some(s(7)));
        assert_eq!(cc("min-fresh=-7").min_fresh, None);
        // Several field lines add up.
        let two = [
            (&b"cache-control"[..], &b"max-age=3"[..]),
            (b"cache-control", b"no-store"),
        ];
        let r = req("GET", &two).unwrap();
        assert_eq!((r.max_age, r.no_store), (Some(s(3)), true));
    }

    #[test]
    fn response_facts() {
        let h: &HeaderPairs = &[
            (b"Cache-Control", b"public, max-age=60, s-maxage=5"),
            (
                b"cache-control",
                b"stale-while-revalidate=10, stale-if-error=\"600\"",
            ),
            (b"Date", b"Sun, 06 Nov 1994 08:49:37 GMT"),
            (b"Expires", b"Sun, 06 Nov 1994 08:59:37 GMT"),
            (b"expires", b"0"),
            (b"Age", b" 12 "),
            (b"ETag", b"\"v1\""),
            (b"Last-Modified", b"Sat, 05 Nov 1994 08:49:37 GMT"),
            (b"Vary", b"accept-encoding, , X-Tenant"),
        ];
        let r = ResponseFacts::parse(200, h.iter().copied());
        let t = UNIX_EPOCH + s(784_111_777);
        assert_eq!(r.max_age, Some(s(60)));
        assert_eq!(r.stale_while_revalidate, Some(s(10)));
        assert_eq!(r.stale_if_error, Some(s(600)));
        assert_eq!((r.date, r.expires), (Some(t), Some(t + s(600))));
        assert_eq!(r.age, Some(s(12)));
        assert!(r.public && r.etag && r.last_modified && r.vary && !r.vary_star);
        assert!(!r.no_store && !r.no_cache && !r.must_revalidate && !r.set_cookie);

        let h: &HeaderPairs = &[
            (
                b"cache-control",
                b"no-cache=\"set-cookie\", proxy-revalidate, max-age=x",
            ),
            (b"cache-control", b"no-store, stale-if-error=soon"),
            (b"expires", b"0"),
            (b"date", b"yesterday"),
            (b"age", b"-3"),
            (b"vary", b"*"),
            (b"set-cookie", b"a=b"),
        ];
        let r = ResponseFacts::parse(404, h.iter().copied());
        assert!(r.no_cache && r.must_revalidate && r.no_store && r.vary_star && r.set_cookie);
        assert!(!r.vary);
        assert_eq!(r.max_age, Some(s(0)));
        assert_eq!(r.stale_if_error, None);
        assert_eq!((r.expires, r.date, r.age), (Some(UNIX_EPOCH), None, None));
        assert_eq!(r.status, 404);
    }
}
