//! Spans hold bounded memory (docs/reference/tracing.md#what-is-dropped-when),
//! issue 41, item 3: with a collector that accepts and never answers,
//! sampled requests with a 60,000-byte path used to keep every path whole
//! in the span queue (4096 spans: RSS up by over 100 MB, and still up
//! after the queue drained). Attributes are now cut at 256 bytes and the
//! queue is bounded in bytes as well as spans. This test is alone in its
//! binary: it reads the process's resident set, which tests running beside
//! it would move.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use hyper::Request;
use std::time::Duration;

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// This process's resident set, in KiB (weir runs in it).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_flood_with_long_paths_holds_bounded_memory() {
    for path in [DataPath::Fast, DataPath::General] {
        flood(path).await;
    }
}

async fn flood(path: DataPath) {
    // A collector that accepts and never answers: each export hangs until
    // its 5 s limit, and the queue fills.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = l.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let up = TestUpstream::text("ok").await;
    let toml = format!(
        "[tracing]\nendpoint = \"http://{collector}\"\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    );
    let weir = Weir::start_on(path, &toml).await;
    let metrics = weir.handle.as_ref().unwrap().metrics().clone();
    let long = format!("/{}", "p".repeat(60_000));
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let c = client();
    let send = |n: usize| {
        let (c, url) = (c.clone(), weir.url(&long));
        async move {
            for _ in 0..n {
                let req = Request::get(&url)
                    .header("host", "svc")
                    .header("traceparent", traceparent)
                    .body(body(""))
                    .unwrap();
                let resp = c.request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let _ = read_body(resp).await;
            }
        }
    };
    send(100).await;
    let before = rss_kib();
    send(2000).await;
    let during = rss_kib();
    // The collector goes: exports fail at once and the queue drains.
    silent.abort();
    let failed = r#"weir_trace_spans_dropped_total{reason="export_failed"}"#;
    let full = r#"weir_trace_spans_dropped_total{reason="queue_full"}"#;
    for _ in 0..400 {
        let text = metrics.render();
        if metric(&text, failed) + metric(&text, full) >= 2 * 2100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = metrics.render();
    let after = rss_kib();
    eprintln!(
        "{path:?}: RSS (KiB) after 100 requests {before}, after 2,100 {during}, drained {after}; spans dropped: queue full {}, export failed {}",
        metric(&text, full),
        metric(&text, failed)
    );
    assert!(
        during.saturating_sub(before) < 16 * 1024,
        "{path:?}: RSS grew from {before} to {during} KiB"
    );
    assert!(
        after.saturating_sub(before) < 16 * 1024,
        "{path:?}: RSS {after} KiB after the queue drained, from {before}"
    );
}
