//! The response cache (docs/reference/cache.md#response-cache), on both paths (the
//! fast path serves hits, misses and writes; revalidations and stale
//! answers are the general path's), counting what
//! the upstream received: hits make no request, concurrent misses make one,
//! stale-if-error answers through an outage and an open breaker,
//! must-revalidate is never served stale, stale-while-revalidate refreshes
//! once in the background, a 304 revalidates.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A catalogue upstream: every GET answers `item N` (N counts the requests
/// it answered) with `cache-control` as set; `status` other than 0
/// replaces 200; with `etag`, a matching `If-None-Match` gets 304.
#[derive(Clone, Default)]
struct Knobs {
    cache_control: Arc<Mutex<String>>,
    status: Arc<AtomicUsize>,
    etag: Arc<Mutex<Option<String>>>,
    conditionals: Arc<AtomicUsize>,
    hold: Arc<AtomicUsize>,
    /// Fields every answer carries besides.
    extra: Arc<Mutex<Vec<(String, String)>>>,
}

async fn catalogue(cache_control: &str) -> (TestUpstream, Knobs) {
    let k = Knobs::default();
    *k.cache_control.lock().unwrap() = cache_control.to_string();
    let n = Arc::new(AtomicUsize::new(0));
    let knobs = k.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (k, n) = (knobs.clone(), n.clone());
        async move {
            let hold = k.hold.load(Ordering::SeqCst);
            if hold > 0 {
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
            }
            let etag = k.etag.lock().unwrap().clone();
            let inm = req
                .headers()
                .get("if-none-match")
                .map(|v| v.to_str().unwrap().to_string());
            if inm.is_some() {
                k.conditionals.fetch_add(1, Ordering::SeqCst);
            }
            let cc = k.cache_control.lock().unwrap().clone();
            let mut b = Response::builder().header("cache-control", cc);
            for (n, v) in k.extra.lock().unwrap().iter() {
                b = b.header(n.as_str(), v.as_str());
            }
            if let Some(e) = &etag {
                b = b.header("etag", e.as_str());
            }
            match k.status.load(Ordering::SeqCst) {
                0 if inm.is_some() && inm == etag => {
                    return b.status(304).body(body("")).unwrap();
                }
                0 => {}
                s => return b.status(s as u16).body(body("down")).unwrap(),
            }
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            b.body(body(format!("item {i}"))).unwrap()
        }
    })
    .await;
    (up, k)
}

/// weir's metrics as `/metrics` shows them.
fn metrics(weir: &Weir) -> String {
    let snap = weir.handle.as_ref().unwrap().snapshot();
    for u in &snap.upstreams {
        u.refresh_gauges();
    }
    snap.metrics.render()
}

const CACHE: &str = "[upstreams.svc.cache]\nenabled = true\n";

/// GET `path` through weir: status, head, body.
async fn fetch(weir: &Weir, path: &str) -> (u16, http::response::Parts, String) {
    let resp = get(&client(), &weir.url(path), "svc").await;
    let (parts, b) = read_body(resp).await;
    (
        parts.status.as_u16(),
        parts,
        String::from_utf8_lossy(&b).into_owned(),
    )
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_fresh_entry_answers_without_an_attempt
);
async fn a_fresh_entry_answers_without_an_attempt(path: DataPath) {
    let (up, _k) = catalogue("max-age=60").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    let (s, first, b) = fetch(&weir, "/item/1").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&first, "x-weir-cache"), "miss");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (s, again, b) = fetch(&weir, "/item/1").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&again, "x-weir-cache"), "hit");
    assert_eq!(header(&again, "x-weir-attempts"), "0");
    let age: u64 = header(&again, "age").parse().unwrap();
    assert!((10..=11).contains(&age), "age {age}");
    assert_eq!(up.requests(), 1);
    // Another target is another entry; past max-age it is fetched again.
    assert_eq!(fetch(&weir, "/item/2").await.2, "item 2");
    tokio::time::sleep(Duration::from_secs(51)).await;
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("miss", "item 3")
    );
    assert_eq!(up.requests(), 3);
    // The cache's series count what the header said.
    let m = metrics(&weir);
    assert!(
        m.contains("weir_cache_requests_total{result=\"hit\",upstream=\"svc\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("weir_cache_requests_total{result=\"miss\",upstream=\"svc\"} 3"),
        "{m}"
    );
}

both_paths!(
    #[tokio::test]
    a_hundred_concurrent_misses_make_one_upstream_request
);
async fn a_hundred_concurrent_misses_make_one_upstream_request(path: DataPath) {
    let (up, k) = catalogue("max-age=60").await;
    k.hold.store(300, Ordering::SeqCst);
    let weir = Arc::new(Weir::single_on(path, &up.url(), CACHE).await);
    let mut calls = Vec::new();
    for _ in 0..100 {
        let w = weir.clone();
        calls.push(tokio::spawn(async move { fetch(&w, "/item/hot").await }));
    }
    let mut results = std::collections::BTreeMap::new();
    for c in calls {
        let (s, parts, b) = c.await.unwrap();
        assert_eq!((s, b.as_str()), (200, "item 1"));
        *results.entry(header(&parts, "x-weir-cache")).or_insert(0) += 1;
    }
    assert_eq!(up.requests(), 1, "{results:?}");
    assert_eq!(results.get("miss"), Some(&1), "{results:?}");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    stale_if_error_answers_through_an_outage
);
async fn stale_if_error_answers_through_an_outage(path: DataPath) {
    let (up, k) = catalogue("max-age=1, stale-if-error=60").await;
    let cfg = format!("{CACHE}[upstreams.svc.retry]\nmax_attempts = 1\n");
    let weir = Weir::single_on(path, &up.url(), &cfg).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    k.status.store(503, Ordering::SeqCst);
    // A 30 s outage: every read is the stale entry.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (s, parts, b) = fetch(&weir, "/item/1").await;
        assert_eq!((s, b.as_str()), (200, "item 1"));
        assert_eq!(header(&parts, "x-weir-cache"), "stale-if-error");
    }
    // Past the window the error gets through.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(fetch(&weir, "/item/1").await.0, 503);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    must_revalidate_is_never_served_stale
);
async fn must_revalidate_is_never_served_stale(path: DataPath) {
    let (up, k) =
        catalogue("max-age=1, must-revalidate, stale-if-error=60, stale-while-revalidate=60").await;
    let cfg = format!("{CACHE}stale_if_error = \"1h\"\n[upstreams.svc.retry]\nmax_attempts = 1\n");
    let weir = Weir::single_on(path, &up.url(), &cfg).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    k.status.store(503, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (s, parts, _) = fetch(&weir, "/item/1").await;
    assert_eq!(s, 503);
    assert_eq!(header(&parts, "x-weir-cache"), "miss");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_open_breaker_with_a_warm_cache_still_answers_reads
);
async fn an_open_breaker_with_a_warm_cache_still_answers_reads(path: DataPath) {
    let (up, k) = catalogue("max-age=1, stale-if-error=600").await;
    let cfg = format!(
        "{CACHE}[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 2\nfailing_for = \"0s\"\nopen = \"60s\"\n"
    );
    let weir = Weir::single_on(path, &up.url(), &cfg).await;
    assert_eq!(fetch(&weir, "/warm").await.2, "item 1");
    k.status.store(503, Ordering::SeqCst);
    for i in 0..2 {
        assert_eq!(fetch(&weir, &format!("/cold/{i}")).await.0, 503);
    }
    let seen = up.requests();
    let (s, cold, _) = fetch(&weir, "/cold/x").await;
    assert_eq!(
        (s, header(&cold, "x-weir-error").as_str()),
        (503, "circuit_open")
    );
    // weir's own error to a request the cache took up is a miss too.
    assert_eq!(header(&cold, "x-weir-cache"), "miss");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (s, parts, b) = fetch(&weir, "/warm").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&parts, "x-weir-cache"), "stale-if-error");
    assert_eq!(header(&parts, "x-weir-attempts"), "0");
    assert_eq!(up.requests(), seen, "the open breaker let nothing through");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    stale_while_revalidate_answers_at_once_and_refreshes_once
);
async fn stale_while_revalidate_answers_at_once_and_refreshes_once(path: DataPath) {
    // Lifetimes of a few seconds: an answer's Date has whole seconds, so
    // it may arrive up to a second old by the wall clock.
    let (up, k) = catalogue("max-age=5, stale-while-revalidate=30").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    tokio::time::sleep(Duration::from_secs(7)).await;
    // The refresh takes a while: every read meanwhile is the stale entry.
    k.hold.store(300, Ordering::SeqCst);
    for _ in 0..5 {
        let (_, parts, b) = fetch(&weir, "/item/1").await;
        assert_eq!(
            (header(&parts, "x-weir-cache").as_str(), b.as_str()),
            ("stale", "item 1")
        );
    }
    // The one background refresh has stored the new response.
    for _ in 0..50 {
        if up.requests() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("hit", "item 2")
    );
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_304_revalidates_the_entry
);
async fn a_304_revalidates_the_entry(path: DataPath) {
    let (up, k) = catalogue("max-age=5").await;
    *k.etag.lock().unwrap() = Some("\"v1\"".into());
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (s, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&parts, "x-weir-cache"), "revalidated");
    assert_eq!(k.conditionals.load(Ordering::SeqCst), 1);
    // Fresh again after the 304: a hit.
    let (_, parts, _) = fetch(&weir, "/item/1").await;
    assert_eq!(header(&parts, "x-weir-cache"), "hit");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test]
    with_the_cache_off_nothing_is_cached_and_writes_invalidate
);
async fn with_the_cache_off_nothing_is_cached_and_writes_invalidate(path: DataPath) {
    let (up, _k) = catalogue("max-age=60").await;
    let off = Weir::single_on(path, &up.url(), "").await;
    let (_, parts, _) = fetch(&off, "/item/1").await;
    assert_eq!(header(&parts, "x-weir-cache"), "");
    assert_eq!(fetch(&off, "/item/1").await.2, "item 2");
    let on = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&on, "/item/1").await.2, "item 3");
    assert_eq!(fetch(&on, "/item/1").await.2, "item 3");
    // A successful write to the target drops its entry.
    let req = Request::post(on.url("/item/1"))
        .header("host", "svc")
        .body(body("x"))
        .unwrap();
    let _ = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(fetch(&on, "/item/1").await.2, "item 5");
}

both_paths!(
    #[tokio::test]
    sites_behind_one_upstream_keep_their_own_entries
);
async fn sites_behind_one_upstream_keep_their_own_entries(path: DataPath) {
    let (up, _k) = catalogue("max-age=60").await;
    let cfg = format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"a.test\", \"b.test\"]\npreserve_host = true\n{CACHE}",
        up.url()
    );
    let weir = Weir::start_on(path, &cfg).await;
    let read = |host: &'static str| {
        let url = weir.url("/page");
        async move {
            let (_, b) = read_body(get(&client(), &url, host).await).await;
            String::from_utf8_lossy(&b).into_owned()
        }
    };
    assert_eq!(read("a.test").await, "item 1");
    assert_eq!(read("b.test").await, "item 2");
    assert_eq!(read("a.test").await, "item 1");
    assert_eq!(read("b.test").await, "item 2");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test]
    a_hit_on_the_wire_states_one_length_and_a_head_gets_no_body
);
async fn a_hit_on_the_wire_states_one_length_and_a_head_gets_no_body(path: DataPath) {
    let (up, _k) = catalogue("max-age=60").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    for method in ["GET", "HEAD"] {
        let req = format!("{method} /item/1 HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n");
        let out = exchange_raw(weir.addr, req.as_bytes()).await;
        let lower = out.to_ascii_lowercase();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(lower.contains("x-weir-cache: hit"), "{out}");
        assert_eq!(lower.matches("content-length: 6\r\n").count(), 1, "{out}");
        assert_eq!(out.ends_with("\r\n\r\nitem 1"), method == "GET", "{out}");
    }
    assert_eq!(up.requests(), 1);
}

/// GET `path` through weir with `fields`: the head and body.
async fn fetch_with(
    weir: &Weir,
    path: &str,
    fields: &[(&str, &str)],
) -> (http::response::Parts, String) {
    let mut req = Request::get(weir.url(path)).header("host", "svc");
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let resp = client().request(req.body(body("")).unwrap()).await.unwrap();
    let (parts, b) = read_body(resp).await;
    (parts, String::from_utf8_lossy(&b).into_owned())
}

both_paths!(
    #[tokio::test]
    vary_keeps_a_variant_per_value_of_the_named_field
);
async fn vary_keeps_a_variant_per_value_of_the_named_field(path: DataPath) {
    let (up, k) = catalogue("max-age=60").await;
    k.extra
        .lock()
        .unwrap()
        .push(("vary".into(), "accept-language".into()));
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    let en = [("accept-language", "en")];
    let fr = [("accept-language", "fr")];
    assert_eq!(fetch_with(&weir, "/p", &en).await.1, "item 1");
    assert_eq!(fetch_with(&weir, "/p", &fr).await.1, "item 2");
    let (parts, b) = fetch_with(&weir, "/p", &en).await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("hit", "item 1")
    );
    assert_eq!(fetch_with(&weir, "/p", &fr).await.1, "item 2");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test]
    what_may_not_be_kept_is_not_kept
);
async fn what_may_not_be_kept_is_not_kept(path: DataPath) {
    // no-store
    let (up, _k) = catalogue("no-store, max-age=60").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/a").await.2, "item 1");
    assert_eq!(fetch(&weir, "/a").await.2, "item 2");
    // Set-Cookie (store_set_cookie = false, the default)
    let (up, k) = catalogue("max-age=60").await;
    k.extra
        .lock()
        .unwrap()
        .push(("set-cookie".into(), "s=1".into()));
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/a").await.2, "item 1");
    assert_eq!(fetch(&weir, "/a").await.2, "item 2");
    // Authorization, unless the answer says public
    let (up, k) = catalogue("max-age=60").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    let auth = [("authorization", "Bearer t")];
    assert_eq!(fetch_with(&weir, "/a", &auth).await.1, "item 1");
    assert_eq!(fetch_with(&weir, "/a", &auth).await.1, "item 2");
    *k.cache_control.lock().unwrap() = "public, max-age=60".into();
    assert_eq!(fetch_with(&weir, "/a", &auth).await.1, "item 3");
    assert_eq!(fetch_with(&weir, "/a", &auth).await.1, "item 3");
    // The client's no-cache: not answered from the entry.
    let (up, _k) = catalogue("max-age=60").await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/a").await.2, "item 1");
    let (parts, b) = fetch_with(&weir, "/a", &[("cache-control", "no-cache")]).await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("miss", "item 2")
    );
}

both_paths!(
    #[tokio::test]
    the_cache_is_bounded_and_evicts_the_least_recently_used
);
async fn the_cache_is_bounded_and_evicts_the_least_recently_used(path: DataPath) {
    let (up, _k) = catalogue("max-age=600").await;
    // An entry here counts 576 + its key + its fields + its body: about
    // 700 bytes; two fit in 1,600, not three.
    let cfg = "[upstreams.svc.cache]\nenabled = true\nmax_bytes = 1600\n";
    let weir = Weir::single_on(path, &up.url(), cfg).await;
    assert_eq!(fetch(&weir, "/1").await.2, "item 1");
    assert_eq!(fetch(&weir, "/2").await.2, "item 2");
    assert_eq!(fetch(&weir, "/1").await.2, "item 1"); // /1 used: /2 is the oldest
    assert_eq!(fetch(&weir, "/3").await.2, "item 3");
    assert_eq!(fetch(&weir, "/1").await.2, "item 1");
    assert_eq!(fetch(&weir, "/2").await.2, "item 4", "evicted");
    let m = metrics(&weir);
    assert!(
        m.contains("weir_cache_evictions_total{upstream=\"svc\"} 2"),
        "{m}"
    );
    let bytes = m
        .lines()
        .find(|l| l.starts_with("weir_cache_bytes{upstream=\"svc\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap();
    assert!((1..=1600).contains(&bytes), "{bytes}");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_refusal_at_admission_is_answered_stale
);
async fn a_refusal_at_admission_is_answered_stale(path: DataPath) {
    let (up, _k) = catalogue("max-age=1, stale-if-error=60").await;
    let cfg = format!(
        "{CACHE}[upstreams.svc.rate_limit]\nrps = 0.01\nburst = 1\n[upstreams.svc.retry]\nmax_attempts = 1\n"
    );
    let weir = Weir::single_on(path, &up.url(), &cfg).await;
    assert_eq!(fetch(&weir, "/a").await.2, "item 1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The token is spent: the stale entry answers instead of 429.
    let (s, parts, b) = fetch(&weir, "/a").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&parts, "x-weir-cache"), "stale-if-error");
    assert_eq!(header(&parts, "x-weir-attempts"), "0");
    // A key with no entry gets the refusal.
    assert_eq!(fetch(&weir, "/b").await.0, 429);
    assert_eq!(up.requests(), 1);
}

/// An upstream that answers every GET with `cache-control: max-age=60`
/// and a head announcing `len` body bytes, of which it sends `sent`
/// (chunked when `len` is 0: `sent` bytes in one chunk and the last chunk),
/// then closes.
async fn announcing(len: usize, sent: usize) -> RawUpstream {
    use tokio::io::AsyncWriteExt;
    RawUpstream::start(move |_, mut s| async move {
        while read_head(&mut s).await {
            let data = "x".repeat(sent);
            let r = match len {
                0 => format!(
                    "HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ntransfer-encoding: chunked\r\n\r\n{sent:x}\r\n{data}\r\n0\r\n\r\n"
                ),
                _ => format!(
                    "HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: {len}\r\n\r\n{data}"
                ),
            };
            if s.write_all(r.as_bytes()).await.is_err() || sent < len {
                return;
            }
        }
    })
    .await
}

both_paths!(
    #[tokio::test]
    a_body_that_breaks_off_is_weirs_error_and_not_stored
);
async fn a_body_that_breaks_off_is_weirs_error_and_not_stored(path: DataPath) {
    let up = announcing(100, 10).await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    for _ in 0..2 {
        let (s, parts, b) = fetch(&weir, "/short").await;
        assert_eq!(s, 502, "{b}");
        assert!(b.contains("upstream_reset"), "{b}");
        assert_eq!(header(&parts, "x-weir-cache"), "miss");
    }
    // Nothing was stored: each request went upstream.
    assert_eq!(up.connections(), 2);
}

both_paths!(
    #[tokio::test]
    a_body_over_max_object_bytes_is_relayed_whole_not_stored
);
async fn a_body_over_max_object_bytes_is_relayed_whole_not_stored(path: DataPath) {
    let cfg = format!("{CACHE}max_object_bytes = 1024\nmax_bytes = 65536\n");
    for (len, sent) in [(4096, 4096), (0, 4096), (0, 512)] {
        let up = announcing(len, sent).await;
        let weir = Weir::single_on(path, &up.url(), &cfg).await;
        let (s, first, b) = fetch(&weir, "/big").await;
        assert_eq!((s, b.len()), (200, sent));
        assert_eq!(header(&first, "x-weir-cache"), "miss");
        let (_, again, b) = fetch(&weir, "/big").await;
        assert_eq!(b.len(), sent);
        let expect = if sent > 1024 { "miss" } else { "hit" };
        assert_eq!(header(&again, "x-weir-cache"), expect, "{len} {sent}");
    }
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_304_that_matches_no_entry_is_asked_again_plainly
);
/// A 304 whose validator is not the entry's (the upstream moved on): the
/// entry is dropped and the request is sent again without validators, on
/// the same path, within the one request; the client gets the new
/// response, a miss, never the 304.
async fn a_304_that_matches_no_entry_is_asked_again_plainly(path: DataPath) {
    let conditionals = Arc::new(AtomicUsize::new(0));
    let seen = conditionals.clone();
    let n = Arc::new(AtomicUsize::new(0));
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (seen, n) = (seen.clone(), n.clone());
        async move {
            let b = Response::builder().header("cache-control", "max-age=5");
            if req.headers().contains_key("if-none-match") {
                seen.fetch_add(1, Ordering::SeqCst);
                return b
                    .status(304)
                    .header("etag", "\"v2\"")
                    .body(body(""))
                    .unwrap();
            }
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            let etag = if i == 1 { "\"v1\"" } else { "\"v2\"" };
            b.header("etag", etag)
                .body(body(format!("item {i}")))
                .unwrap()
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), CACHE).await;
    assert_eq!(fetch(&weir, "/item/1").await.2, "item 1");
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (s, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!((s, b.as_str()), (200, "item 2"));
    assert_eq!(header(&parts, "x-weir-cache"), "miss");
    assert_eq!(header(&parts, "etag"), "\"v2\"");
    assert_eq!(conditionals.load(Ordering::SeqCst), 1);
    assert_eq!(up.requests(), 3);
    // What the plain request brought was stored: a hit now.
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("hit", "item 2")
    );
    assert_eq!(up.requests(), 3);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_h2c_upstreams_responses_are_cached_on_the_path_they_arrive_on
);
/// An `h2c` upstream's misses are stored, revalidated and invalidated as
/// an HTTP/1.1 upstream's are, on either path (the fast path used to hand
/// such a miss to the general path).
async fn an_h2c_upstreams_responses_are_cached_on_the_path_they_arrive_on(path: DataPath) {
    let (up, k) = catalogue("max-age=5").await;
    *k.etag.lock().unwrap() = Some("\"v1\"".into());
    let extra = format!("protocol = \"h2c\"\n{CACHE}");
    let weir = Weir::single_on(path, &up.url(), &extra).await;
    let (s, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!((s, b.as_str()), (200, "item 1"));
    assert_eq!(header(&parts, "x-weir-cache"), "miss");
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("hit", "item 1")
    );
    assert_eq!(up.requests(), 1);
    // Stale: revalidated with the entry's validators, a 304 refreshes it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("revalidated", "item 1")
    );
    assert_eq!(k.conditionals.load(Ordering::SeqCst), 1);
    // A write's success drops the entry.
    let req = Request::builder()
        .method("DELETE")
        .uri(weir.url("/item/1"))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    *k.etag.lock().unwrap() = None;
    let (_, parts, b) = fetch(&weir, "/item/1").await;
    assert_eq!(
        (header(&parts, "x-weir-cache").as_str(), b.as_str()),
        ("miss", "item 3")
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_body_that_stalls_while_it_is_read_for_the_cache_is_cut_at_idle_timeout
);
/// A response that may be stored is read whole before it is relayed; a
/// body that stops arriving meanwhile is bounded by `idle_timeout`, as
/// when it is relayed: weir's 502, nothing stored, and the key's fill is
/// not held (the next request goes upstream at once). Over h2c as well,
/// whose body the cache reads as hyper gives it.
async fn a_body_that_stalls_while_it_is_read_for_the_cache_is_cut_at_idle_timeout(path: DataPath) {
    use tokio::io::AsyncWriteExt;
    let up = RawUpstream::start(|_, mut s| async move {
        while read_head(&mut s).await {
            let r = "HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 100\r\n\r\n0123456789";
            if s.write_all(r.as_bytes()).await.is_err() {
                return;
            }
            // Then nothing, for longer than any timeout here.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    })
    .await;
    let cfg = format!("idle_timeout = \"1s\"\ntimeout = \"30s\"\n{CACHE}");
    let weir = Weir::single_on(path, &up.url(), &cfg).await;
    let began = tokio::time::Instant::now();
    let (s, parts, b) = fetch(&weir, "/stall").await;
    assert_eq!(s, 502, "{b}");
    assert!(b.contains("upstream_reset"), "{b}");
    assert_eq!(header(&parts, "x-weir-cache"), "miss");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    let (s, _, _) = fetch(&weir, "/stall").await;
    assert_eq!(s, 502);
    assert_eq!(up.connections(), 2);
}
