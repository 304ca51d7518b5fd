//! Hedged requests (docs/reference/hedging.md#hedging) against three real
//! replicas on 127.0.0.2–4, through the HTTP/1.1 fast path, the general
//! path and an h2c upstream (on either path): a request stuck on a slow replica is answered
//! by a hedge to another one, and the slow replica sees its request
//! cancelled (its connection closed, or its stream reset); an unkeyed POST
//! is never hedged; in a brownout the hedges stay within `max_extra`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use hyper::Response;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Fast,
    General,
    /// An h2c upstream, the general path.
    H2c,
    /// An h2c upstream, the fast path (HTTP/1.1 client).
    H2cFast,
}

/// What one replica saw.
#[derive(Default)]
struct Seen {
    started: AtomicUsize,
    /// Requests whose handler was dropped before it answered: the client
    /// (weir) closed the connection or reset the stream.
    cancelled: AtomicUsize,
    posts: AtomicUsize,
}

struct Cancelled(Arc<Seen>, bool);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Three replicas; replica `i` takes `delay(i, n)` to answer its `n`th request.
async fn replicas(
    delay: impl Fn(usize, usize) -> Duration + Send + Sync + Copy + 'static,
) -> (Vec<TestUpstream>, Vec<Arc<Seen>>) {
    let mut ups = Vec::new();
    let mut seen = Vec::new();
    for i in 0..3usize {
        let s = Arc::new(Seen::default());
        let s2 = s.clone();
        let up = TestUpstream::start_at(&format!("127.0.0.{}:0", 2 + i), move |req| {
            let s = s2.clone();
            let n = s.started.fetch_add(1, Ordering::SeqCst);
            if req.method() == hyper::Method::POST {
                s.posts.fetch_add(1, Ordering::SeqCst);
            }
            let wait = delay(i, n);
            async move {
                let mut guard = Cancelled(s, false);
                tokio::time::sleep(wait).await;
                guard.1 = true;
                Response::new(body(format!("replica {i}")))
            }
        })
        .await;
        ups.push(up);
        seen.push(s);
    }
    (ups, seen)
}

async fn weir(via: Via, addrs: &[SocketAddr], hedge: &str) -> Weir {
    let path = match via {
        Via::Fast | Via::H2cFast => DataPath::Fast,
        Via::General | Via::H2c => DataPath::General,
    };
    Weir::over(
        path,
        matches!(via, Via::H2c | Via::H2cFast),
        addrs,
        // Round robin: every third request goes to replica 0, whatever its
        // latency estimate says (peak-EWMA would learn to avoid a slow one,
        // and the tests are of what happens when a request gets there).
        &format!("balance = \"round_robin\"\n[upstreams.svc.hedge]\n{hedge}"),
    )
    .await
}

/// `weir_hedges_total{upstream="svc",result=…}` and the attempts' sum.
fn counts(w: &Weir) -> (std::collections::BTreeMap<String, f64>, f64) {
    let text = w.handle.as_ref().unwrap().metrics().render();
    let mut hedges = std::collections::BTreeMap::new();
    let mut attempts = 0.0;
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        if series.starts_with("weir_hedges_total{") && series.contains("upstream=\"svc\"") {
            let r = series
                .split("result=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            hedges.insert(r.to_string(), value);
        }
        if series.starts_with("weir_upstream_attempts_total{")
            && series.contains("upstream=\"svc\"")
        {
            attempts += value;
        }
    }
    (hedges, attempts)
}

async fn a_slow_replica_is_hedged_around(via: Via) {
    // Replica 0 takes 2 s; the others answer at once.
    let (ups, seen) = replicas(|i, _| {
        if i == 0 {
            Duration::from_secs(2)
        } else {
            Duration::ZERO
        }
    })
    .await;
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let w = weir(via, &addrs, "after = \"30ms\"\nmax_extra = 1.0").await;
    let c = client();
    let mut won = 0;
    for i in 0..24 {
        let resp = get(&c, &w.url(&format!("/r{i}")), "svc").await;
        let (parts, b) = read_body(resp).await;
        assert_eq!(parts.status, 200, "request {i}");
        assert_ne!(b, "replica 0", "request {i} waited for the slow replica");
        match header(&parts, "x-weir-hedge").as_str() {
            "won" => {
                won += 1;
                assert_eq!(header(&parts, "x-weir-attempts"), "2", "request {i}");
            }
            "" => assert_eq!(header(&parts, "x-weir-attempts"), "1", "request {i}"),
            other => panic!("request {i}: x-weir-hedge: {other}"),
        }
    }
    let slow = seen[0].started.load(Ordering::SeqCst);
    assert!(won >= 1 && slow >= 1, "no request went to the slow replica");
    assert_eq!(won, slow, "every request the slow replica got was hedged");
    // Each losing attempt was really cancelled at the replica.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while seen[0].cancelled.load(Ordering::SeqCst) < slow && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen[0].cancelled.load(Ordering::SeqCst), slow);
    let (hedges, _) = counts(&w);
    assert_eq!(hedges.get("won"), Some(&(won as f64)), "{hedges:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replica_is_hedged_around_fast() {
    a_slow_replica_is_hedged_around(Via::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replica_is_hedged_around_general() {
    a_slow_replica_is_hedged_around(Via::General).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replica_is_hedged_around_h2c() {
    a_slow_replica_is_hedged_around(Via::H2c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_replica_is_hedged_around_h2c_on_the_fast_path() {
    a_slow_replica_is_hedged_around(Via::H2cFast).await;
}

async fn an_unkeyed_post_is_never_hedged(via: Via) {
    let (ups, seen) = replicas(|_, _| Duration::from_millis(150)).await;
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let w = weir(via, &addrs, "after = \"20ms\"\nmax_extra = 1.0").await;
    let c = client();
    for i in 0..3 {
        let req = hyper::Request::post(w.url(&format!("/charge/{i}")))
            .header("host", "svc")
            .body(body("charge"))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        let (parts, _) = read_body(resp).await;
        assert_eq!(parts.status, 200);
        assert_eq!(header(&parts, "x-weir-hedge"), "");
        assert_eq!(header(&parts, "x-weir-attempts"), "1");
    }
    let posts: usize = seen.iter().map(|s| s.posts.load(Ordering::SeqCst)).sum();
    assert_eq!(posts, 3, "each POST delivered once");
    let (hedges, _) = counts(&w);
    assert_eq!(hedges.get("skipped_unsafe"), Some(&3.0), "{hedges:?}");
    assert_eq!(hedges.get("won"), Some(&0.0));
    assert_eq!(hedges.get("lost"), Some(&0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_post_is_never_hedged_fast() {
    an_unkeyed_post_is_never_hedged(Via::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_post_is_never_hedged_general() {
    an_unkeyed_post_is_never_hedged(Via::General).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_post_is_never_hedged_h2c() {
    an_unkeyed_post_is_never_hedged(Via::H2c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_post_is_never_hedged_h2c_on_the_fast_path() {
    an_unkeyed_post_is_never_hedged(Via::H2cFast).await;
}

async fn a_brownout_keeps_hedges_within_max_extra(via: Via) {
    // Every replica is slow: every request would want a hedge.
    let (ups, _) = replicas(|_, _| Duration::from_millis(25)).await;
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let w = weir(via, &addrs, "after = \"5ms\"\nmax_extra = 0.05").await;
    let c = client();
    // 1,000 requests: at most 0.05 × 1,000 + 10 saved-up hedges = 60, so
    // attempts per request ≤ 1.06 = 1 + max_extra + 0.01, whatever the
    // latency does.
    const N: usize = 1000;
    let mut tasks = Vec::new();
    for k in 0..8 {
        let (c, url) = (c.clone(), w.url("/item"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..N / 8 {
                let resp = get(&c, &url, "svc").await;
                assert_eq!(read_body(resp).await.0.status, 200, "client {k}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (hedges, attempts) = counts(&w);
    let sent = hedges.get("won").unwrap_or(&0.0) + hedges.get("lost").unwrap_or(&0.0);
    // At most max_extra of requests, plus the credit a quiet start allows.
    assert!(sent <= 0.05 * N as f64 + 10.0, "{hedges:?}");
    assert!(sent >= 1.0, "no hedge at all: {hedges:?}");
    assert!(
        hedges.get("skipped_extra").is_some_and(|n| *n > 0.0),
        "{hedges:?}"
    );
    let per_request = attempts / N as f64;
    assert!(
        per_request <= 1.0 + 0.05 + 0.01,
        "{per_request} attempts per request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brownout_keeps_hedges_within_max_extra_fast() {
    a_brownout_keeps_hedges_within_max_extra(Via::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brownout_keeps_hedges_within_max_extra_general() {
    a_brownout_keeps_hedges_within_max_extra(Via::General).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brownout_keeps_hedges_within_max_extra_h2c() {
    a_brownout_keeps_hedges_within_max_extra(Via::H2c).await;
}

/// With `keyed_writes = true` a keyed POST is hedged; both attempts carry
/// the client's key, so an upstream that deduplicates by it (as a payment
/// API does) processes it once. Without the key nothing is hedged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_is_hedged_only_when_configured() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    // Replica 0 is slow; each replica records the keys it saw.
    let keys: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut ups = Vec::new();
    for i in 0..3usize {
        let keys = keys.clone();
        let up = TestUpstream::start_at(&format!("127.0.0.{}:0", 2 + i), move |req| {
            let key = req
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string();
            *keys.lock().unwrap().entry(key).or_default() += 1;
            async move {
                if i == 0 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Response::new(body(format!("replica {i}")))
            }
        })
        .await;
        ups.push(up);
    }
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let w = weir(
        Via::General,
        &addrs,
        "after = \"30ms\"\nmax_extra = 1.0\nkeyed_writes = true",
    )
    .await;
    let c = client();
    let mut hedged = 0;
    for i in 0..12 {
        let req = hyper::Request::post(w.url(&format!("/pay/{i}")))
            .header("host", "svc")
            .header("idempotency-key", format!("k{i}"))
            .body(body("pay"))
            .unwrap();
        let (parts, b) = read_body(c.request(req).await.unwrap()).await;
        assert_eq!(parts.status, 200);
        assert_ne!(b, "replica 0", "request {i} waited for the slow replica");
        if header(&parts, "x-weir-hedge") == "won" {
            hedged += 1;
            // The slow replica and the hedge's both saw this request's key.
            assert_eq!(keys.lock().unwrap().get(&format!("k{i}")), Some(&2));
        }
    }
    assert!(hedged >= 1, "no keyed POST was hedged");
    assert!(
        !keys.lock().unwrap().contains_key("-"),
        "a POST without its key"
    );

    // Without `keyed_writes`, a keyed POST is not hedged.
    let (slow, seen) = replicas(|_, _| Duration::from_millis(150)).await;
    let addrs: Vec<_> = slow.iter().map(|u| u.addr).collect();
    let w = weir(Via::Fast, &addrs, "after = \"20ms\"\nmax_extra = 1.0").await;
    for i in 0..3 {
        let req = hyper::Request::post(w.url(&format!("/pay/{i}")))
            .header("host", "svc")
            .header("idempotency-key", format!("n{i}"))
            .body(body("pay"))
            .unwrap();
        let (parts, _) = read_body(c.request(req).await.unwrap()).await;
        assert_eq!(parts.status, 200);
        assert_eq!(header(&parts, "x-weir-hedge"), "");
    }
    let posts: usize = seen.iter().map(|s| s.posts.load(Ordering::SeqCst)).sum();
    assert_eq!(posts, 3);
    assert_eq!(counts(&w).0.get("skipped_unsafe"), Some(&3.0));
}
