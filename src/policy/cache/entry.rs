//! The stored form of a response ([`CachedResponse`]): its field block and
//! body, each one allocation of its exact length; its [`Freshness`] and
//! when it was stored; the secondary key `Vary` asks for; and the refresh
//! by a 304 ([`on_not_modified`], RFC 9111 §4.3.4).

use super::directives::{name_is, ResponseFacts, DELTA_SECONDS_MAX};
use super::{storable, CacheParams, CacheRequest, Freshness};
use crate::policy::Now;
use bytes::Bytes;
use std::fmt;
use std::time::{Duration, SystemTime};

/// Response fields never stored (RFC 9111 §3.1): the hop-by-hop ones,
/// `Age` (a served entry carries its own), weir's own `x-weir-*`, and any
/// that is not a well-formed field (a name with a byte outside the visible
/// ASCII or a colon; a value with CR or LF).
fn kept(name: &[u8], value: &[u8]) -> bool {
    const HOP: [&str; 10] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "age",
    ];
    !name.is_empty()
        && name.iter().all(|&b| b.is_ascii_graphic() && b != b':')
        && !value.iter().any(|&b| b == b'\r' || b == b'\n')
        && !HOP.iter().any(|h| name_is(name, h))
        && !name
            .get(..7)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"x-weir-"))
}

/// Fields a 304 leaves as stored (RFC 9111 §3.2): those never stored, the
/// ones describing the stored body's framing and coding, and `Vary` (the
/// secondary key was made with it).
fn updatable(name: &[u8], value: &[u8]) -> bool {
    const FIXED: [&str; 4] = [
        "content-length",
        "content-encoding",
        "content-range",
        "vary",
    ];
    kept(name, value) && !FIXED.iter().any(|f| name_is(name, f))
}

/// A field block: each kept field as `name: value\r\n`, in order, in one
/// allocation of its exact length.
fn block<'a, H>(fields: H) -> Bytes
where
    H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    let len: usize = (fields.clone().into_iter())
        .filter(|(n, v)| kept(n, v))
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum();
    if len == 0 {
        return Bytes::new();
    }
    let mut b = Vec::with_capacity(len);
    for (n, v) in fields.into_iter().filter(|(n, v)| kept(n, v)) {
        b.extend_from_slice(n);
        b.extend_from_slice(b": ");
        b.extend_from_slice(v);
        b.extend_from_slice(b"\r\n");
    }
    Bytes::from(b)
}

/// The (name, value) pairs of a field block, in order.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.rest.is_empty() {
            let end = self.rest.iter().position(|&b| b == b'\n');
            let line = &self.rest[..end.unwrap_or(self.rest.len())];
            self.rest = end.map_or(&[][..], |e| &self.rest[e + 1..]);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(colon) = line.iter().position(|&b| b == b':') {
                let value = &line[colon + 1..];
                return Some((&line[..colon], value.strip_prefix(b" ").unwrap_or(value)));
            }
        }
        None
    }
}

/// A stored response: what the upstream sent, less the fields never kept.
#[derive(Clone, PartialEq, Eq)]
pub struct CachedResponse {
    pub status: u16,
    fields: Bytes,
    body: Bytes,
    pub freshness: Freshness,
    /// When it was stored (monotonic): its resident time counts from here.
    pub stored_at: Now,
}

impl fmt::Debug for CachedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedResponse")
            .field("status", &self.status)
            .field("fields", &self.fields.len())
            .field("body", &self.body.len())
            .field("freshness", &self.freshness)
            .field("stored_at", &self.stored_at)
            .finish()
    }
}

impl CachedResponse {
    /// A response to store: `fields` as received (those never kept are
    /// left out), the body from its chunks, copied into one buffer of its
    /// exact length, and `freshness` from [`storable`], stored at `now`.
    pub fn new<'a, H, B>(status: u16, fields: H, body: &[B], freshness: Freshness, now: Now) -> Self
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
        B: AsRef<[u8]>,
    {
        let len = body.iter().map(|c| c.as_ref().len()).sum();
        let body = match len {
            0 => Bytes::new(),
            _ => {
                let mut b = Vec::with_capacity(len);
                for c in body {
                    b.extend_from_slice(c.as_ref());
                }
                Bytes::from(b)
            }
        };
        CachedResponse {
            status,
            fields: block(fields),
            body,
            freshness,
            stored_at: now,
        }
    }

    /// The stored fields as (name, value) pairs, in the order received.
    pub fn fields(&self) -> Fields<'_> {
        Fields { rest: &self.fields }
    }

    /// The stored fields with each value as a [`Bytes`] sharing the block
    /// (for `HeaderValue::from_maybe_shared`, no copy).
    pub fn field_values(&self) -> impl Iterator<Item = (&[u8], Bytes)> + '_ {
        self.fields().map(|(n, v)| (n, self.fields.slice_ref(v)))
    }

    /// The field block as stored: `name: value\r\n` per field, ready to be
    /// written after a status line.
    pub fn field_block(&self) -> &Bytes {
        &self.fields
    }

    /// The first value of field `name`.
    pub fn header(&self, name: &str) -> Option<Bytes> {
        let (_, v) = self.fields().find(|(n, _)| name_is(n, name))?;
        Some(self.fields.slice_ref(v))
    }

    /// Its `ETag`, for `If-None-Match`.
    pub fn etag(&self) -> Option<Bytes> {
        self.header("etag")
    }

    /// Its `Last-Modified`, for `If-Modified-Since`.
    pub fn last_modified(&self) -> Option<Bytes> {
        self.header("last-modified")
    }

    /// The body (shared, no copy).
    pub fn body(&self) -> Bytes {
        self.body.clone()
    }

    /// The bytes it stores: the field block and the body (what
    /// `max_object_bytes` bounds).
    pub fn object_bytes(&self) -> usize {
        self.fields.len() + self.body.len()
    }

    /// Its current age (RFC 9111 §4.2.3, simplified): its age when
    /// received plus the time since it was stored (none if `now` is
    /// earlier).
    pub fn current_age(&self, now: Now) -> Duration {
        let resident = now.saturating_sub(self.stored_at);
        self.freshness.initial_age.saturating_add(resident)
    }

    /// The `Age` header's value at `now`: whole seconds, at most 2^31.
    pub fn age_secs(&self, now: Now) -> u64 {
        self.current_age(now).as_secs().min(DELTA_SECONDS_MAX)
    }

    /// The names its `Vary` lists (`*` and empty elements left out).
    fn vary_names(&self) -> impl Iterator<Item = &[u8]> {
        self.fields()
            .filter(|(n, _)| name_is(n, "vary"))
            .flat_map(|(_, v)| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|n| !n.is_empty() && *n != b"*")
    }

    /// The secondary key of this response for a request with `headers`:
    /// per name its `Vary` lists, in order, the lower-cased name, then `\0`
    /// and the request's values of that field (each trimmed, joined by
    /// `", "`) when present or `\x01` when absent, then `\n`. Empty without
    /// `Vary`. `None` when a name or value holds a control byte, which
    /// could make two keys alike (such a response is not stored).
    pub(super) fn secondary_key<'a, H>(&self, headers: H) -> Option<Box<[u8]>>
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let control = |s: &[u8]| s.iter().any(|&b| b < 0x20 && b != b'\t');
        let mut key = Vec::new();
        for name in self.vary_names() {
            if control(name) {
                return None;
            }
            key.extend(name.iter().map(u8::to_ascii_lowercase));
            let mut values = headers
                .clone()
                .into_iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name));
            match values.next() {
                None => key.push(1),
                Some((_, first)) => {
                    key.push(0);
                    for (i, v) in std::iter::once(first)
                        .chain(values.map(|(_, v)| v))
                        .enumerate()
                    {
                        let v = v.trim_ascii();
                        if control(v) {
                            return None;
                        }
                        if i > 0 {
                            key.extend_from_slice(b", ");
                        }
                        key.extend_from_slice(v);
                    }
                }
            }
            key.push(b'\n');
        }
        Some(key.into_boxed_slice())
    }
}

/// Whether a request with `headers` has the secondary key `key` (see
/// [`CachedResponse::secondary_key`]), compared without building its own.
pub(super) fn vary_matches<'a, H>(key: &[u8], headers: H) -> bool
where
    H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    key.split(|&b| b == b'\n')
        .filter(|e| !e.is_empty())
        .all(|e| {
            let Some(sep) = e.iter().position(|&b| b == 0 || b == 1) else {
                return false;
            };
            let (name, rest) = e.split_at(sep);
            let mut values = headers
                .clone()
                .into_iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name));
            if rest[0] == 1 {
                return values.next().is_none();
            }
            let mut stored = &rest[1..];
            let mut seen = false;
            for (_, v) in values {
                if seen {
                    let Some(r) = stored.strip_prefix(b", ") else {
                        return false;
                    };
                    stored = r;
                }
                seen = true;
                let Some(r) = stored.strip_prefix(v.trim_ascii()) else {
                    return false;
                };
                stored = r;
            }
            seen && stored.is_empty()
        })
}

/// What a 304 does to the entry it answered for ([`on_not_modified`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// The entry with the 304's fields merged in, its freshness computed
    /// again, stored at `now`: it replaces the entry and answers the
    /// request (`x-weir-cache: revalidated`).
    Updated(CachedResponse),
    /// The merged response may not be stored any more (the 304 said
    /// `no-store`, say): it answers this request, which the 304 validated,
    /// and the entry is dropped.
    NotStorable(CachedResponse),
    /// The 304's validator is not the entry's: it validated some other
    /// response. The entry is dropped and the request forwarded again
    /// without conditions.
    Mismatch,
}

/// An entity tag without its weakness mark, for the weak comparison.
fn opaque(tag: &[u8]) -> &[u8] {
    let t = tag.trim_ascii();
    t.strip_prefix(b"W/").unwrap_or(t)
}

/// The refresh of `entry` by a 304 to its revalidation for `req`,
/// received at `now` (`received` on the wall clock): RFC 9111 §4.3.4.
/// Each validator the 304 carries must be the entry's (`ETag` by weak
/// comparison, `Last-Modified` byte for byte), else [`Refreshed::Mismatch`].
/// The stored fields are updated with the 304's — each field it carries
/// replaces the stored lines of that name, except `Content-Length`,
/// `Content-Encoding`, `Content-Range`, `Vary` and those never stored — and
/// [`storable`] judges the merged response afresh (a HEAD's 304 refreshes
/// the GET's entry like a GET's), its age taken from the 304's own `Age`
/// and `Date` (none: received now).
pub fn on_not_modified<'a, H>(
    entry: &CachedResponse,
    req: &CacheRequest,
    not_modified: H,
    params: &CacheParams,
    now: Now,
    received: SystemTime,
) -> Refreshed
where
    H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    for (n, v) in not_modified.clone() {
        let same =
            |stored: Option<Bytes>, eq: fn(&[u8], &[u8]) -> bool| stored.is_some_and(|s| eq(&s, v));
        if name_is(n, "etag") && !same(entry.etag(), |a, b| opaque(a) == opaque(b)) {
            return Refreshed::Mismatch;
        }
        if name_is(n, "last-modified")
            && !same(entry.last_modified(), |a, b| {
                a.trim_ascii() == b.trim_ascii()
            })
        {
            return Refreshed::Mismatch;
        }
    }
    let replaced = |name: &[u8]| {
        (not_modified.clone().into_iter())
            .any(|(n, v)| updatable(n, v) && n.eq_ignore_ascii_case(name))
    };
    let mut merged: Vec<(&[u8], &[u8])> = entry.fields().filter(|(n, _)| !replaced(n)).collect();
    let new = not_modified
        .clone()
        .into_iter()
        .filter(|(n, v)| updatable(n, v));
    merged.extend(new.map(|(n, v)| -> (&[u8], &[u8]) { (n, v) }));
    let fields = block(merged.iter().copied());
    let mut facts = ResponseFacts::parse(entry.status, Fields { rest: &fields });
    // Its age is the 304's: its own `Age`, and its own `Date` or none.
    let own = ResponseFacts::parse(304, not_modified);
    (facts.age, facts.date) = (own.age, own.date);
    let get = CacheRequest {
        head: false,
        ..*req
    };
    let fresh = storable(&get, &facts, params, received);
    let refreshed = CachedResponse {
        status: entry.status,
        fields,
        body: entry.body.clone(),
        freshness: fresh.unwrap_or_default(),
        stored_at: now,
    };
    match fresh {
        Some(_) => Refreshed::Updated(refreshed),
        None => Refreshed::NotStorable(refreshed),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::policy::cache::tests::HeaderPairs;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn response(fields: &HeaderPairs, body: &[&[u8]]) -> CachedResponse {
        CachedResponse::new(
            200,
            fields.iter().copied(),
            body,
            Freshness::default(),
            s(0),
        )
    }

    #[test]
    fn the_field_block_keeps_end_to_end_fields_in_wire_form() {
        let r = response(
            &[
                (b"Content-Type", b"text/plain"),
                (b"Connection", b"close"),
                (b"Keep-Alive", b"timeout=5"),
                (b"Age", b"30"),
                (b"X-Weir-Attempts", b"1"),
                (b"transfer-encoding", b"chunked"),
                (b"bad name", b"x"),
                (b"x-split", b"a\r\nb: c"),
                (b"ETag", b"\"v1\""),
                (b"x-empty", b""),
            ],
            &[b"hel", b"", b"lo"],
        );
        assert_eq!(
            &r.field_block()[..],
            b"Content-Type: text/plain\r\nETag: \"v1\"\r\nx-empty: \r\n"
        );
        let fields: Vec<_> = r.fields().collect();
        assert_eq!(
            fields,
            [
                (&b"Content-Type"[..], &b"text/plain"[..]),
                (b"ETag", b"\"v1\""),
                (b"x-empty", b""),
            ]
        );
        assert_eq!(r.etag().as_deref(), Some(&b"\"v1\""[..]));
        assert_eq!(
            r.header("content-type").as_deref(),
            Some(&b"text/plain"[..])
        );
        assert_eq!(r.last_modified(), None);
        assert_eq!(&r.body()[..], b"hello");
        assert_eq!(r.object_bytes(), r.field_block().len() + 5);
        let values: Vec<_> = r.field_values().map(|(_, v)| v).collect();
        assert_eq!(values[1], Bytes::from_static(b"\"v1\""));
        let empty = response(&[], &[]);
        assert_eq!((empty.object_bytes(), empty.fields().count()), (0, 0));
        assert!(format!("{empty:?}").contains("body: 0"));
    }

    #[test]
    fn age_is_the_initial_age_plus_the_resident_time() {
        let mut r = response(&[], &[]);
        r.freshness.initial_age = s(12);
        r.stored_at = s(100);
        assert_eq!(r.current_age(s(100)), s(12));
        assert_eq!(r.current_age(s(130)), s(42));
        assert_eq!(r.age_secs(Duration::from_millis(130_999)), 42);
        // A clock stepping back adds nothing.
        assert_eq!(r.current_age(s(50)), s(12));
        r.freshness.initial_age = Duration::MAX;
        assert_eq!(r.age_secs(s(200)), 1 << 31);
    }

    #[test]
    fn the_secondary_key_holds_the_values_vary_names() {
        let r = response(
            &[
                (b"vary", b"Accept-Encoding, X-Tenant"),
                (b"Vary", b"*, , accept-language"),
            ],
            &[],
        );
        let req: &HeaderPairs = &[
            (b"accept-encoding", b" gzip "),
            (b"Accept-Encoding", b"br"),
            (b"x-tenant", b""),
        ];
        let key = r.secondary_key(req.iter().copied()).unwrap();
        assert_eq!(
            &key[..],
            b"accept-encoding\0gzip, br\nx-tenant\0\naccept-language\x01\n"
        );
        assert!(vary_matches(&key, req.iter().copied()));
        // Absent is not empty; order and count of lines matter as joined.
        let other: &HeaderPairs = &[(b"accept-encoding", b"gzip, br"), (b"x-tenant", b"")];
        assert!(vary_matches(&key, other.iter().copied()));
        let cases: [&HeaderPairs; 5] = [
            &[(b"accept-encoding", b"gzip"), (b"x-tenant", b"")],
            &[(b"accept-encoding", b"gzip, br")],
            &[(b"accept-encoding", b"gzip, br"), (b"x-tenant", b"a")],
            &[
                (b"accept-encoding", b"gzip, br"),
                (b"x-tenant", b""),
                (b"accept-language", b"en"),
            ],
            &[(b"accept-encoding", b"br, gzip"), (b"x-tenant", b"")],
        ];
        for c in cases {
            assert!(!vary_matches(&key, c.iter().copied()), "{c:?}");
        }
        // No Vary: an empty key that every request has.
        let plain = response(&[], &[]);
        let key = plain.secondary_key(req.iter().copied()).unwrap();
        assert!(key.is_empty() && vary_matches(&key, req.iter().copied()));
        // A control byte could forge a separator: not stored.
        let bad: &HeaderPairs = &[(b"accept-encoding", b"a\x01b")];
        assert_eq!(r.secondary_key(bad.iter().copied()), None);
        assert!(!vary_matches(b"garbage\n", req.iter().copied()));
    }
}
