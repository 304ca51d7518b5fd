//! Upstreams named by DNS (`url = "http://localhost:PORT"`) take the fast
//! path once their name has resolved: resolution runs in the background and
//! is counted; a name that does not resolve is counted as an error and its
//! requests still get an answer (weir's `connect_failed`, with the
//! resolver's reason); one that resolves later is served once it does.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::Response;
use std::time::Duration;
use weir::proxy::fast::head::{plan, Parse};
use weir::proxy::ListenerRole;

/// `weir_dns_resolutions_total{upstream="svc"}` by result, once `want`
/// says so (up to 5 s).
async fn resolutions(weir: &Weir, want: impl Fn(f64, f64) -> bool) -> (f64, f64) {
    for _ in 0..100 {
        let snap = weir.handle.as_ref().unwrap().snapshot();
        let v = snap
            .metrics
            .values("weir_dns_resolutions_total", "svc", "result");
        let (ok, err) = (
            v.get("ok").copied().unwrap_or(0.0),
            v.get("error").copied().unwrap_or(0.0),
        );
        if want(ok, err) {
            return (ok, err);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no resolution was counted");
}

#[tokio::test]
async fn a_named_upstream_takes_the_fast_path_once_resolved() {
    let up = TestUpstream::text("ok").await;
    let url = format!("http://localhost:{}", up.addr.port());
    let weir = Weir::single(&url, "resolve_every = \"100ms\"").await;
    resolutions(&weir, |ok, _| ok >= 1.0).await;
    for _ in 0..10 {
        let out = exchange_raw(
            weir.addr,
            b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    assert_eq!(up.requests(), 10);
    // The fast path takes the request (it falls back to the general path for
    // an upstream it has no address for).
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let mut out = Vec::new();
    let planned = plan(
        &snap,
        &ListenerRole::Shared,
        b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n",
        &mut out,
    );
    assert!(matches!(planned, Parse::Done(_)), "{planned:?}");
    assert!(String::from_utf8_lossy(&out).starts_with("GET / HTTP/1.1\r\n"));
    // Resolved again on its interval.
    resolutions(&weir, |ok, _| ok >= 3.0).await;
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let addrs = snap.metrics.values("weir_dns_addresses", "svc", "upstream");
    assert_eq!(addrs.get("svc"), Some(&1.0), "{addrs:?}");
}

#[tokio::test]
async fn a_name_that_does_not_resolve_is_counted_and_still_answered() {
    let weir = Weir::single("http://weir-test.invalid:9", "resolve_every = \"100ms\"").await;
    let (ok, err) = resolutions(&weir, |_, err| err >= 1.0).await;
    assert_eq!(ok, 0.0);
    assert!(err >= 1.0);
    // No address: the general path serves it.
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let planned = plan(
        &snap,
        &ListenerRole::Shared,
        b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n",
        &mut Vec::new(),
    );
    assert!(matches!(planned, Parse::Fallback(_)), "{planned:?}");
    let out = exchange_raw(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(out.contains("x-weir-error: connect_failed"), "{out}");
}

/// A name that does not resolve yet: an attempt fails at once with the
/// resolver's reason (`connect_failed`), as long as no resolution has
/// answered; once the name resolves (a line added to `/etc/hosts`), it is
/// served within a second, without a reload: a name never resolved is
/// asked again every second, and an attempt waits for the resolver rather
/// than resolving for itself.
#[tokio::test]
async fn a_name_that_resolves_late_is_served_once_it_does() {
    let name = format!("weir-late-{}.test", std::process::id());
    let Some(hosts) = HostsLines::new(&name) else {
        eprintln!("SKIPPED: /etc/hosts is not writable here");
        return;
    };
    let up = TestUpstream::start(|_| async { Response::new(body("ok")) }).await;
    let port = up.url().rsplit(':').next().unwrap().to_string();
    let url = format!("http://{name}:{port}");
    // Resolved rarely: only the first-resolution retry can bring it in time.
    let weir = Weir::single(&url, "resolve_every = \"60s\"").await;
    resolutions(&weir, |_, err| err >= 1.0).await;
    let out = exchange_raw(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(out.contains("has not resolved"), "{out}");
    hosts.set(&["127.0.0.1"]).unwrap();
    resolutions(&weir, |ok, _| ok >= 1.0).await;
    let out = exchange_raw(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(up.requests(), 1);
}
