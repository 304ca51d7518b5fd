//! The response cache (docs/reference/cache.md#response-cache): a bounded,
//! private (one application's) HTTP cache per upstream with RFC 9111
//! freshness, RFC 5861 `stale-while-revalidate` and `stale-if-error`, and
//! the bookkeeping for request coalescing.
//!
//! Owns: what the cache reads from requests and responses
//! ([`CacheRequest`], [`ResponseFacts`], in `cache/directives.rs`); whether
//! a response may be stored and for how long ([`storable`] → [`Freshness`]);
//! what a request gets from a stored entry ([`lookup_decision`] →
//! [`Decision`], [`on_error`]); the refresh by a 304 ([`on_not_modified`],
//! in `cache/entry.rs` with the stored form [`CachedResponse`]); the bounded
//! store ([`CacheStore`], `cache/store.rs`); and the registry of fills and
//! background refreshes in progress ([`FillRegistry`], `cache/fill.rs`).
//! Pure like the rest of `policy`: monotonic `now` for ages, and a
//! wall-clock `SystemTime` argument where HTTP dates are compared (`Date`,
//! `Expires`); nothing here reads a clock, waits or does I/O.
//!
//! **How the data plane calls it.** Per request: [`CacheRequest::parse`]
//! (a [`Bypass`] leaves the cache out entirely), [`CacheStore::lookup`]
//! under the store's mutex (every store operation is O(1) but for a walk of
//! at most [`MAX_VARIANTS`] variants; never held across an await), then by
//! the [`Decision`]: serve, serve and refresh in the background
//! ([`FillRegistry::begin_refresh`]: at most one per key), revalidate, or
//! fill ([`FillRegistry::begin_fill`]: one leader per key, the others wait
//! for it and look up again). A response is kept when [`storable`] gives
//! it a [`Freshness`] and [`CacheStore::insert`] finds room; a 304 goes
//! through [`on_not_modified`]; a failed revalidation asks [`on_error`].
//! Every request the cache handled is counted once with its
//! [`CacheResult`] ([`CacheStore::count`]), the value of its `x-weir-cache`
//! header.
//!
//! **Byte accounting** ([`CacheStore::entry_bytes`], bounded by
//! `max_bytes`): per entry, [`ENTRY_OVERHEAD`], plus the key's bytes, plus
//! the secondary key's (the request's values of the fields `Vary` names),
//! plus the stored field block (each header kept as `name: value\r\n`),
//! plus the body. The stored bytes are exactly those: the field block and
//! the body are each one allocation of their exact length (the body is
//! copied into one when stored). The constant stands for every other byte
//! an entry really costs, measured with a counting allocator and against
//! RSS (the method and figures are at [`ENTRY_OVERHEAD`]): the key's and
//! the response's allocations and the two shared-buffer headers `Bytes`
//! adds once a stored buffer is handed out, each rounded up by the
//! allocator; the slab slot and its links; the map's bucket; and the
//! slab's and the map's spare capacity. Every variant counts the key in
//! full though they share it. When an insert takes the store over
//! `max_bytes`, the least recently used entries are evicted until it is
//! within.

use super::{Now, PolicyError};
use std::time::{Duration, SystemTime};

mod directives;
mod entry;
mod fill;
mod store;

pub use directives::{CacheRequest, ResponseFacts, DELTA_SECONDS_MAX};
pub use entry::{on_not_modified, CachedResponse, Fields, Refreshed};
pub use fill::{Fill, FillRegistry};
pub use store::{CacheStore, Lookup};

/// The fixed cost counted for every entry on top of its key, secondary key,
/// field block and body.
///
/// Measured on glibc malloc (x86-64; the release image is Debian's), with a
/// counting global allocator in a harness outside the crate (which forbids
/// `unsafe`) that rounds each request up to its malloc chunk (`max(32,
/// (n + 8 + 15) & !15)`), over stores of 1 000 to 131 000 entries (keys of
/// 24 bytes, 6 or 7 fields, bodies of 10 to 60 000 bytes, each entry
/// served once so that `Bytes` has made its two shared headers). An entry
/// makes 6 allocations, 7 with `Vary`: the key (shared by its variants),
/// the `Arc`'d response (176 bytes), its field block and body and their
/// two shared headers, the secondary key. Beyond the bytes counted, it
/// really holds 446 to 471 bytes while the slab and the map are full, up
/// to 536 just after both grew (2× spare capacity); process RSS over the
/// same stores agreed (424 to 483 per entry from 58 000 entries up; 570
/// at 1 000, where page granularity dominates). Bodies of 128 KiB and more
/// are mmapped and rounded up to the page: at most 4 KiB more, under 3 %
/// of such a body. `overhead_covers_an_entrys_fixed_structures` holds that the
/// constant covers the fixed structures with the allocator's minimum chunk
/// per allocation and half the spare capacity.
pub const ENTRY_OVERHEAD: usize = 576;

/// The most variants (responses told apart by `Vary`) kept per key; a new
/// one past it evicts the key's oldest.
pub const MAX_VARIANTS: usize = 8;

/// The statuses whose responses may be stored: the heuristically cacheable
/// ones of RFC 9110 §15.1 (206 and 304 never: weir stores whole responses
/// only).
pub const STORABLE_STATUSES: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

/// The response header that says how the cache answered.
pub const CACHE_HEADER: &str = "x-weir-cache";

/// The cache's parameters (`[….cache]`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheParams {
    /// The whole store's bound, in accounted bytes.
    pub max_bytes: usize,
    /// A response whose field block and body exceed this is not stored.
    pub max_object_bytes: usize,
    /// The freshness lifetime of a response that gives none (no `max-age`,
    /// no `Expires`); zero: such a response is not stored.
    pub default_ttl: Duration,
    /// The `stale-while-revalidate` window of a response that gives none.
    pub stale_while_revalidate: Duration,
    /// The `stale-if-error` window of a response that gives none.
    pub stale_if_error: Duration,
    /// Whether a response with `Set-Cookie` may be stored (and its cookie
    /// served to every client of the entry).
    pub store_set_cookie: bool,
}

impl CacheParams {
    /// Validates the fields; an error names the field, relative to the table.
    pub fn try_new(
        max_bytes: u64,
        max_object_bytes: u64,
        default_ttl: Duration,
        stale_while_revalidate: Duration,
        stale_if_error: Duration,
        store_set_cookie: bool,
    ) -> Result<Self, PolicyError> {
        if max_object_bytes > max_bytes {
            return Err(PolicyError::new(
                "max_object_bytes",
                format!("must be ≤ max_bytes ({max_bytes}), got {max_object_bytes}: the cache could never hold such a response"),
            ));
        }
        if max_bytes == 0 {
            return Err(PolicyError::new(
                "max_bytes",
                "must be at least 1 (`enabled = false` turns the cache off)",
            ));
        }
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(CacheParams {
            max_bytes: size(max_bytes),
            max_object_bytes: size(max_object_bytes),
            default_ttl,
            stale_while_revalidate,
            stale_if_error,
            store_set_cookie,
        })
    }
}

/// Why a request is left to go upstream without the cache: nothing is
/// looked up, stored or coalesced, and it carries no `x-weir-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bypass {
    /// Neither GET nor HEAD.
    Method,
    /// A `Range` request: weir stores whole responses only.
    Range,
    /// The client's own conditional (`If-None-Match`, `If-Modified-Since`,
    /// `If-Match`, `If-Unmodified-Since`, `If-Range`): its answer (a 304, a
    /// 412) is the client's alone.
    Conditional,
    /// An `Upgrade` request (WebSocket).
    Upgrade,
    /// A GET or HEAD with a body.
    Body,
}

/// How the cache answered a request: the `x-weir-cache` header's value and
/// the `result` label of `weir_cache_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheResult {
    /// Served from a fresh entry; no attempt made.
    Hit,
    /// Forwarded: nothing usable was stored.
    Miss,
    /// Served from a stale entry within `stale-while-revalidate` (or the
    /// request's `max-stale`); one background refresh.
    Stale,
    /// Served from a stale entry within `stale-if-error` because the
    /// upstream failed.
    StaleIfError,
    /// The upstream answered the conditional request 304: served from the
    /// refreshed entry.
    Revalidated,
    /// Answered with the response another request for the same key fetched.
    Coalesced,
}

impl CacheResult {
    pub const ALL: [CacheResult; 6] = [
        CacheResult::Hit,
        CacheResult::Miss,
        CacheResult::Stale,
        CacheResult::StaleIfError,
        CacheResult::Revalidated,
        CacheResult::Coalesced,
    ];

    /// The header value and metric label.
    pub fn name(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Stale => "stale",
            CacheResult::StaleIfError => "stale-if-error",
            CacheResult::Revalidated => "revalidated",
            CacheResult::Coalesced => "coalesced",
        }
    }
}

/// A store's size and counters, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct CacheStats {
    /// Entries held now.
    pub entries: usize,
    /// Their accounted bytes (`weir_cache_bytes`).
    pub bytes: usize,
    /// Requests by [`CacheResult`], as counted with [`CacheStore::count`].
    pub hits: u64,
    pub misses: u64,
    pub stale: u64,
    pub stale_if_error: u64,
    pub revalidated: u64,
    pub coalesced: u64,
    /// Responses stored (new entries and replacements).
    pub stored: u64,
    /// Entries evicted for room: by bytes, or a key's variant past
    /// [`MAX_VARIANTS`] (`weir_cache_evictions_total`).
    pub evictions: u64,
    /// Entries dropped at a lookup because nothing could use them any more.
    pub expired: u64,
}

impl CacheStats {
    /// The count of one result.
    pub fn result(&self, r: CacheResult) -> u64 {
        match r {
            CacheResult::Hit => self.hits,
            CacheResult::Miss => self.misses,
            CacheResult::Stale => self.stale,
            CacheResult::StaleIfError => self.stale_if_error,
            CacheResult::Revalidated => self.revalidated,
            CacheResult::Coalesced => self.coalesced,
        }
    }
}

/// How long a stored response may be used, and how: what [`storable`]
/// gives a response it allows to be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Freshness {
    /// The freshness lifetime (RFC 9111 §4.2.1): `max-age`, else `Expires`
    /// − `Date`, else `default_ttl`.
    pub lifetime: Duration,
    /// How long past its lifetime it may be served while one background
    /// refresh runs; zero with `must_revalidate` or `no_cache`.
    pub stale_while_revalidate: Duration,
    /// How long past its lifetime it may be served when the upstream fails;
    /// zero with `must_revalidate` or `no_cache`.
    pub stale_if_error: Duration,
    /// `must-revalidate` / `proxy-revalidate`: never served stale.
    pub must_revalidate: bool,
    /// `no-cache`: revalidated before every use.
    pub no_cache: bool,
    /// Its age when received (RFC 9111 §4.2.3, without the response delay):
    /// the larger of `Age` and the time since its `Date`.
    pub initial_age: Duration,
    /// It has an `ETag` to revalidate with (`If-None-Match`).
    pub etag: bool,
    /// It has a `Last-Modified` to revalidate with (`If-Modified-Since`).
    pub last_modified: bool,
}

impl Freshness {
    /// It can be revalidated with a conditional request.
    pub fn validators(&self) -> bool {
        self.etag || self.last_modified
    }

    /// Whether any request could ever be answered from it without a full
    /// response from upstream.
    fn useful(&self) -> bool {
        let usable_unvalidated = !self.lifetime.is_zero()
            || !self.stale_while_revalidate.is_zero()
            || !self.stale_if_error.is_zero();
        self.validators() || (!self.no_cache && usable_unvalidated)
    }
}

/// Whether the response to `req` may be stored, and if so its
/// [`Freshness`]. `received` is the wall-clock time it arrived (what `Date`
/// and `Expires` are measured against).
///
/// Not stored: the response to a HEAD; a request or response with
/// `no-store`; a status outside [`STORABLE_STATUSES`]; `Vary: *`;
/// `Set-Cookie` unless `store_set_cookie`; the response to a request with
/// `Authorization` unless it says `public`; a response with no freshness
/// lifetime of its own when `default_ttl` is zero (unless `no-cache` with a
/// validator: revalidated every time); and one no request could ever use
/// without fetching it again (no lifetime, no stale windows, no validator).
pub fn storable(
    req: &CacheRequest,
    resp: &ResponseFacts,
    params: &CacheParams,
    received: SystemTime,
) -> Option<Freshness> {
    if req.head
        || req.no_store
        || resp.no_store
        || !STORABLE_STATUSES.contains(&resp.status)
        || resp.vary_star
        || (resp.set_cookie && !params.store_set_cookie)
        || (req.authorization && !resp.public)
    {
        return None;
    }
    let date = resp.date.unwrap_or(received);
    let explicit = resp.max_age.or_else(|| {
        let expires = resp.expires?;
        Some(expires.duration_since(date).unwrap_or_default())
    });
    let validators = resp.etag || resp.last_modified;
    let lifetime = match explicit {
        Some(l) => l,
        None if !params.default_ttl.is_zero() => params.default_ttl,
        None if resp.no_cache && validators => Duration::ZERO,
        None => return None,
    };
    let never_stale = resp.must_revalidate || resp.no_cache;
    let window = |own: Option<Duration>, default: Duration| match never_stale {
        true => Duration::ZERO,
        false => own.unwrap_or(default),
    };
    let apparent = received.duration_since(date).unwrap_or_default();
    let f = Freshness {
        lifetime,
        stale_while_revalidate: window(resp.stale_while_revalidate, params.stale_while_revalidate),
        stale_if_error: window(resp.stale_if_error, params.stale_if_error),
        must_revalidate: resp.must_revalidate,
        no_cache: resp.no_cache,
        initial_age: apparent.max(resp.age.unwrap_or_default()),
        etag: resp.etag,
        last_modified: resp.last_modified,
    };
    f.useful().then_some(f)
}

/// Whether the response with `status` to a request with `method`
/// invalidates what is stored for its target ([`CacheStore::invalidate`]):
/// RFC 9111 §4.4 — a method that is not safe (anything but GET, HEAD,
/// OPTIONS and TRACE) answered with a non-error status (2xx, 3xx).
pub fn invalidates(method: &str, status: u16) -> bool {
    !matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE") && (200..400).contains(&status)
}

/// What a request gets from a stored entry ([`lookup_decision`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Serve it (`x-weir-cache: hit`); no attempt.
    Fresh,
    /// Serve it at once (`x-weir-cache: stale`) and refresh it in the
    /// background, at most one refresh per key.
    StaleWhileRevalidate,
    /// Forward the request with these validators (`If-None-Match`,
    /// `If-Modified-Since`; both `None`: unconditionally) and keep the
    /// entry for a 304 ([`on_not_modified`]) or a failure ([`on_error`]).
    Revalidate {
        etag: Option<bytes::Bytes>,
        last_modified: Option<bytes::Bytes>,
    },
    /// Nothing usable: forward (coalesced) and store the response if
    /// [`storable`]. With an entry, the entry is of no use to anyone any
    /// more and the store drops it.
    Miss,
}

impl Decision {
    /// The decision's name in fixtures and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Fresh => "fresh",
            Decision::StaleWhileRevalidate => "stale_while_revalidate",
            Decision::Revalidate { .. } => "revalidate",
            Decision::Miss => "miss",
        }
    }
}

/// What `req` gets from `entry` at `now`. In order:
///
/// 1. The entry's or the request's `no-cache` → revalidate (or miss, as in
///    6).
/// 2. Fresh — its current age plus the request's `min-fresh` below its
///    lifetime, and below the request's `max-age` when set → serve.
/// 3. Stale and `must-revalidate`, or the request set `max-age` or
///    `min-fresh` without `max-stale` → revalidate.
/// 4. Stale by less than its `stale-while-revalidate`, or by at most the
///    request's `max-stale` → serve stale, refresh in the background.
/// 5. A validator, or stale by less than its `stale-if-error` → revalidate
///    (unconditionally without a validator: the entry is kept as the
///    fallback if the upstream fails).
/// 6. Otherwise → miss (the entry is dropped).
pub fn lookup_decision(entry: &CachedResponse, req: &CacheRequest, now: Now) -> Decision {
    let f = &entry.freshness;
    let revalidate = || Decision::Revalidate {
        etag: entry.etag(),
        last_modified: entry.last_modified(),
    };
    let age = entry.current_age(now);
    let staleness = age.saturating_sub(f.lifetime);
    let fallback = f.validators() || staleness < f.stale_if_error;
    if f.no_cache || req.no_cache {
        return match fallback {
            true => revalidate(),
            false => Decision::Miss,
        };
    }
    let lifetime = req.max_age.map_or(f.lifetime, |m| m.min(f.lifetime));
    if age.saturating_add(req.min_fresh.unwrap_or_default()) < lifetime {
        return Decision::Fresh;
    }
    let demanding = req.max_age.is_some() || req.min_fresh.is_some();
    if f.must_revalidate || (demanding && req.max_stale.is_none()) {
        return revalidate();
    }
    if staleness < f.stale_while_revalidate || req.max_stale.is_some_and(|m| staleness <= m) {
        return Decision::StaleWhileRevalidate;
    }
    match fallback {
        true => revalidate(),
        false => Decision::Miss,
    }
}

/// Whether `entry` may answer a request whose forwarding failed at `now`
/// (`x-weir-cache: stale-if-error`): stale by less than its
/// `stale-if-error` window (zero with `must-revalidate` or `no-cache`). A
/// fresh entry counts as stale by zero. The failures that count are the
/// data plane's to name (docs/reference/cache.md#response-cache): a 5xx,
/// `connect_failed`, `refused_stream`, `upstream_reset`, `upstream_timeout`, `circuit_open`,
/// `rate_limited` and `overloaded`.
pub fn on_error(entry: &CachedResponse, now: Now) -> bool {
    let f = &entry.freshness;
    let staleness = entry.current_age(now).saturating_sub(f.lifetime);
    !f.must_revalidate && !f.no_cache && staleness < f.stale_if_error
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    /// A header section as name and value pairs (the submodules' tests use it too).
    pub(super) type HeaderPairs<'a> = [(&'a [u8], &'a [u8])];

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    /// Sun, 06 Nov 1994 08:49:37 GMT, and that plus `x` seconds.
    fn wall(x: u64) -> SystemTime {
        UNIX_EPOCH + s(784_111_777 + x)
    }

    fn date(x: u64) -> String {
        httpdate::fmt_http_date(wall(x))
    }

    fn params() -> CacheParams {
        CacheParams::try_new(1 << 20, 1 << 10, s(0), s(0), s(0), false).unwrap()
    }

    fn facts(status: u16, h: &[(&str, &str)]) -> ResponseFacts {
        ResponseFacts::parse(status, h.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn get() -> CacheRequest {
        CacheRequest::default()
    }

    fn store(h: &[(&str, &str)], p: &CacheParams) -> Option<Freshness> {
        storable(&get(), &facts(200, h), p, wall(0))
    }

    /// An entry stored at 100 s with these fields, fresh as `storable` says.
    fn entry(h: &[(&str, &str)], p: &CacheParams) -> CachedResponse {
        let f = store(h, p).unwrap();
        let fields = h.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        CachedResponse::new(200, fields, &[b"body"], f, s(100))
    }

    fn decide(e: &CachedResponse, req: &CacheRequest, at: u64) -> &'static str {
        lookup_decision(e, req, s(at)).name()
    }

    #[test]
    fn params_are_validated() {
        let p = |max, obj| CacheParams::try_new(max, obj, s(0), s(0), s(0), false);
        assert_eq!(p(10, 10).unwrap().max_object_bytes, 10);
        assert_eq!(p(10, 11).unwrap_err().field, "max_object_bytes");
        assert_eq!(p(0, 0).unwrap_err().field, "max_bytes");
        assert!(p(0, 1).unwrap_err().message.contains("≤ max_bytes (0)"));
    }

    #[test]
    fn freshness_lifetime_max_age_then_expires_then_default_ttl() {
        let p = params();
        let f = store(&[("cache-control", "max-age=60")], &p).unwrap();
        assert_eq!((f.lifetime, f.initial_age), (s(60), s(0)));
        // max-age wins over Expires; s-maxage is ignored.
        let e = date(600);
        let f = store(
            &[("cache-control", "s-maxage=5, max-age=60"), ("expires", &e)],
            &p,
        );
        assert_eq!(f.unwrap().lifetime, s(60));
        // Expires − Date, Date defaulting to the time received.
        let d = date(0);
        let f = store(&[("expires", &e), ("date", &d)], &p).unwrap();
        assert_eq!(f.lifetime, s(600));
        let f = store(&[("expires", &e)], &p).unwrap();
        assert_eq!(f.lifetime, s(600));
        // An Expires in the past or invalid: explicit, and already stale.
        let etag = ("etag", "\"v\"");
        for bad in ["0", "yesterday", &date(0)] {
            let f = store(&[("expires", bad), etag], &p).unwrap();
            assert_eq!(f.lifetime, s(0), "{bad}");
        }
        // Nothing said: not stored, unless default_ttl.
        assert_eq!(store(&[etag], &p), None);
        let ttl = CacheParams {
            default_ttl: s(30),
            ..params()
        };
        assert_eq!(store(&[], &ttl).unwrap().lifetime, s(30));
        assert_eq!(
            store(&[("cache-control", "max-age=5")], &ttl)
                .unwrap()
                .lifetime,
            s(5)
        );
        // max-age=0 with no validator and no stale window: useless.
        assert_eq!(store(&[("cache-control", "max-age=0")], &p), None);
        assert!(store(&[("cache-control", "max-age=0"), etag], &p).is_some());
        let sie = store(&[("cache-control", "max-age=0, stale-if-error=60")], &p);
        assert_eq!(sie.unwrap().stale_if_error, s(60));
    }

    #[test]
    fn age_counts_upstream_age_and_the_date() {
        let p = params();
        // Age from upstream caches.
        let f = store(&[("cache-control", "max-age=60"), ("age", "15")], &p).unwrap();
        assert_eq!(f.initial_age, s(15));
        // Date 20 s before it was received: apparent age 20, the larger.
        let d = httpdate::fmt_http_date(wall(0) - s(20));
        let h = [
            ("cache-control", "max-age=60"),
            ("age", "15"),
            ("date", d.as_str()),
        ];
        assert_eq!(store(&h, &p).unwrap().initial_age, s(20));
        // A Date in the future counts as no apparent age.
        let d = date(50);
        let h = [("cache-control", "max-age=60"), ("date", d.as_str())];
        assert_eq!(store(&h, &p).unwrap().initial_age, s(0));
        // An entry received 15 s old and max-age=60 is stale 45 s later.
        let e = entry(&[("cache-control", "max-age=60"), ("age", "15")], &p);
        assert_eq!(decide(&e, &get(), 144), "fresh");
        assert_eq!(e.age_secs(s(144)), 59);
        assert_eq!(decide(&e, &get(), 145), "miss");
    }

    #[test]
    fn what_is_not_stored() {
        let p = params();
        let cc = ("cache-control", "max-age=60");
        for st in STORABLE_STATUSES {
            assert!(
                storable(&get(), &facts(st, &[cc]), &p, wall(0)).is_some(),
                "{st}"
            );
        }
        for st in [
            201, 202, 206, 302, 303, 304, 307, 400, 403, 429, 500, 502, 503, 504,
        ] {
            assert!(
                storable(&get(), &facts(st, &[cc]), &p, wall(0)).is_none(),
                "{st}"
            );
        }
        assert_eq!(store(&[cc, ("cache-control", "no-store")], &p), None);
        assert_eq!(store(&[cc, ("vary", "accept, *")], &p), None);
        assert!(store(&[cc, ("vary", "accept")], &p).is_some());
        assert!(store(&[cc, ("cache-control", "private")], &p).is_some());
        // Set-Cookie only when configured.
        assert_eq!(store(&[cc, ("set-cookie", "s=1")], &p), None);
        let cookies = CacheParams {
            store_set_cookie: true,
            ..params()
        };
        assert!(store(&[cc, ("set-cookie", "s=1")], &cookies).is_some());
        // The request's no-store, a HEAD, Authorization without public.
        let r = |req: CacheRequest, h: &[(&str, &str)]| storable(&req, &facts(200, h), &p, wall(0));
        let no_store = CacheRequest {
            no_store: true,
            ..get()
        };
        assert_eq!(r(no_store, &[cc]), None);
        let head = CacheRequest {
            head: true,
            ..get()
        };
        assert_eq!(r(head, &[cc]), None);
        let auth = CacheRequest {
            authorization: true,
            ..get()
        };
        assert_eq!(r(auth, &[cc]), None);
        assert!(r(auth, &[("cache-control", "public, max-age=60")]).is_some());
    }

    #[test]
    fn stale_while_revalidate_then_revalidate_or_miss() {
        let p = params();
        let e = entry(
            &[("cache-control", "max-age=10, stale-while-revalidate=20")],
            &p,
        );
        assert_eq!(decide(&e, &get(), 109), "fresh");
        assert_eq!(decide(&e, &get(), 110), "stale_while_revalidate");
        assert_eq!(decide(&e, &get(), 129), "stale_while_revalidate");
        assert_eq!(decide(&e, &get(), 130), "miss");
        // With a validator, past the window it is revalidated.
        let h = [
            ("cache-control", "max-age=10, stale-while-revalidate=20"),
            ("etag", "W/\"v1\""),
            ("last-modified", "Sat, 05 Nov 1994 08:49:37 GMT"),
        ];
        let e = entry(&h, &p);
        assert_eq!(
            lookup_decision(&e, &get(), s(130)),
            Decision::Revalidate {
                etag: Some(bytes::Bytes::from_static(b"W/\"v1\"")),
                last_modified: Some(bytes::Bytes::from_static(b"Sat, 05 Nov 1994 08:49:37 GMT")),
            }
        );
        // The config's window applies when the response names none.
        let swr = CacheParams {
            stale_while_revalidate: s(5),
            ..params()
        };
        let e = entry(&[("cache-control", "max-age=10")], &swr);
        assert_eq!(decide(&e, &get(), 114), "stale_while_revalidate");
        assert_eq!(decide(&e, &get(), 115), "miss");
        let e = entry(
            &[("cache-control", "max-age=10, stale-while-revalidate=0")],
            &swr,
        );
        assert_eq!(decide(&e, &get(), 110), "miss");
    }

    #[test]
    fn must_revalidate_and_no_cache_are_never_served_stale() {
        let windows = CacheParams {
            stale_while_revalidate: s(60),
            stale_if_error: s(60),
            ..params()
        };
        for cc in [
            "max-age=10, must-revalidate, stale-while-revalidate=60, stale-if-error=60",
            "max-age=10, proxy-revalidate",
        ] {
            let e = entry(&[("cache-control", cc), ("etag", "\"a\"")], &windows);
            assert_eq!(e.freshness.stale_while_revalidate, s(0));
            assert_eq!(decide(&e, &get(), 109), "fresh");
            assert_eq!(decide(&e, &get(), 110), "revalidate");
            assert!(!on_error(&e, s(110)));
            assert!(!on_error(&e, s(105)));
            let any = CacheRequest {
                max_stale: Some(Duration::MAX),
                ..get()
            };
            assert_eq!(decide(&e, &any, 110), "revalidate");
        }
        // no-cache: stored only with a validator, revalidated every time.
        let h = [("cache-control", "no-cache, max-age=60"), ("etag", "\"a\"")];
        let e = entry(&h, &windows);
        assert_eq!(decide(&e, &get(), 100), "revalidate");
        assert!(!on_error(&e, s(100)));
        assert_eq!(
            store(&[("cache-control", "no-cache, max-age=60")], &windows),
            None
        );
        assert!(store(
            &[("cache-control", "no-cache"), ("etag", "\"a\"")],
            &params()
        )
        .is_some());
    }

    #[test]
    fn stale_if_error_windows() {
        let p = params();
        let e = entry(&[("cache-control", "max-age=1, stale-if-error=60")], &p);
        // Within the window, with no validator: an unconditional refresh
        // that keeps the entry as the fallback.
        assert_eq!(
            lookup_decision(&e, &get(), s(130)),
            Decision::Revalidate {
                etag: None,
                last_modified: None
            }
        );
        for at in [100, 101, 130, 160] {
            assert!(on_error(&e, s(at)), "{at}");
        }
        assert!(!on_error(&e, s(161)));
        assert_eq!(decide(&e, &get(), 161), "miss");
        let sie = CacheParams {
            stale_if_error: s(10),
            ..params()
        };
        let e = entry(&[("cache-control", "max-age=1")], &sie);
        assert!(on_error(&e, s(110)) && !on_error(&e, s(111)));
        // Without a window, never.
        let e = entry(&[("cache-control", "max-age=1"), ("etag", "\"a\"")], &p);
        assert!(!on_error(&e, s(100)) && !on_error(&e, s(102)));
    }

    #[test]
    fn request_directives() {
        let p = params();
        let h = [
            ("cache-control", "max-age=100, stale-while-revalidate=50"),
            ("etag", "\"a\""),
        ];
        let e = entry(&h, &p);
        let r = |f: fn(&mut CacheRequest)| {
            let mut r = get();
            f(&mut r);
            r
        };
        let no_cache = r(|r| r.no_cache = true);
        assert_eq!(decide(&e, &no_cache, 100), "revalidate");
        let zero = r(|r| r.max_age = Some(s(0)));
        assert_eq!(decide(&e, &zero, 100), "revalidate");
        let ten = r(|r| r.max_age = Some(s(10)));
        assert_eq!(decide(&e, &ten, 109), "fresh");
        // Too old for the request: revalidated, not served stale.
        assert_eq!(decide(&e, &ten, 110), "revalidate");
        let min_fresh = r(|r| r.min_fresh = Some(s(30)));
        assert_eq!(decide(&e, &min_fresh, 169), "fresh");
        assert_eq!(decide(&e, &min_fresh, 170), "revalidate");
        // max-stale accepts a stale entry beyond its own window.
        let stale = r(|r| r.max_stale = Some(s(80)));
        assert_eq!(decide(&e, &stale, 280), "stale_while_revalidate");
        assert_eq!(decide(&e, &stale, 281), "revalidate");
        let both = r(|r| {
            r.max_age = Some(s(10));
            r.max_stale = Some(s(5));
        });
        assert_eq!(decide(&e, &both, 205), "stale_while_revalidate");
        // A no-cache request on a dead entry (no validator, no window): miss.
        let dead = entry(&[("cache-control", "max-age=10")], &p);
        assert_eq!(decide(&dead, &no_cache, 100), "miss");
    }

    #[test]
    fn a_304_refreshes_the_entry() {
        let p = params();
        let d0 = date(0);
        let h = [
            ("cache-control", "max-age=10"),
            ("etag", "\"v1\""),
            ("date", d0.as_str()),
            ("content-length", "4"),
            ("x-old", "1"),
        ];
        let e = entry(&h, &p);
        let d = date(300);
        let nm: &HeaderPairs = &[
            (b"cache-control", b"max-age=60"),
            (b"ETag", b"W/\"v1\""),
            (b"date", d.as_bytes()),
            (b"content-length", b"0"),
            (b"x-new", b"2"),
            (b"age", b"5"),
            (b"connection", b"close"),
        ];
        let Refreshed::Updated(r) =
            on_not_modified(&e, &get(), nm.iter().copied(), &p, s(400), wall(300))
        else {
            panic!("not updated");
        };
        assert_eq!(r.freshness.lifetime, s(60));
        assert_eq!(r.freshness.initial_age, s(5));
        assert_eq!(r.stored_at, s(400));
        assert_eq!(&r.body()[..], b"body");
        assert_eq!(r.header("content-length").as_deref(), Some(&b"4"[..]));
        assert_eq!(r.header("etag").as_deref(), Some(&b"W/\"v1\""[..]));
        assert_eq!(r.header("x-old").as_deref(), Some(&b"1"[..]));
        assert_eq!(r.header("x-new").as_deref(), Some(&b"2"[..]));
        assert_eq!(r.header("date").as_deref(), Some(d.as_bytes()));
        assert_eq!(r.header("connection"), None);
        assert_eq!(
            r.fields()
                .filter(|(n, _)| n.eq_ignore_ascii_case(b"cache-control"))
                .count(),
            1
        );
        assert_eq!(decide(&r, &get(), 454), "fresh");
        // A HEAD's 304 refreshes the GET's entry too.
        let head = CacheRequest {
            head: true,
            ..get()
        };
        let got = on_not_modified(&e, &head, nm.iter().copied(), &p, s(400), wall(300));
        assert!(matches!(got, Refreshed::Updated(_)));
        // Another validator: it validated some other response.
        let other: &HeaderPairs = &[(b"etag", b"\"v2\"")];
        let got = on_not_modified(&e, &get(), other.iter().copied(), &p, s(400), wall(300));
        assert_eq!(got, Refreshed::Mismatch);
        let lm: &HeaderPairs = &[(b"last-modified", b"Sat, 05 Nov 1994 08:49:37 GMT")];
        let got = on_not_modified(&e, &get(), lm.iter().copied(), &p, s(400), wall(300));
        assert_eq!(got, Refreshed::Mismatch);
        // No validator in the 304, no Date: the entry's, received now.
        let got = on_not_modified(&e, &get(), [], &p, s(400), wall(300));
        let Refreshed::Updated(r) = got else {
            panic!("{got:?}")
        };
        assert_eq!(
            (r.freshness.lifetime, r.freshness.initial_age),
            (s(10), s(0))
        );
        // Now no-store: served this once, not kept.
        let ns: &HeaderPairs = &[(b"cache-control", b"no-store")];
        let got = on_not_modified(&e, &get(), ns.iter().copied(), &p, s(400), wall(300));
        let Refreshed::NotStorable(r) = got else {
            panic!("{got:?}")
        };
        assert_eq!(&r.body()[..], b"body");
    }

    #[test]
    fn unsafe_methods_answered_without_error_invalidate() {
        for m in ["POST", "PUT", "PATCH", "DELETE", "LOCK", "post"] {
            assert!(
                invalidates(m, 200) && invalidates(m, 204) && invalidates(m, 303),
                "{m}"
            );
            assert!(
                !invalidates(m, 404) && !invalidates(m, 500) && !invalidates(m, 101),
                "{m}"
            );
        }
        for m in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(!invalidates(m, 200), "{m}");
        }
    }

    #[test]
    fn results_name_the_header_values() {
        let names: Vec<_> = CacheResult::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            [
                "hit",
                "miss",
                "stale",
                "stale-if-error",
                "revalidated",
                "coalesced"
            ]
        );
        for r in CacheResult::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }
}
