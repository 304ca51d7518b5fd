//! The parsed request: every rule weir reads off a client's request head,
//! written once over either codec's head. The fast path views its httparse
//! fields through [`RequestHead`], the general path `http::request::Parts`; both
//! route with [`route`] and read the rest with [`read`]: the client's own
//! deadline, the rate limiter's key, the idempotency key and who it belongs
//! to. What each codec does with a refusal differs only in who answers it:
//! the general path answers 400 itself, the fast path hands the connection
//! to the general path, which answers the same bytes the same way.
//!
//! Which fields are not forwarded ([`dropped`]) is written here too; the
//! fast path filters as it copies the head, the general path removes them
//! from its header map (`headers::strip_hop_by_hop`).

use super::error::ProxyError;
use super::route::host_of;
use super::{ListenerRole, Snapshot};
use crate::config::UpstreamConfig;
use crate::h1::HOP_BY_HOP;
use crate::policy::idempotency::{parse_key, ScopePart, MAX_KEY_BYTES};
use std::time::Duration;

/// A client's request head, as either codec carries it.
pub(crate) trait RequestHead {
    /// The method, as sent.
    fn method(&self) -> &str;
    /// The target's authority, when the target came in absolute form
    /// (HTTP/1) or with `:authority` (HTTP/2).
    fn authority(&self) -> Option<&str>;
    /// The target's path, without the query.
    fn path(&self) -> &str;
    /// Every field, in the order it came: the name and the value's bytes.
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])>;
    /// The first `Host` field, as text (a codec that parsed it already
    /// says so without another pass).
    fn host_field(&self) -> Option<&str> {
        let (_, v) = self
            .fields()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))?;
        std::str::from_utf8(v).ok().map(str::trim)
    }
}

/// Every value of the field `name`, in order.
pub(crate) fn values<'h: 'i, 'n: 'i, 'i>(
    h: &'h impl RequestHead,
    name: &'n str,
) -> impl Iterator<Item = &'h [u8]> + 'i {
    h.fields()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// The host a request names, for routing: its target's authority, else its
/// first `Host` field; the port dropped (docs/reference/routing.md#routing).
pub(crate) fn host(h: &impl RequestHead) -> Option<&str> {
    let raw = match h.authority() {
        Some(a) => a,
        None => h.host_field()?,
    };
    Some(host_of(raw))
}

/// The upstream a request goes to, by its index in the snapshot: on the
/// shared listener by host and path (a CONNECT, whose target has no path,
/// routes as `/`), on a dedicated one its upstream.
pub(crate) fn route(snap: &Snapshot, role: &ListenerRole, h: &impl RequestHead) -> Option<usize> {
    match role {
        ListenerRole::Shared => {
            let path = if h.method() == "CONNECT" {
                "/"
            } else {
                h.path()
            };
            snap.routes.lookup(host(h)?, path)
        }
        ListenerRole::Dedicated(name) => snap.upstreams.iter().position(|u| &u.config.name == name),
    }
}

/// What a routed request says about itself, read once for the path that
/// serves it.
#[derive(Debug, Default, Clone)]
pub struct Parsed {
    /// The request's id: the client's `x-request-id`, or one weir made,
    /// which both paths forward to the upstream (docs/reference/logs.md#logs).
    pub request_id: RequestId,
    /// `x-weir-timeout-ms`: the client's own, lower, deadline.
    pub lowered: Option<Duration>,
    /// The rate limiter's key, when the upstream keys its limiter.
    pub rate_key: Option<String>,
    /// The key a keyed write's record is kept under: the client's
    /// idempotency key and who asked ([`scoped`]); `None` for a request
    /// the upstream's store does not apply to.
    pub key: Option<String>,
    /// The request carries an idempotency key the upstream will receive,
    /// store or not: the retry decision may then replay a write
    /// (docs/reference/retries.md#classifying-an-attempt).
    pub carries_key: bool,
    /// Who asked, for client-side throttling ([`caller`]); `None` with
    /// throttling off.
    pub caller: Option<u64>,
}

/// Reads what the upstream's policy needs from a routed request, in one
/// pass over its fields. `Err` is a 400 with its reason: an
/// `x-weir-timeout-ms` that is not a number, an idempotency key that is
/// empty, too long or not text, or two of them.
pub(crate) fn read(cfg: &UpstreamConfig, h: &impl RequestHead) -> Result<Parsed, ProxyError> {
    let rate_name = rate_key_field(cfg);
    let key_name = cfg.idempotency_header.as_str();
    let (mut timeout, mut rate, mut key, mut keys) = (None, None, None, 0);
    let (mut id, mut ids) = (None, 0);
    for (n, v) in h.fields() {
        if timeout.is_none() && n.eq_ignore_ascii_case(TIMEOUT_FIELD) {
            timeout = Some(v);
        } else if rate.is_none() && rate_name.is_some_and(|r| n.eq_ignore_ascii_case(r)) {
            rate = Some(v);
        } else if n.eq_ignore_ascii_case(REQUEST_ID_FIELD) {
            ids += 1;
            id = id.or(Some(v));
        }
        if n.eq_ignore_ascii_case(key_name) {
            keys += 1;
            key = key.or(Some(v));
        }
    }
    let lowered = match timeout {
        Some(v) => Some(lowered(v).map_err(|why| ProxyError::BadRequest(why.into()))?),
        None => None,
    };
    // A key field its `Connection` names is for this hop only.
    let carries_key = key.is_some() && !dropped(key_name) && !named_by_connection(h, key_name);
    let key = match idempotency_key(cfg, h.method(), key.filter(|_| carries_key), keys)? {
        Some(k) => Some(scoped(key_text(cfg, k)?, principal(cfg, h).as_deref())),
        None => None,
    };
    // The client's, when it sent one it can be known by; else weir's own,
    // forwarded in place of whatever it sent.
    let request_id = match id.filter(|_| ids == 1).and_then(given_request_id) {
        Some(given) => RequestId::Given(given.to_owned()),
        None => RequestId::made(),
    };
    let rate_key = rate.and_then(visible).map(str::to_owned);
    let caller = match cfg.throttle {
        Some(_) => caller(cfg, h, rate_key.as_deref()),
        None => None,
    };
    Ok(Parsed {
        request_id,
        lowered,
        rate_key,
        key,
        carries_key,
        caller,
    })
}

/// Credential fields that tell callers apart when no rate-limit key or
/// idempotency scope says otherwise.
const CALLER_FIELDS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
];

/// Who asked, as client-side throttling counts an answer that names one
/// caller's quota (docs/reference/admission.md#client-side-throttling): a
/// hash of the rate limit's key when the limiter is keyed, else of the
/// common credential fields and any other field the idempotency scope
/// names. `None` when the request carries none of them: such
/// an answer is then nobody's, and throttles no one. Kept only in memory,
/// never shown.
pub(crate) fn caller(
    cfg: &UpstreamConfig,
    h: &impl RequestHead,
    rate_key: Option<&str>,
) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(k) = rate_key {
        (0u8, k).hash(&mut hasher);
        return Some(hasher.finish());
    }
    let mut any = false;
    let mut feed = |name: &str| {
        for v in values(h, name) {
            any = true;
            (name, v).hash(&mut hasher);
        }
    };
    CALLER_FIELDS.iter().for_each(|f| feed(f));
    // An app's own credential field, named in the store's scope.
    if let Some(i) = &cfg.idempotency {
        for part in &i.scope {
            if let ScopePart::Header(name) = part {
                if !CALLER_FIELDS.iter().any(|f| f.eq_ignore_ascii_case(name)) {
                    feed(name);
                }
            }
        }
    }
    any.then(|| hasher.finish())
}

/// The field that names a request across services.
pub(crate) const REQUEST_ID_FIELD: &str = "x-request-id";

/// The longest client request id weir keeps (Envoy-like: a UUID is 36
/// bytes, a W3C trace id 32).
pub(crate) const MAX_REQUEST_ID: usize = 128;

/// A client's `x-request-id` value weir keeps and forwards as it came: 1 to
/// [`MAX_REQUEST_ID`] bytes of visible ASCII (docs/reference/logs.md#logs).
/// Any other — empty, longer, with a space, a control or a non-ASCII byte —
/// is replaced by weir's own, as is a request with two of them.
pub(crate) fn given_request_id(v: &[u8]) -> Option<&str> {
    if v.is_empty() || v.len() > MAX_REQUEST_ID || !v.iter().all(u8::is_ascii_graphic) {
        return None;
    }
    std::str::from_utf8(v).ok()
}

/// A request's id (`x-request-id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestId {
    /// The client's one [`given_request_id`], forwarded as it came.
    Given(String),
    /// One weir made, by its count in this process: forwarded to the
    /// upstream as `x-request-id`, 32 hex digits, this process's random
    /// half and the count ([`RequestId::made_text`]).
    Made(u64),
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::made()
    }
}

impl RequestId {
    /// A new id, unique within this process and, by its random half,
    /// across processes.
    pub fn made() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        RequestId::Made(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id weir made, as the 32 hex digits it forwards; `None` for the
    /// client's own (forwarded among its fields).
    pub fn made_text<'b>(&self, buf: &'b mut [u8; 32]) -> Option<&'b str> {
        let bytes = self.made_bytes(buf)?;
        std::str::from_utf8(bytes).ok()
    }

    /// [`RequestId::made_text`] as bytes, for a head written as bytes.
    pub fn made_bytes<'b>(&self, buf: &'b mut [u8; 32]) -> Option<&'b [u8]> {
        let RequestId::Made(n) = self else {
            return None;
        };
        // This process's half, written out once.
        static PROCESS: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
        let process = PROCESS.get_or_init(|| {
            let mut half = [0u8; 16];
            hex(crate::clock::fresh_seed(), &mut half);
            half
        });
        let (high, low) = buf.split_at_mut(16);
        high.copy_from_slice(process);
        if let Ok(low) = <&mut [u8; 16]>::try_from(low) {
            hex(*n, low);
        }
        Some(buf)
    }

    /// The id as the access log prints it.
    pub fn text<'b>(&'b self, buf: &'b mut [u8; 32]) -> Option<&'b str> {
        match self {
            RequestId::Given(given) => Some(given),
            RequestId::Made(_) => self.made_text(buf),
        }
    }
}

/// `n` as 16 lowercase hex digits.
fn hex(n: u64, out: &mut [u8; 16]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in n.to_be_bytes().into_iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(byte >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// The field a client lowers its deadline with.
const TIMEOUT_FIELD: &str = "x-weir-timeout-ms";

/// An `x-weir-timeout-ms` value: a whole number of milliseconds
/// (docs/reference/deadlines.md#deadlines-and-timeouts).
fn lowered(v: &[u8]) -> Result<Duration, &'static str> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or("x-weir-timeout-ms must be a whole number of milliseconds")
}

/// The field the rate limiter is keyed by (`[….rate_limit] key =
/// "header:NAME"`), if any.
fn rate_key_field(cfg: &UpstreamConfig) -> Option<&str> {
    let crate::policy::limiter::KeySource::Header(name) = cfg.rate_limit.as_ref()?.key.as_ref()?;
    Some(name)
}

/// The rate limiter's key: the first such field, when it is text
/// (docs/reference/admission.md#rate-limits).
pub(crate) fn rate_key(cfg: &UpstreamConfig, h: &impl RequestHead) -> Option<String> {
    let v = values(h, rate_key_field(cfg)?).next()?;
    visible(v).map(str::to_owned)
}

/// A header value as `http::HeaderValue::to_str` would accept it.
fn visible(v: &[u8]) -> Option<&str> {
    if v.iter().all(|b| *b == b'\t' || (0x20..0x7f).contains(b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

/// The idempotency key of a request the upstream's store applies to
/// (docs/reference/idempotency.md#idempotency-keys), from the first of the
/// `count` key fields it carries; `Ok(None)` when the store applies to
/// none (no store, another method, no key). An empty or over-long key, or
/// two key fields (which one did the client mean?), is a 400.
fn idempotency_key<'v>(
    cfg: &UpstreamConfig,
    method: &str,
    first: Option<&'v [u8]>,
    count: usize,
) -> Result<Option<&'v [u8]>, ProxyError> {
    let (Some(params), Some(first)) = (&cfg.idempotency, first) else {
        return Ok(None);
    };
    if !params.applies_to(method) {
        return Ok(None);
    }
    if count > 1 {
        let name = &cfg.idempotency_header;
        return Err(ProxyError::BadRequest(format!(
            "more than one {name} header"
        )));
    }
    match first.len() {
        1..=MAX_KEY_BYTES => Ok(Some(first)),
        _ => Err(bad_key(cfg)),
    }
}

/// A key [`idempotency_key`] let through, as text; not text: a 400.
fn key_text<'v>(cfg: &UpstreamConfig, key: &'v [u8]) -> Result<&'v str, ProxyError> {
    parse_key(key).ok_or_else(|| bad_key(cfg))
}

fn bad_key(cfg: &UpstreamConfig) -> ProxyError {
    ProxyError::BadRequest(format!(
        "the {} header must be 1 to 255 bytes of text",
        cfg.idempotency_header
    ))
}

/// The principal a keyed request's record is scoped to
/// (`[….idempotency] scope`, docs/reference/idempotency.md#idempotency-keys): `~` and
/// 32 hex digits over every value of each part; `None` without a scope.
pub(crate) fn principal(cfg: &UpstreamConfig, h: &impl RequestHead) -> Option<String> {
    let scope = &cfg.idempotency.as_ref()?.scope;
    let all = |name: &str| -> Vec<&[u8]> { values(h, name).collect() };
    crate::policy::idempotency::principal(scope, |part| match part {
        ScopePart::Authorization => all("authorization"),
        ScopePart::Cookie => all("cookie"),
        ScopePart::Host => match h.authority() {
            Some(a) => vec![a.as_bytes()],
            None => all("host"),
        },
        ScopePart::Header(name) => all(name),
    })
}

/// The key the store keeps a request's record under: the client's key and
/// its principal.
fn scoped(key: &str, principal: Option<&str>) -> String {
    match principal {
        Some(who) => [key, who].concat(),
        None => key.to_string(),
    }
}

/// Fields never forwarded as they came, in either direction
/// (docs/reference/routing.md#header-hygiene): RFC 9110's hop-by-hop list and the
/// proxy credentials meant for weir itself, `Transfer-Encoding` (each side
/// frames its own), `x-weir-*`, and names that read as `Content-Length`,
/// `Transfer-Encoding` or `Host` once `_` is taken for `-`. Besides these,
/// whatever a `Connection` field names ([`named_by_connection`]).
pub(crate) fn dropped(name: &str) -> bool {
    // By length first: every field of every request passes here, and most
    // (`host`, `accept`, `user-agent`) are none of these.
    let eq = |n: &str| n.eq_ignore_ascii_case(name);
    let listed = match name.len() {
        2 | 7 | 10 | 16 | 18 | 19 => HOP_BY_HOP.iter().any(|h| eq(h)),
        17 => eq("transfer-encoding"),
        _ => false,
    };
    listed
        || (name.len() >= 7 && name.as_bytes()[..7].eq_ignore_ascii_case(b"x-weir-"))
        || is_lookalike(name)
}

/// Whether a field name reads as `Content-Length`, `Transfer-Encoding` or
/// `Host` once `_` is taken for `-`, as CGI-style servers (PHP, WSGI) map
/// both to the same variable: `Content_Length` must not reach an upstream
/// that may frame or route by it (nginx drops such names too). Both paths
/// drop them.
fn is_lookalike(name: &str) -> bool {
    // By length first (every field passes here): only these lengths can
    // match, and looking for `_` in every other name costs a search.
    matches!(name.len(), 4 | 14 | 17)
        && name.as_bytes().contains(&b'_')
        && ["content-length", "transfer-encoding", "host"]
            .iter()
            .any(|f| {
                f.len() == name.len()
                    && f.bytes()
                        .zip(name.bytes())
                        .all(|(a, b)| a == b.to_ascii_lowercase() || (a == b'-' && b == b'_'))
            })
}

/// Whether a `Content-Type` value says gRPC (docs/reference/protocols.md#grpc).
pub(crate) fn grpc_content_type(value: &[u8]) -> bool {
    value.starts_with(b"application/grpc")
}

/// Whether a `Connection` field of the head names `name`.
pub(crate) fn named_by_connection(h: &impl RequestHead, name: &str) -> bool {
    values(h, "connection").any(|v| crate::h1::has_token(v, name.as_bytes()))
}

impl RequestHead for http::request::Parts {
    fn method(&self) -> &str {
        self.method.as_str()
    }
    fn authority(&self) -> Option<&str> {
        self.uri.authority().map(|a| a.as_str())
    }
    fn path(&self) -> &str {
        self.uri.path()
    }
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parts(req: http::request::Builder) -> http::request::Parts {
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_host_is_the_authority_else_the_first_host_field() {
        let p = parts(http::Request::get("http://Payments:8080/x").header("host", "other"));
        assert_eq!(host(&p), Some("Payments"));
        let p = parts(http::Request::get("/x").header("host", "[::1]:80"));
        assert_eq!(host(&p), Some("::1"));
        let p = parts(http::Request::get("/x"));
        assert_eq!(host(&p), None);
    }

    #[test]
    fn the_clients_deadline_is_a_number_of_milliseconds() {
        let toml = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n";
        let cfg = crate::config::Config::parse(std::path::Path::new("t.toml"), toml).unwrap();
        let up = &cfg.upstreams[0];
        let p = parts(http::Request::get("/").header("x-weir-timeout-ms", " 100 "));
        assert_eq!(
            read(up, &p).unwrap().lowered,
            Some(Duration::from_millis(100))
        );
        let p = parts(http::Request::get("/").header("x-weir-timeout-ms", "soon"));
        assert!(read(up, &p).is_err());
        assert_eq!(
            read(up, &parts(http::Request::get("/"))).unwrap().lowered,
            None
        );
    }

    #[test]
    fn made_ids_are_32_hex_digits_and_distinct() {
        let (a, b) = (RequestId::made(), RequestId::made());
        let (mut x, mut y) = ([0u8; 32], [0u8; 32]);
        let (a, b) = (a.made_text(&mut x).unwrap(), b.made_text(&mut y).unwrap());
        assert_ne!(a, b);
        assert_eq!(a[..16], b[..16], "one process, one random half");
        assert!(
            a.len() == 32
                && a.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        let mut z = [0u8; 16];
        hex(0x0123_4567_89ab_cdef, &mut z);
        assert_eq!(&z, b"0123456789abcdef");
        assert_eq!(RequestId::Given("r-1".into()).made_text(&mut x), None);
    }

    #[test]
    fn a_given_request_id_is_1_to_128_bytes_of_visible_ascii() {
        let longest = "a".repeat(128);
        for ok in ["r-1", "0f8fad5b-d9cb-469f-a165-70867728950e", &longest] {
            assert_eq!(given_request_id(ok.as_bytes()), Some(ok));
        }
        let long = "a".repeat(129);
        for bad in [
            "",
            &long,
            "two words",
            "tab\there",
            "caf\u{e9}",
            "\u{202e}x",
        ] {
            assert_eq!(given_request_id(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn dropped_fields() {
        for n in [
            "Connection",
            "TE",
            "transfer-encoding",
            "X-Weir-Attempts",
            "Content_Length",
            "proxy-authorization",
        ] {
            assert!(dropped(n), "{n}");
        }
        for n in ["content-type", "trailer", "x-weirdo", "authorization"] {
            assert!(!dropped(n), "{n}");
        }
        let p = parts(http::Request::get("/").header("connection", "close, X-Private"));
        assert!(named_by_connection(&p, "x-private"));
        assert!(!named_by_connection(&p, "x-public"));
    }
}
