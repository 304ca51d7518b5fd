//! weir's own HTTP/2 upstream pool (docs/reference/endpoints.md#http2-connections),
//! against a real HTTP/2 server with a stream limit: one connection for a
//! burst to a cold endpoint, more connections once the peer's
//! SETTINGS_MAX_CONCURRENT_STREAMS is full, and a connection the server
//! closes replaced without a failed request.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// An h2c server allowing `max_streams` concurrent streams per connection,
/// answering each request after `delay`, and closing each connection
/// gracefully (GOAWAY) after `per_conn` requests when that is not 0.
/// Returns its URL, its accepted connections and the most streams it ever
/// saw open at once on one connection.
async fn h2_server(
    max_streams: u32,
    delay: Duration,
    per_conn: usize,
) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let conns = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (c, p) = (conns.clone(), peak.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_nodelay(true);
            let p = p.clone();
            tokio::spawn(async move {
                let open = Arc::new(AtomicUsize::new(0));
                let served = Arc::new(AtomicUsize::new(0));
                let last = Arc::new(tokio::sync::Notify::new());
                let (o, s, l) = (open.clone(), served.clone(), last.clone());
                let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let (o, p, s, l) = (o.clone(), p.clone(), s.clone(), l.clone());
                    async move {
                        let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                        p.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        o.fetch_sub(1, Ordering::SeqCst);
                        if per_conn > 0 && s.fetch_add(1, Ordering::SeqCst) + 1 == per_conn {
                            l.notify_one();
                        }
                        Ok::<_, Infallible>(Response::new(body("ok")))
                    }
                });
                let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                b.timer(TokioTimer::new())
                    .max_concurrent_streams(max_streams);
                let conn = b.serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = last.notified(), if per_conn > 0 => {}
                }
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            });
        }
    });
    (url, conns, peak)
}

async fn burst(weir: &Weir, n: usize) -> Vec<u16> {
    let c = client();
    let mut calls = Vec::new();
    for i in 0..n {
        let (c, url) = (c.clone(), weir.url(&format!("/r{i}")));
        calls.push(tokio::spawn(async move {
            get(&c, &url, "svc").await.status().as_u16()
        }));
    }
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_a_cold_endpoint_makes_one_connection() {
    let (url, conns, peak) = h2_server(100, Duration::from_millis(100), 0).await;
    let weir = Weir::single(&url, "protocol = \"h2c\"").await;
    let statuses = burst(&weir, 40).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(conns.load(Ordering::SeqCst), 1, "one dial for the burst");
    assert!(
        peak.load(Ordering::SeqCst) > 1,
        "the streams were multiplexed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_connection_gets_a_second_one_beside_it() {
    let (url, conns, peak) = h2_server(8, Duration::from_millis(300), 0).await;
    let weir = Weir::single(&url, "protocol = \"h2c\"").await;
    // One request first, so the pool has read the peer's SETTINGS.
    assert_eq!(burst(&weir, 1).await, vec![200]);
    let statuses = burst(&weir, 32).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // 32 streams at 8 a connection: four connections, not 32 streams
    // queued behind one connection's limit.
    let n = conns.load(Ordering::SeqCst);
    assert!((4..=6).contains(&n), "{n} connections");
    assert!(peak.load(Ordering::SeqCst) <= 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closes_are_replaced_without_a_failure() {
    // Each connection serves 3 requests, then GOAWAY.
    let (url, conns, _) = h2_server(100, Duration::from_millis(1), 3).await;
    let weir = Weir::single(&url, "protocol = \"h2c\"").await;
    let c = client();
    for i in 0..12 {
        let resp = get(&c, &weir.url(&format!("/s{i}")), "svc").await;
        let (parts, _) = read_body(resp).await;
        assert_eq!(parts.status, 200, "request {i}");
        assert_eq!(header(&parts, "x-weir-attempts"), "1", "request {i}");
    }
    let n = conns.load(Ordering::SeqCst);
    assert!(
        (4..=6).contains(&n),
        "{n} connections for 12 requests at 3 each"
    );
}
