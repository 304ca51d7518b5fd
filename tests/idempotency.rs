//! Idempotency keys (docs/reference/idempotency.md#idempotency-keys), on both paths,
//! counting what the upstream received: a repeat of a completed keyed write
//! is answered from the record, a repeat while it runs is 409, a key reused
//! for another request is 422, outcomes a retry could change are not kept,
//! an uncertain one is forwarded again, and the store's bounds hold.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir::policy::idempotency::ENTRY_OVERHEAD;

/// An upstream that answers every POST `201` with `order N` (N counts the
/// POSTs it received) and `x-order: N`; `status` overrides the status
/// while it is not 0.
struct Orders {
    up: TestUpstream,
    status: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Semaphore>,
}

async fn orders(size: usize) -> Orders {
    let status = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(1_000_000));
    let n = Arc::new(AtomicUsize::new(0));
    let (s, r) = (status.clone(), release.clone());
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (s, r, n) = (s.clone(), r.clone(), n.clone());
        async move {
            let _ = req.into_body().collect().await;
            let _permit = r.acquire().await.unwrap();
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            let status = match s.load(Ordering::SeqCst) {
                0 => 201,
                other => other as u16,
            };
            let mut text = format!("order {i}").into_bytes();
            text.resize(text.len().max(size), b'.');
            Response::builder()
                .status(status)
                .header("x-order", i.to_string())
                .body(body(text))
                .unwrap()
        }
    })
    .await;
    Orders {
        up,
        status,
        release,
    }
}

/// A POST to `/orders` with `key` (when given) and `payload`: status, the
/// head, the body.
async fn post(
    weir: &Weir,
    key: Option<&str>,
    payload: &'static str,
) -> (u16, http::response::Parts, Bytes) {
    let mut b = Request::post(weir.url("/orders")).header("host", "svc");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    let resp = client()
        .request(b.body(body(payload)).unwrap())
        .await
        .unwrap();
    let (parts, body) = read_body(resp).await;
    (parts.status.as_u16(), parts, body)
}

const NO_RETRY: &str = "[upstreams.svc.retry]\nmax_attempts = 1\n";

both_paths!(
    #[tokio::test]
    a_repeat_is_answered_from_the_record
);
async fn a_repeat_is_answered_from_the_record(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(path, &o.up.url(), "").await;
    let (status, first, b) = post(&weir, Some("k1"), "pay 10").await;
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    assert_eq!(header(&first, "idempotent-replayed"), "");
    for _ in 0..3 {
        let (status, again, b) = post(&weir, Some("k1"), "pay 10").await;
        assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
        assert_eq!(header(&again, "idempotent-replayed"), "true");
        assert_eq!(header(&again, "x-weir-attempts"), "0");
        assert_eq!(header(&again, "x-order"), "1");
        assert_eq!(header(&again, "date"), header(&first, "date"));
    }
    assert_eq!(o.up.requests(), 1);
    // Another key, and no key at all, reach the upstream.
    assert_eq!(&post(&weir, Some("k2"), "pay 10").await.2[..], b"order 2");
    assert_eq!(&post(&weir, None, "pay 10").await.2[..], b"order 3");
    assert_eq!(&post(&weir, None, "pay 10").await.2[..], b"order 4");
    assert_eq!(o.up.requests(), 4);
}

both_paths!(
    #[tokio::test]
    a_key_reused_for_another_request_is_422
);
async fn a_key_reused_for_another_request_is_422(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(path, &o.up.url(), "").await;
    assert_eq!(post(&weir, Some("k1"), "pay 10").await.0, 201);
    let (status, parts, _) = post(&weir, Some("k1"), "pay 99").await;
    assert_eq!(status, 422);
    assert_eq!(header(&parts, "x-weir-error"), "idempotency_key_reused");
    assert_eq!(o.up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    fifty_at_once_with_one_key_reach_the_upstream_once
);
async fn fifty_at_once_with_one_key_reach_the_upstream_once(path: DataPath) {
    let o = orders(0).await;
    let weir = Arc::new(Weir::single_on(path, &o.up.url(), "").await);
    // The upstream holds every request until the 49 refusals are in.
    let held = o.release.acquire_many(1_000_000).await.unwrap();
    let mut calls = Vec::new();
    for _ in 0..50 {
        let w = weir.clone();
        calls.push(tokio::spawn(async move {
            post(&w, Some("once"), "pay 10").await
        }));
    }
    let mut refused = 0;
    let mut pending = Vec::new();
    for c in calls {
        // Refusals come at once; the one forwarded waits for the upstream.
        match tokio::time::timeout(Duration::from_secs(2), &mut Box::pin(c)).await {
            Ok(r) => {
                let (status, parts, _) = r.unwrap();
                assert_eq!(status, 409);
                assert_eq!(header(&parts, "x-weir-error"), "idempotency_in_flight");
                assert_eq!(header(&parts, "retry-after"), "1");
                refused += 1;
            }
            Err(_) => pending.push(()),
        }
        if refused + pending.len() == 50 {
            break;
        }
    }
    assert_eq!((refused, pending.len()), (49, 1));
    drop(held);
    // The first completes; a repeat now replays it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, again, _) = post(&weir, Some("once"), "pay 10").await;
    assert_eq!(
        (status, header(&again, "idempotent-replayed").as_str()),
        (201, "true")
    );
    assert_eq!(o.up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    outcomes_a_retry_could_change_are_not_kept
);
async fn outcomes_a_retry_could_change_are_not_kept(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(path, &o.up.url(), NO_RETRY).await;
    for status in [503, 500, 429, 409, 408] {
        o.status.store(status, Ordering::SeqCst);
        assert_eq!(post(&weir, Some("k"), "pay").await.0, status as u16);
    }
    // A final 4xx is kept like a 2xx.
    o.status.store(404, Ordering::SeqCst);
    assert_eq!(post(&weir, Some("k"), "pay").await.0, 404);
    o.status.store(0, Ordering::SeqCst);
    let (status, parts, _) = post(&weir, Some("k"), "pay").await;
    assert_eq!(
        (status, header(&parts, "idempotent-replayed").as_str()),
        (404, "true")
    );
    assert_eq!(o.up.requests(), 6);
}

both_paths!(
    #[tokio::test]
    an_uncertain_attempt_is_forwarded_again
);
async fn an_uncertain_attempt_is_forwarded_again(path: DataPath) {
    // Reads the request, then resets the first connection; answers 201 after.
    let up = RawUpstream::start(|n, mut s| async move {
        if !read_head(&mut s).await {
            return;
        }
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            reset(s);
        } else {
            respond(&mut s, 201, "", "done").await;
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), NO_RETRY).await;
    let (status, parts, _) = post(&weir, Some("k"), "pay").await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (502, "upstream_reset")
    );
    let (status, parts, b) = post(&weir, Some("k"), "pay").await;
    assert_eq!((status, &b[..]), (201, &b"done"[..]));
    assert_eq!(header(&parts, "idempotent-replayed"), "");
    assert_eq!(up.connections(), 2);
}

both_paths!(
    #[tokio::test]
    a_response_too_large_to_keep_is_not_delivered_twice
);
async fn a_response_too_large_to_keep_is_not_delivered_twice(path: DataPath) {
    let o = orders(4096).await;
    let weir = Weir::single_on(
        path,
        &o.up.url(),
        "[upstreams.svc.idempotency]\nmax_response_bytes = 1024\n",
    )
    .await;
    let (status, _, b) = post(&weir, Some("big"), "pay").await;
    assert_eq!((status, b.len()), (201, 4096));
    let (status, parts, _) = post(&weir, Some("big"), "pay").await;
    assert_eq!(status, 409);
    assert_eq!(header(&parts, "x-weir-error"), "idempotency_not_replayable");
    assert_eq!(o.up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    an_open_breaker_never_blocks_a_replay
);
async fn an_open_breaker_never_blocks_a_replay(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(
        path,
        &o.up.url(),
        "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 3\nfailing_for = \"0s\"\nopen = \"60s\"\n[upstreams.svc.rate_limit]\nrps = 0.001\nburst = 5\n",
    )
    .await;
    assert_eq!(post(&weir, Some("paid"), "pay").await.0, 201);
    o.status.store(503, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(post(&weir, None, "x").await.0, 503);
    }
    // Open, and the rate limit spent: a new request is refused...
    let (status, parts, _) = post(&weir, None, "x").await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (503, "circuit_open")
    );
    // ...and the recorded one still answered.
    let (status, parts, b) = post(&weir, Some("paid"), "pay").await;
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    assert_eq!(header(&parts, "idempotent-replayed"), "true");
    assert_eq!(o.up.requests(), 4);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    records_expire_after_their_ttl
);
async fn records_expire_after_their_ttl(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(
        path,
        &o.up.url(),
        "[upstreams.svc.idempotency]\nttl = \"1h\"\n",
    )
    .await;
    assert_eq!(post(&weir, Some("k"), "pay").await.0, 201);
    tokio::time::sleep(Duration::from_secs(3599)).await;
    assert_eq!(
        header(
            &post(&weir, Some("k"), "pay").await.1,
            "idempotent-replayed"
        ),
        "true"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, parts, b) = post(&weir, Some("k"), "pay").await;
    assert_eq!((status, &b[..]), (201, &b"order 2"[..]));
    assert_eq!(header(&parts, "idempotent-replayed"), "");
}

/// The bytes one record of a `POST /orders` answered by [`orders`] counts:
/// the fixed overhead, the key, the kept fields as `name: value\r\n`
/// (`date`, `x-order`; not the framing) and the body.
fn record_bytes(key: &str, parts: &http::response::Parts, body: &[u8]) -> usize {
    let fields: usize = ["date", "x-order"]
        .iter()
        .map(|n| n.len() + ": ".len() + header(parts, n).len() + "\r\n".len())
        .sum();
    // The key is kept with its principal's suffix: `~` and 32 hex digits.
    ENTRY_OVERHEAD + key.len() + 33 + fields + body.len()
}

fn store_bytes(weir: &Weir) -> usize {
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let state = &snap.upstreams[0].state;
    let store = state.idempotency();
    store
        .as_ref()
        .map(|s| {
            use weir::policy::idempotency::IdempotencyStore;
            s.stats().bytes
        })
        .unwrap()
}

both_paths!(
    #[tokio::test]
    the_store_counts_every_byte_and_evicts_the_oldest
);
async fn the_store_counts_every_byte_and_evicts_the_oldest(path: DataPath) {
    let o = orders(0).await;
    // Room for two records of this size, not three.
    let weir = Weir::single_on(
        path,
        &o.up.url(),
        "[upstreams.svc.idempotency]\nmax_bytes = 1400\nmax_response_bytes = 200\n",
    )
    .await;
    let (_, p1, b1) = post(&weir, Some("key-1"), "a").await;
    let one = record_bytes("key-1", &p1, &b1);
    assert_eq!(store_bytes(&weir), one);
    let (_, p2, b2) = post(&weir, Some("key-2"), "a").await;
    assert_eq!(store_bytes(&weir), one + record_bytes("key-2", &p2, &b2));
    let (_, p3, b3) = post(&weir, Some("key-3"), "a").await;
    assert_eq!(
        store_bytes(&weir),
        record_bytes("key-2", &p2, &b2) + record_bytes("key-3", &p3, &b3)
    );
    // key-1 was evicted: forwarded again; key-3 still replays.
    assert_eq!(&post(&weir, Some("key-1"), "a").await.2[..], b"order 4");
    assert_eq!(
        header(
            &post(&weir, Some("key-3"), "a").await.1,
            "idempotent-replayed"
        ),
        "true"
    );
    assert_eq!(o.up.requests(), 4);
}

both_paths!(
    #[tokio::test]
    a_client_that_leaves_still_gets_its_answer_recorded
);
/// The impatient app: it gives up on a keyed POST and re-sends it. weir
/// keeps the first exchange going, refuses the re-send while it runs, and
/// answers the next from the record: one delivery.
async fn a_client_that_leaves_still_gets_its_answer_recorded(path: DataPath) {
    let o = orders(0).await;
    let weir = Arc::new(Weir::single_on(path, &o.up.url(), NO_RETRY).await);
    let held = o.release.acquire_many(1_000_000).await.unwrap();
    let w = weir.clone();
    let first = tokio::spawn(async move { post(&w, Some("k"), "pay").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, parts, _) = post(&weir, Some("k"), "pay").await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (409, "idempotency_in_flight")
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, parts, b) = post(&weir, Some("k"), "pay").await;
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    assert_eq!(header(&parts, "idempotent-replayed"), "true");
    assert_eq!(o.up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    a_client_that_leaves_mid_body_still_gets_the_whole_answer_recorded
);
/// The client reads the head and the first part of a keyed write's answer
/// and leaves while the rest is still on its way: weir reads the rest all
/// the same, and the re-send is answered from the record, whole.
async fn a_client_that_leaves_mid_body_still_gets_the_whole_answer_recorded(path: DataPath) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = Arc::new(tokio::sync::Semaphore::new(0));
    let posts = Arc::new(AtomicUsize::new(0));
    let (r, n) = (rest.clone(), posts.clone());
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (r, n) = (r.clone(), n.clone());
        async move {
            let _ = req.into_body().collect().await;
            n.fetch_add(1, Ordering::SeqCst);
            let (tx, rx) = tokio::sync::mpsc::channel::<
                Result<_, Box<dyn std::error::Error + Send + Sync>>,
            >(2);
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(hyper::body::Frame::data(Bytes::from("first half;"))))
                    .await;
                let _permit = r.acquire().await.unwrap();
                let _ = tx
                    .send(Ok(hyper::body::Frame::data(Bytes::from("second half"))))
                    .await;
            });
            let stream = http_body_util::StreamBody::new(tokio_stream_of(rx));
            Response::builder()
                .status(201)
                .header("content-length", "22")
                .body(http_body_util::BodyExt::boxed(stream))
                .unwrap()
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), NO_RETRY).await;
    let mut c = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(
        b"POST /orders HTTP/1.1\r\nhost: svc\r\nidempotency-key: m\r\n\
          content-length: 3\r\n\r\npay",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("first half;") {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0, "weir closed before the first half: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    rest.add_permits(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = client()
        .request(
            Request::post(weir.url("/orders"))
                .header("host", "svc")
                .header("idempotency-key", "m")
                .body(body("pay"))
                .unwrap(),
        )
        .await
        .unwrap();
    let (parts, b) = read_body(resp).await;
    assert_eq!(
        (parts.status.as_u16(), &b[..]),
        (201, &b"first half;second half"[..])
    );
    assert_eq!(header(&parts, "idempotent-replayed"), "true");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
}

/// The frames a channel receives, as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

both_paths!(
    #[tokio::test]
    a_key_is_not_wedged_by_an_upstream_that_never_answers
);
/// The exchange a departed client left behind ends at the request's
/// deadline; the key is then uncertain, and a re-send is forwarded.
async fn a_key_is_not_wedged_by_an_upstream_that_never_answers(path: DataPath) {
    let o = orders(0).await;
    let extra = format!("timeout = \"300ms\"\n{NO_RETRY}");
    let weir = Arc::new(Weir::single_on(path, &o.up.url(), &extra).await);
    let held = o.release.acquire_many(1_000_000).await.unwrap();
    let w = weir.clone();
    let first = tokio::spawn(async move { post(&w, Some("k"), "pay").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(held);
    // (weir gave the first up and closed its connection: the upstream never
    // finished it, so this is its first order.)
    let (status, parts, b) = post(&weir, Some("k"), "pay").await;
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    assert_eq!(header(&parts, "idempotent-replayed"), "");
    assert_eq!(o.up.requests(), 2);
}

both_paths!(
    #[tokio::test]
    bad_keys_are_400_and_other_methods_are_not_recorded
);
async fn bad_keys_are_400_and_other_methods_are_not_recorded(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(path, &o.up.url(), "").await;
    let long = "k".repeat(256);
    for bad in ["", long.as_str()] {
        let req = format!(
            "POST /orders HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: {bad}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        );
        let out = exchange_raw(weir.addr, req.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
        assert!(out.contains("x-weir-error: bad_request"), "{out}");
    }
    // Not text (obs-text bytes, which the HTTP grammar lets through).
    let mut req = b"POST /orders HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k\xff\xfe\r\n".to_vec();
    req.extend_from_slice(b"Content-Length: 1\r\nConnection: close\r\n\r\nx");
    let out = exchange_raw(weir.addr, &req).await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("x-weir-error: bad_request"), "{out}");
    assert_eq!(o.up.requests(), 0);
    // A PUT is idempotent by itself: its key is passed on, not recorded.
    for _ in 0..2 {
        let req = Request::put(weir.url("/orders"))
            .header("host", "svc")
            .header("idempotency-key", "put")
            .body(body("x"))
            .unwrap();
        let (parts, _) = read_body(client().request(req).await.unwrap()).await;
        assert_eq!(header(&parts, "idempotent-replayed"), "");
    }
    assert_eq!(o.up.requests(), 2);
}

/// A keyed POST of `payload` to `/orders`: status, the head, the body.
async fn post_bytes(
    weir: &Weir,
    key: &str,
    payload: Vec<u8>,
) -> (u16, http::response::Parts, Bytes) {
    let req = Request::post(weir.url("/orders"))
        .header("host", "svc")
        .header("idempotency-key", key)
        .body(body(payload))
        .unwrap();
    let (parts, body) = read_body(client().request(req).await.unwrap()).await;
    (parts.status.as_u16(), parts, body)
}

both_paths!(
    #[tokio::test]
    a_body_too_large_to_hold_is_fingerprinted_as_it_streams
);
async fn a_body_too_large_to_hold_is_fingerprinted_as_it_streams(path: DataPath) {
    let o = orders(0).await;
    let cfg = "[upstreams.svc.retry]\nmax_replay_body_bytes = 1024\n";
    let weir = Arc::new(Weir::single_on(path, &o.up.url(), cfg).await);
    let big = |last: u8| {
        let mut b = vec![b'a'; 64 * 1024];
        b.push(last);
        b
    };
    // The first streams to an upstream that holds it: a repeat meanwhile is 409.
    let held = o.release.acquire_many(1_000_000).await.unwrap();
    let w = weir.clone();
    let first = tokio::spawn(async move { post_bytes(&w, "big", big(b'1')).await });
    for _ in 0..200 {
        if o.up.requests() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(o.up.requests(), 1);
    let (status, parts, _) = post_bytes(&weir, "big", big(b'1')).await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (409, "idempotency_in_flight")
    );
    drop(held);
    let (status, _, b) = first.await.unwrap();
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    // Done: the same body is replayed, another body under the key is 422.
    let (status, again, b) = post_bytes(&weir, "big", big(b'1')).await;
    assert_eq!((status, &b[..]), (201, &b"order 1"[..]));
    assert_eq!(header(&again, "idempotent-replayed"), "true");
    let (status, parts, _) = post_bytes(&weir, "big", big(b'2')).await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (422, "idempotency_key_reused")
    );
    assert_eq!(o.up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    a_key_its_connection_field_names_is_hop_by_hop_and_no_key
);
/// A key field that the request's `Connection` names is for weir's hop
/// only: it is not forwarded, so it keys nothing, on either path.
async fn a_key_its_connection_field_names_is_hop_by_hop_and_no_key(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(path, &o.up.url(), "").await;
    let req = "POST /orders HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k1\r\n\
               Connection: close, Idempotency-Key\r\nContent-Length: 1\r\n\r\nx";
    for n in 1..=2 {
        let out = exchange_raw(weir.addr, req.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 201"), "{out}");
        assert!(out.ends_with(&format!("order {n}")), "{out}");
        assert!(!out.contains("idempotent-replayed"), "{out}");
    }
    assert_eq!(o.up.requests(), 2);
}

both_paths!(
    #[tokio::test]
    a_keyed_write_refused_before_any_attempt_leaves_its_key_free
);
/// A keyed write weir refuses before any attempt (here the concurrency
/// gate, full: 503 `overloaded`; the same path as the rate limit, the
/// breaker and client-side throttling) reached nothing: its record is
/// forgotten, so the key may be tried again — with another body too —
/// and is forwarded, not held as uncertain (422) until its ttl.
async fn a_keyed_write_refused_before_any_attempt_leaves_its_key_free(path: DataPath) {
    let o = orders(0).await;
    let weir = Weir::single_on(
        path,
        &o.up.url(),
        "[upstreams.svc.concurrency]\nmax_in_flight = 1\n",
    )
    .await;
    // One request holds the only slot until the upstream is let go.
    let held = o.release.acquire_many(1_000_000).await.unwrap();
    let url = weir.url("/orders");
    let holder = tokio::spawn(async move {
        let req = Request::post(url)
            .header("host", "svc")
            .body(body("hold"))
            .unwrap();
        client().request(req).await.unwrap().status().as_u16()
    });
    while o.up.requests() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, parts, _) = post(&weir, Some("k-refused"), "pay 10").await;
    assert_eq!(
        (status, header(&parts, "x-weir-error").as_str()),
        (503, "overloaded")
    );
    drop(held);
    assert_eq!(holder.await.unwrap(), 201);
    let (status, parts, _) = post(&weir, Some("k-refused"), "pay 12").await;
    assert_eq!(status, 201, "{parts:?}");
    assert_eq!(o.up.requests(), 2);
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_repeat_sent_the_moment_the_response_ends_is_answered_from_the_record
);
/// The record is complete before the response's last byte reaches the
/// client: a repeat sent on another connection the instant the client has
/// the whole response is replayed, never refused as still in flight.
async fn a_repeat_sent_the_moment_the_response_ends_is_answered_from_the_record(path: DataPath) {
    let o = orders(0).await;
    repeats_at_once(path, &o.up).await;
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_repeat_sent_the_moment_an_empty_response_ends_is_answered_from_the_record
);
/// The same with a response that has no body (`201`, `Content-Length: 0`),
/// which hyper never reads a frame of.
async fn a_repeat_sent_the_moment_an_empty_response_ends_is_answered_from_the_record(
    path: DataPath,
) {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        Response::builder().status(201).body(body("")).unwrap()
    })
    .await;
    repeats_at_once(path, &up).await;
}

/// 1000 keys, each sent on one kept-alive connection, then on a second one
/// as soon as the first's answer is whole: every repeat is replayed.
async fn repeats_at_once(path: DataPath, up: &TestUpstream) {
    repeats_to(path, &up.url(), "", 1000).await;
    assert_eq!(up.requests(), 1000);
}

/// [`repeats_at_once`] to the upstream at `url`, with `extra` TOML for it,
/// `n` keys.
async fn repeats_to(path: DataPath, url: &str, extra: &str, n: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let weir = Weir::single_on(path, url, extra).await;
    let mut first = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let mut again = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let _ = (first.set_nodelay(true), again.set_nodelay(true));
    // One whole response (its length is in its head) off `s`.
    async fn answer(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> String {
        buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(buf).to_ascii_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    return text;
                }
            }
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(buf));
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    let mut buf = Vec::new();
    let mut refused = Vec::new();
    for i in 0..n {
        let req = format!(
            "POST /orders HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k{i}\r\nContent-Length: 6\r\n\r\npay 10"
        );
        first.write_all(req.as_bytes()).await.unwrap();
        let one = answer(&mut first, &mut buf).await;
        assert!(one.starts_with("http/1.1 201"), "{one}");
        again.write_all(req.as_bytes()).await.unwrap();
        let two = answer(&mut again, &mut buf).await;
        if !two.contains("idempotent-replayed: true") {
            refused.push(format!("k{i}: {}", two.lines().next().unwrap_or_default()));
        }
    }
    let count = refused.len();
    refused.truncate(5);
    assert!(
        count == 0,
        "{count} of {n} repeats not replayed, the first: {refused:?}"
    );
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_repeat_sent_the_moment_a_length_is_whole_is_answered_from_the_record
);
/// The same from an h2c upstream that sends a `Content-Length` body and
/// ends its stream 2 ms later, on a frame of its own: the HTTP/1.1 client
/// has the whole response at once, and so does the record.
async fn a_repeat_sent_the_moment_a_length_is_whole_is_answered_from_the_record(path: DataPath) {
    let up = LateEnd::start(201, "created", Duration::from_millis(2)).await;
    repeats_to(path, &up.url, "protocol = \"h2c\"", 300).await;
    assert_eq!(up.served(), 300);
}
