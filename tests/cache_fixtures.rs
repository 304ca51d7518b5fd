//! The response-cache fixture matrix (docs/reference/cache.md#response-cache):
//! every `tests/fixtures/cache/*.json` is `{ "description", "input",
//! "expected" }` of one of two kinds, told apart by `input`:
//!
//! - `{ "params"?, "request"?, "response", "at_s"? }` → `{ "bypass" }` or
//!   `{ "stored", "lifetime_s"?, "stale_while_revalidate_s"?,
//!   "stale_if_error_s"?, "initial_age_s"?, "must_revalidate"?,
//!   "no_cache"?, "etag"?, "last_modified"? }`: [`CacheRequest::parse`]
//!   and [`storable`] on one exchange;
//! - `{ "params"?, "steps" }` → `{ "stats" }`: a sequence of `store`,
//!   `lookup` and `not_modified` on a [`CacheStore`], each with what it
//!   must give, and the store's counters at the end (each field given must
//!   equal).
//!
//! Time: step `at_s` is both the monotonic `now` (seconds) and the wall
//! clock `T0 + at_s`; in header values `{t0}`, `{t0+N}` and `{t0-N}` are
//! the HTTP-dates of `T0`, `T0 + N` and `T0 − N` seconds. Together the
//! fixtures must cover every decision, every refresh outcome, every bypass
//! and both answers of `on_error`.
#![allow(clippy::unwrap_used)]

use crate::common::fixtures;

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir::policy::cache::{
    lookup_decision, on_error, on_not_modified, storable, CacheParams, CacheRequest, CacheStore,
    CachedResponse, Decision, Refreshed, ResponseFacts,
};

/// Tue, 14 Nov 2023 22:13:20 GMT.
const T0: u64 = 1_700_000_000;

fn wall(at_s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(T0 + at_s)
}

/// A header value with `{t0}`, `{t0+N}` and `{t0-N}` written out.
fn expand(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(open) = rest.find("{t0") {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').unwrap() + open;
        let offset: i64 = match &rest[open + 3..close] {
            "" => 0,
            n => n.trim_start_matches('+').parse().unwrap(),
        };
        let at = UNIX_EPOCH + Duration::from_secs(T0.checked_add_signed(offset).unwrap());
        out.push_str(&httpdate::fmt_http_date(at));
        rest = &rest[close + 1..];
    }
    out + rest
}

type Headers = Vec<(String, String)>;

fn pairs(h: &[(String, String)]) -> Vec<(&[u8], &[u8])> {
    h.iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
        .collect()
}

fn expanded(h: &Headers) -> Headers {
    h.iter().map(|(n, v)| (n.clone(), expand(v))).collect()
}

fn get() -> String {
    "GET".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default = "get")]
    method: String,
    #[serde(default)]
    headers: Headers,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            method: get(),
            headers: Vec::new(),
        }
    }
}

fn ok() -> u16 {
    200
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Response {
    #[serde(default = "ok")]
    status: u16,
    #[serde(default)]
    headers: Headers,
    #[serde(default)]
    body: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Params {
    max_bytes: u64,
    max_object_bytes: u64,
    default_ttl_s: u64,
    stale_while_revalidate_s: u64,
    stale_if_error_s: u64,
    store_set_cookie: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            max_bytes: 1 << 20,
            max_object_bytes: 1 << 16,
            default_ttl_s: 0,
            stale_while_revalidate_s: 0,
            stale_if_error_s: 0,
            store_set_cookie: false,
        }
    }
}

impl Params {
    fn build(&self) -> CacheParams {
        let s = Duration::from_secs;
        CacheParams::try_new(
            self.max_bytes,
            self.max_object_bytes,
            s(self.default_ttl_s),
            s(self.stale_while_revalidate_s),
            s(self.stale_if_error_s),
            self.store_set_cookie,
        )
        .unwrap()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StorableCase {
    #[serde(default)]
    params: Params,
    #[serde(default)]
    request: Request,
    response: Response,
    #[serde(default)]
    at_s: u64,
}

fn key() -> String {
    "/k".into()
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Step {
    /// The request's response, stored if `storable` allows and the store
    /// has room: `expect` is `stored` or `not_stored`.
    Store {
        at_s: u64,
        #[serde(default = "key")]
        key: String,
        #[serde(default)]
        request: Request,
        response: Response,
        expect: String,
    },
    /// `expect` is the decision's name; `on_error` what [`on_error`] says
    /// of the entry found; `age_s` its `Age`; `etag` and `last_modified` the
    /// validators a revalidation sends.
    Lookup {
        at_s: u64,
        #[serde(default = "key")]
        key: String,
        #[serde(default)]
        request: Request,
        expect: String,
        #[serde(default)]
        on_error: Option<bool>,
        #[serde(default)]
        age_s: Option<u64>,
        #[serde(default)]
        etag: Option<String>,
        #[serde(default)]
        last_modified: Option<String>,
    },
    /// A 304 to the revalidation of the entry the last lookup found:
    /// `expect` is `updated` (it replaces the entry), `not_storable` or
    /// `mismatch` (the entry is dropped).
    NotModified {
        at_s: u64,
        #[serde(default = "key")]
        key: String,
        #[serde(default)]
        request: Request,
        headers: Headers,
        expect: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Steps {
    #[serde(default)]
    params: Params,
    steps: Vec<Step>,
}

/// What the fixtures saw, for coverage.
#[derive(Default)]
struct Seen {
    names: BTreeSet<String>,
    failures: Vec<String>,
}

impl Seen {
    fn check(&mut self, name: &str, expected: &Value, actual: &Value) {
        let (Some(want), Some(got)) = (expected.as_object(), actual.as_object()) else {
            panic!("{name}: expected and actual must be objects");
        };
        for (k, v) in want {
            if got.get(k) != Some(v) {
                self.failures
                    .push(format!("{name}: {k}: expected {v}, got {actual}"));
            }
        }
    }

    fn expect(&mut self, name: &str, n: usize, what: &str, want: &str, got: &str) {
        self.names.insert(format!("{what}:{got}"));
        if want != got {
            self.failures.push(format!(
                "{name}: step {n}: {what}: expected {want}, got {got}"
            ));
        }
    }

    fn storable(&mut self, name: &str, c: StorableCase, expected: &Value) {
        let req_h = expanded(&c.request.headers);
        let actual = match CacheRequest::parse(&c.request.method, pairs(&req_h)) {
            Err(b) => {
                let b = serde_json::to_value(b).unwrap();
                self.names.insert(format!("bypass:{}", b.as_str().unwrap()));
                serde_json::json!({ "bypass": b })
            }
            Ok(req) => {
                let resp_h = expanded(&c.response.headers);
                let facts = ResponseFacts::parse(c.response.status, pairs(&resp_h));
                let f = storable(&req, &facts, &c.params.build(), wall(c.at_s));
                self.names.insert(format!("stored:{}", f.is_some()));
                match f {
                    None => serde_json::json!({ "stored": false }),
                    Some(f) => serde_json::json!({
                        "stored": true,
                        "lifetime_s": f.lifetime.as_secs(),
                        "stale_while_revalidate_s": f.stale_while_revalidate.as_secs(),
                        "stale_if_error_s": f.stale_if_error.as_secs(),
                        "initial_age_s": f.initial_age.as_secs(),
                        "must_revalidate": f.must_revalidate,
                        "no_cache": f.no_cache,
                        "etag": f.etag,
                        "last_modified": f.last_modified,
                    }),
                }
            }
        };
        self.check(name, expected, &actual);
    }

    fn steps(&mut self, name: &str, input: Steps, expected: &Value) {
        let params = input.params.build();
        let mut store = CacheStore::new(params.clone());
        let mut last: Option<Arc<CachedResponse>> = None;
        let s = Duration::from_secs;
        for (n, step) in input.steps.into_iter().enumerate() {
            match step {
                Step::Store {
                    at_s,
                    key,
                    request,
                    response,
                    expect,
                } => {
                    let req_h = expanded(&request.headers);
                    let req = CacheRequest::parse(&request.method, pairs(&req_h)).unwrap();
                    let resp_h = expanded(&response.headers);
                    let facts = ResponseFacts::parse(response.status, pairs(&resp_h));
                    let kept = storable(&req, &facts, &params, wall(at_s)).is_some_and(|f| {
                        let body = [response.body.as_bytes()];
                        let r =
                            CachedResponse::new(response.status, pairs(&resp_h), &body, f, s(at_s));
                        store.insert(&key, pairs(&req_h), r)
                    });
                    let got = if kept { "stored" } else { "not_stored" };
                    self.expect(name, n, "store", &expect, got);
                }
                Step::Lookup {
                    at_s,
                    key,
                    request,
                    expect,
                    on_error: err,
                    age_s,
                    etag,
                    last_modified,
                } => {
                    let req_h = expanded(&request.headers);
                    let req = CacheRequest::parse(&request.method, pairs(&req_h)).unwrap();
                    let l = store.lookup(&key, &req, pairs(&req_h), s(at_s));
                    self.expect(name, n, "decision", &expect, l.decision.name());
                    if let Some(e) = &l.entry {
                        // The store's answer is the pure function's.
                        assert_eq!(lookup_decision(e, &req, s(at_s)), l.decision, "{name}");
                    }
                    let entry = l.entry.as_deref();
                    if let Some(want) = err {
                        let got = entry.is_some_and(|e| on_error(e, s(at_s)));
                        self.expect(name, n, "on_error", &want.to_string(), &got.to_string());
                    }
                    if let Some(want) = age_s {
                        let got = entry.map_or("none".into(), |e| e.age_secs(s(at_s)).to_string());
                        self.expect(name, n, "age_s", &want.to_string(), &got);
                    }
                    if let Decision::Revalidate {
                        etag: e,
                        last_modified: lm,
                    } = &l.decision
                    {
                        let text = |b: &Option<bytes::Bytes>| {
                            b.as_ref()
                                .map_or("none".into(), |b| String::from_utf8_lossy(b).into_owned())
                        };
                        if let Some(want) = etag {
                            self.expect(name, n, "etag", &want, &text(e));
                        }
                        if let Some(want) = last_modified {
                            self.expect(name, n, "last_modified", &expand(&want), &text(lm));
                        }
                    }
                    last = l.entry;
                }
                Step::NotModified {
                    at_s,
                    key,
                    request,
                    headers,
                    expect,
                } => {
                    let entry = last
                        .take()
                        .unwrap_or_else(|| panic!("{name}: step {n}: no entry"));
                    let req_h = expanded(&request.headers);
                    let req = CacheRequest::parse(&request.method, pairs(&req_h)).unwrap();
                    let h = expanded(&headers);
                    let got =
                        on_not_modified(&entry, &req, pairs(&h), &params, s(at_s), wall(at_s));
                    let got = match got {
                        Refreshed::Updated(r) => {
                            assert!(store.insert(&key, pairs(&req_h), r), "{name}: step {n}");
                            "updated"
                        }
                        Refreshed::NotStorable(_) => {
                            store.remove(&key, pairs(&req_h));
                            "not_storable"
                        }
                        Refreshed::Mismatch => {
                            store.remove(&key, pairs(&req_h));
                            "mismatch"
                        }
                    };
                    self.expect(name, n, "refresh", &expect, got);
                }
            }
        }
        let stats = serde_json::to_value(store.stats()).unwrap();
        self.check(name, &expected["stats"], &stats);
    }
}

#[test]
fn cache_fixtures() {
    let fixtures = fixtures::load("cache", 25);

    let mut seen = Seen::default();
    for (name, doc) in fixtures {
        assert!(doc["description"].is_string(), "{name}: no description");
        let input = doc["input"].clone();
        let expected = &doc["expected"];
        if input.get("steps").is_some() {
            let i = serde_json::from_value(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.steps(&name, i, expected);
        } else if input.get("response").is_some() {
            let i = serde_json::from_value(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen.storable(&name, i, expected);
        } else {
            panic!("{name}: input has no `steps` or `response`");
        }
    }
    assert!(seen.failures.is_empty(), "{}", seen.failures.join("\n"));
    let all = [
        "decision:fresh",
        "decision:stale_while_revalidate",
        "decision:revalidate",
        "decision:miss",
        "refresh:updated",
        "refresh:not_storable",
        "refresh:mismatch",
        "on_error:true",
        "on_error:false",
        "stored:true",
        "stored:false",
        "store:stored",
        "store:not_stored",
        "bypass:method",
        "bypass:range",
        "bypass:conditional",
        "bypass:upgrade",
        "bypass:body",
    ];
    for a in all {
        assert!(seen.names.contains(a), "no fixture covers {a}");
    }
}

/// The fixtures' shapes refuse what they do not know.
#[test]
fn unknown_fields_are_refused() {
    let r: Result<Step, _> = serde_json::from_value(serde_json::json!({
        "op": "lookup", "at_s": 0, "expect": "fresh", "stale": true
    }));
    assert!(r.is_err());
    let r: Result<Params, _> = serde_json::from_value(serde_json::json!({ "ttl_s": 1 }));
    assert!(r.is_err());
    assert_eq!(
        expand("a {t0} b {t0+60} {t0-1}"),
        format!(
            "a {} b {} {}",
            httpdate::fmt_http_date(wall(0)),
            httpdate::fmt_http_date(wall(60)),
            httpdate::fmt_http_date(wall(0) - Duration::from_secs(1)),
        )
    );
}
