//! Tracing (docs/reference/tracing.md#tracing) against a real OTLP receiver:
//! tests/servers/otlp_receiver.py, the collector's own protobuf messages
//! over grpcio or HTTP/protobuf. What the receiver records is what a
//! tracing backend would show.

#![allow(clippy::unwrap_used)]

mod common;

use common::third_party::{py_server, python, require, Child};
use common::*;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const OTLP_TOOL: &str = "python with grpcio and opentelemetry-proto (python3 -m venv \
     target/ci-venv && target/ci-venv/bin/pip install h2 grpcio opentelemetry-proto, or set \
     WEIR_PYTHON; .ci/run does it)";

/// The client's span: what weir's server span must name as its parent.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

const FAST_BACKOFF: &str = "[upstreams.svc.retry.backoff]\nbase = \"10ms\"\njitter = \"none\"\n";

/// A receiver and the file it writes spans to, one JSON line each.
struct Receiver {
    child: Option<Child>,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    /// `None` (the test skips, or fails under WEIR_REQUIRE_THIRD_PARTY)
    /// without a python that has grpcio and opentelemetry-proto.
    fn start(protocol: &str) -> Option<Receiver> {
        Receiver::start_with(protocol, &[])
    }

    /// Like [`Receiver::start`], with more arguments for the script.
    fn start_with(protocol: &str, extra: &[&str]) -> Option<Receiver> {
        let ok = python().is_some_and(|p| {
            std::process::Command::new(p)
                .args(["-c", "import grpc, opentelemetry.proto"])
                .status()
                .is_ok_and(|s| s.success())
        });
        if !require(OTLP_TOOL, ok) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let mut args = vec!["--out", out.to_str().unwrap(), "--protocol", protocol];
        args.extend_from_slice(extra);
        let child = py_server("otlp_receiver.py", &args)?;
        Some(Receiver {
            child: Some(child),
            out,
            _dir: dir,
        })
    }

    /// `[tracing]` sending to this receiver.
    fn config(&self, protocol: &str, sample: f64) -> String {
        let port = self.child.as_ref().unwrap().port;
        let protocol = if protocol == "http" {
            "http/protobuf"
        } else {
            "grpc"
        };
        format!(
            "[tracing]\nendpoint = \"http://127.0.0.1:{port}\"\nprotocol = \"{protocol}\"\nsample = {sample}\nservice_name = \"weir-test\"\n"
        )
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The spans of `trace`, once there are `n` of them (10 s at most).
    async fn wait_for(&self, trace: &str, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let of: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["trace_id"] == trace)
                .collect();
            if of.len() >= n {
                return of;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "fewer than {n} spans of trace {trace} arrived: {:#?}",
            self.spans()
        );
    }
}

/// An upstream that answers its first request 503 and every later one
/// 200, keeping the `traceparent` each request brought.
async fn fails_once() -> (TestUpstream, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let n = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let tp = req
            .headers()
            .get("traceparent")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        s.lock().unwrap().push(tp);
        let first = n.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            let mut r = Response::new(body(if first { "busy" } else { "ok" }));
            if first {
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            r
        }
    })
    .await;
    (up, seen)
}

fn attr<'v>(span: &'v Value, key: &str) -> &'v Value {
    &span["attributes"][key]
}

/// A GET with the client's `traceparent` to an upstream that fails once:
/// one server span, child of the client's span; two attempt spans under
/// it, the first with its outcome and the retry cause; the upstream told
/// each attempt's span; the trace id in the access log.
async fn a_retried_request(path: DataPath, protocol: &str, h2: bool) {
    a_retried_request_to(path, protocol, h2, "auto").await;
}

/// The same, to an upstream spoken to with `upstream_protocol`.
async fn a_retried_request_to(path: DataPath, protocol: &str, h2: bool, upstream_protocol: &str) {
    let Some(rx) = Receiver::start(protocol) else {
        return;
    };
    let (up, seen) = fails_once().await;
    let toml = format!(
        "{}[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\nprotocol = \"{upstream_protocol}\"\n{FAST_BACKOFF}",
        rx.config(protocol, 0.0),
        up.url()
    );
    let logs = Captured::default();
    let _guard = logs.install();
    let weir = Weir::with_server_on(path, "access_log = \"all\"", &toml).await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let req = Request::get(if h2 {
        "http://svc/charge".to_string()
    } else {
        weir.url("/charge")
    })
    .header("host", "svc")
    .header("traceparent", &traceparent)
    .header("tracestate", "vendor=opaque")
    .body(body(""))
    .unwrap();
    let resp = if h2 {
        h2_request(weir.addr, req).await
    } else {
        client().request(req).await.unwrap()
    };
    let (parts, got) = read_body(resp).await;
    assert_eq!(parts.status, 200);
    assert_eq!(got, "ok");
    assert_eq!(header(&parts, "x-weir-attempts"), "2");

    let spans = rx.wait_for(CLIENT_TRACE, 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let server: Vec<&Value> = spans.iter().filter(|s| s["kind"] == "SERVER").collect();
    assert_eq!(server.len(), 1, "one server span: {spans:#?}");
    let server = server[0];
    assert_eq!(
        server["parent_span_id"], CLIENT_SPAN,
        "weir's span is the client's child"
    );
    assert_eq!(server["service"], "weir-test");
    assert_eq!(server["name"], "GET");
    assert_eq!(attr(server, "http.request.method"), "GET");
    assert_eq!(attr(server, "http.response.status_code"), 200);
    assert_eq!(attr(server, "weir.upstream"), "svc");
    assert_eq!(attr(server, "weir.attempts"), 2);
    assert_eq!(attr(server, "url.path"), "/charge");
    let server_id = server["span_id"].as_str().unwrap();

    let mut attempts: Vec<&Value> = spans.iter().filter(|s| s["kind"] == "CLIENT").collect();
    attempts.sort_by_key(|s| attr(s, "weir.attempt").as_i64());
    assert_eq!(attempts.len(), 2, "two attempt spans: {spans:#?}");
    for a in &attempts {
        assert_eq!(
            a["parent_span_id"], server_id,
            "attempts are the server span's children"
        );
        assert_eq!(attr(a, "weir.hedge"), false);
        assert_eq!(attr(a, "weir.breaker"), "closed");
        assert_eq!(attr(a, "server.address"), "127.0.0.1");
        assert_eq!(attr(a, "weir.endpoint"), up.addr.to_string().as_str());
    }
    let (first, second) = (attempts[0], attempts[1]);
    assert_eq!(attr(first, "weir.attempt"), 1);
    assert_eq!(attr(first, "weir.outcome"), "status_5xx");
    assert_eq!(attr(first, "http.response.status_code"), 503);
    assert_eq!(attr(first, "weir.retry_cause"), "status_503");
    assert_eq!(attr(first, "weir.backoff_ms"), 0.0);
    assert_eq!(first["status"], "ERROR");
    assert_eq!(attr(second, "weir.attempt"), 2);
    assert_eq!(attr(second, "http.request.resend_count"), 1);
    assert_eq!(attr(second, "http.response.status_code"), 200);
    assert!(attr(second, "weir.backoff_ms").as_f64().unwrap() > 0.0);
    assert!(attr(second, "weir.retry_cause").is_null());

    // The upstream saw each attempt's own span as its parent, in the
    // client's trace; tracestate passed on unchanged.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [first, second]
            .map(|a| format!("00-{CLIENT_TRACE}-{}-01", a["span_id"].as_str().unwrap()))
            .to_vec()
    );
    let lines = logs.lines_of("weir::access");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(&format!("trace_id=\"{CLIENT_TRACE}\"")),
        "{}",
        lines[0]
    );
    drop(weir);
}

both_paths!(
    #[tokio::test]
    a_retried_request_is_a_tree_of_spans_over_grpc
);
async fn a_retried_request_is_a_tree_of_spans_over_grpc(path: DataPath) {
    a_retried_request(path, "grpc", false).await;
}

both_paths!(
    #[tokio::test]
    a_retried_request_to_an_h2c_upstream_is_a_tree_of_spans
);
async fn a_retried_request_to_an_h2c_upstream_is_a_tree_of_spans(path: DataPath) {
    a_retried_request_to(path, "grpc", false, "h2c").await;
}

#[tokio::test]
async fn http2_clients_and_http_protobuf_export_give_the_same_tree() {
    a_retried_request(DataPath::General, "http", true).await;
}

/// `[tracing]` is hot-reloadable: off at start, on after a reload, its
/// exporter kept by a reload that changes only `sample`.
#[tokio::test]
async fn tracing_follows_a_reload() {
    let Some(rx) = Receiver::start("grpc") else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let upstream = format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    );
    let weir = Weir::start(&upstream).await;
    let handle = weir.handle.as_ref().unwrap();
    let traced = |trace: &str| {
        let req = Request::get(weir.url("/"))
            .header("host", "svc")
            .header("traceparent", format!("00-{trace}-{CLIENT_SPAN}-01"))
            .body(body(""))
            .unwrap();
        client().request(req)
    };
    let off = "11111111111111111111111111111111";
    assert_eq!(traced(off).await.unwrap().status(), 200);
    let parse = |src: String| {
        let src = format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n{src}");
        weir::config::Config::parse(std::path::Path::new("test.toml"), &src).unwrap()
    };
    handle
        .reload(parse(format!("{}{upstream}", rx.config("grpc", 0.0))))
        .await
        .unwrap();
    let on = "22222222222222222222222222222222";
    assert_eq!(traced(on).await.unwrap().status(), 200);
    assert_eq!(rx.wait_for(on, 2).await.len(), 2);
    handle
        .reload(parse(format!("{}{upstream}", rx.config("grpc", 0.5))))
        .await
        .unwrap();
    let still = "33333333333333333333333333333333";
    assert_eq!(traced(still).await.unwrap().status(), 200);

    assert_eq!(rx.wait_for(still, 2).await.len(), 2);
    assert!(
        rx.spans().iter().all(|s| s["trace_id"] != off),
        "nothing recorded before the reload"
    );
}

/// The count of `name{labels}` in a `/metrics` text.
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

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_collector_going_away_fails_no_request
);
async fn the_collector_going_away_fails_no_request(path: DataPath) {
    let Some(mut rx) = Receiver::start("grpc") else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let toml = format!(
        "{}[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        rx.config("grpc", 1.0),
        up.url()
    );
    let weir = Weir::start_on(path, &toml).await;
    let metrics = weir.handle.as_ref().unwrap().metrics().clone();
    let c = client();
    let send = |n: usize| {
        let c = c.clone();
        let url = weir.url("/");
        async move {
            let mut failed = 0;
            for _ in 0..n {
                let resp = get(&c, &url, "svc").await;
                if resp.status() != 200 {
                    failed += 1;
                }
                let _ = read_body(resp).await;
            }
            failed
        }
    };
    let before = rss_kib();
    assert_eq!(send(50).await, 0);
    // Exported while the collector is there.
    for _ in 0..200 {
        if metric(&metrics.render(), "weir_trace_spans_exported_total") >= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A server span and an attempt span per request.
    assert_eq!(
        metric(&metrics.render(), "weir_trace_spans_exported_total"),
        100
    );
    assert_eq!(rx.spans().len(), 100);

    // The collector goes away mid-run: every request still succeeds.
    drop(rx.child.take());
    assert_eq!(
        send(2000).await,
        0,
        "no request fails for a missing collector"
    );
    let during = rss_kib();
    let dropped = r#"weir_trace_spans_dropped_total{reason="export_failed"}"#;
    let mut lost = 0;
    for _ in 0..200 {
        lost = metric(&metrics.render(), dropped);
        if lost > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        lost > 0,
        "spans the collector never got are counted:\n{}",
        metrics.render()
    );
    assert_eq!(send(50).await, 0);
    let after = rss_kib();
    eprintln!("RSS (KiB) with the collector: {before}; after 2000 requests without it: {during}; at the end: {after}");
    // The queue holds at most 4096 spans: memory does not follow the
    // requests sent while the collector is away.
    assert!(
        during.saturating_sub(before) < 64 * 1024,
        "RSS grew from {before} to {during} KiB"
    );
}

/// A collector slower than the requests: the queue fills, spans past it
/// are dropped and counted, and no request waits for the collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_collector_drops_spans_not_requests() {
    let Some(rx) = Receiver::start_with("grpc", &["--delay", "4"]) else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let toml = format!(
        "{}[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        rx.config("grpc", 1.0) + "max_traces_per_second = 1000000\n",
        up.url()
    );
    let weir = Weir::start(&toml).await;
    let metrics = weir.handle.as_ref().unwrap().metrics().clone();
    // Two spans a request: 6000 spans, more than the queue (4096) and the
    // exports of 512 spans every 4 s can take unless the requests take
    // longer than about 12 s.
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (c, url) = (client(), weir.url("/"));
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for _ in 0..750 {
                let resp = get(&c, &url, "svc").await;
                failed += usize::from(resp.status() != 200);
                let _ = read_body(resp).await;
            }
            failed
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 0);
    }
    let took = started.elapsed();
    let text = metrics.render();
    let full = metric(
        &text,
        r#"weir_trace_spans_dropped_total{reason="queue_full"}"#,
    );
    assert!(full > 0, "spans past the queue are counted:\n{text}");
    eprintln!("3000 requests in {took:?} with a collector taking 4 s an export; {full} spans dropped (queue full)");
}

// Trace context the spec says to ignore, or that asks not to be recorded:
// the request is served as any other, never refused.
both_paths!(
    #[tokio::test]
    unusable_or_unsampled_context_is_never_refused
);
async fn unusable_or_unsampled_context_is_never_refused(path: DataPath) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let tp = req
            .headers()
            .get("traceparent")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        s.lock().unwrap().push(tp);
        async move { Response::new(body("ok")) }
    })
    .await;
    // No collector listens there: nothing waits for one.
    let collector = refused_addr().await;
    for sample in [0.0, 1.0] {
        let toml = format!(
            "[tracing]\nendpoint = \"http://{collector}\"\nsample = {sample}\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        );
        let weir = Weir::start_on(path, &toml).await;
        let good = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}");
        let cases = [
            format!("{good}-00"),                                           // not sampled
            format!("{good}-0"),                                            // too short
            format!("{good}-01-extra"),                                     // version 00, too long
            format!("00-{}-{CLIENT_SPAN}-01", CLIENT_TRACE.to_uppercase()), // not lowercase
            format!("00-{}x-{CLIENT_SPAN}-01", &CLIENT_TRACE[1..]),         // not hex
            format!("ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),                  // version ff
            format!("00-{}-{CLIENT_SPAN}-01", "0".repeat(32)),              // zero trace id
            format!("00-{CLIENT_TRACE}-{}-01", "0".repeat(16)),             // zero parent id
        ];
        for (i, tp) in cases.iter().enumerate() {
            seen.lock().unwrap().clear();
            let req = Request::get(weir.url("/"))
                .header("host", "svc")
                .header("traceparent", tp.as_str())
                .body(body(""))
                .unwrap();
            let resp = client().request(req).await.unwrap();
            assert_eq!(resp.status(), 200, "{tp}");
            let got = seen.lock().unwrap()[0].clone();
            if i == 0 || sample == 0.0 {
                // Not recorded: the context passes on untouched.
                assert_eq!(&got, tp, "sample {sample}");
            } else {
                // A new trace, weir's own: never the malformed one.
                assert_ne!(&got, tp);
                assert!(
                    got.starts_with("00-") && got.ends_with("-01") && got.len() == 55,
                    "{got}"
                );
                assert!(!got.contains(CLIENT_TRACE), "{got}");
            }
        }
    }
}

/// An upstream that answers with the trace-context fields it received:
/// `x-seen-tracestate` (every `tracestate` field, joined by `|`),
/// `x-seen-b3` (every `x-b3-*` and `b3` field name) and
/// `x-seen-traceparent`.
async fn context_echo() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let all = |name: &str| {
            req.headers()
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join("|")
        };
        let b3: Vec<&str> = req
            .headers()
            .keys()
            .map(|n| n.as_str())
            .filter(|n| n.starts_with("x-b3-") || *n == "b3")
            .collect();
        Response::builder()
            .header("x-seen-tracestate", all("tracestate"))
            .header("x-seen-traceparent", all("traceparent"))
            .header("x-seen-b3", b3.join(","))
            .body(body(""))
            .unwrap()
    })
    .await
}

/// 40 members (`v0=…` … `v39=…`) of 20 characters each, then one of 900
/// characters in the middle, in two fields, and then 33 KB more: the
/// bytes of issue 41's probe.
fn oversized_tracestate() -> (String, String) {
    let members: Vec<String> = (0..40)
        .map(|i| format!("v{i:02}={}", "x".repeat(16)))
        .collect();
    let first = format!("{},big={}", members[..10].join(","), "y".repeat(900));
    let second = format!("{},junk={}", members[10..].join(","), "z".repeat(33_000));
    (first, second)
}

// Issue 41, item 7: on a traced request weir is a participant, and tells
// the upstream one context: `tracestate` bounded as W3C Trace Context
// allows (at most 32 members and 512 characters, members over 128
// characters dropped first), and the B3 multi-header fields gone beside
// weir's `traceparent`. Both used to pass unchanged: a 33 KB tracestate,
// and x-b3-traceid beside a traceparent naming another span.
both_paths!(
    #[tokio::test]
    a_traced_request_carries_one_bounded_context
);
async fn a_traced_request_carries_one_bounded_context(path: DataPath) {
    let up = context_echo().await;
    let collector = refused_addr().await;
    let toml = format!(
        "[tracing]\nendpoint = \"http://{collector}\"\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    );
    let weir = Weir::start_on(path, &toml).await;
    let (first, second) = oversized_tracestate();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: svc\r\ntraceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01\r\ntracestate: {first}\r\ntracestate: {second}\r\nx-b3-traceid: {CLIENT_TRACE}\r\nx-b3-spanid: {CLIENT_SPAN}\r\nX-B3-Sampled: 1\r\nx-b3-parentspanid: {CLIENT_SPAN}\r\nx-b3-flags: 1\r\nConnection: close\r\n\r\n"
    );
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{:.300}", out);
    let seen = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_default()
            .to_string()
    };
    check_bounded(&seen("x-seen-tracestate"));
    assert_eq!(seen("x-seen-b3"), "");
    assert!(seen("x-seen-traceparent").contains(CLIENT_TRACE));
}

fn check_bounded(state: &str) {
    assert!(!state.contains('|'), "one field: {state:.100}");
    assert!(state.len() <= 512, "{} characters", state.len());
    let members: Vec<&str> = state.split(',').collect();
    assert!(members.len() <= 32, "{} members", members.len());
    // The long members went first, then members from the end: the first
    // 20-character ones are kept, in order.
    assert_eq!(members[0], format!("v00={}", "x".repeat(16)));
    assert!(members.iter().all(|m| m.len() == 20), "{state}");
    assert_eq!(members.len(), 24, "{state}");
}

/// The same over HTTP/2 (the general path).
#[tokio::test]
async fn over_http2_a_traced_request_carries_one_bounded_context() {
    let up = context_echo().await;
    let collector = refused_addr().await;
    let toml = format!(
        "[tracing]\nendpoint = \"http://{collector}\"\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    );
    let weir = Weir::start_on(DataPath::General, &toml).await;
    let (first, second) = oversized_tracestate();
    let req = Request::get("http://svc/")
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .header("tracestate", first)
        .header("tracestate", second)
        .header("x-b3-traceid", CLIENT_TRACE)
        .header("x-b3-spanid", CLIENT_SPAN)
        .header("x-b3-sampled", "1")
        .body(body(""))
        .unwrap();
    let (p, _) = read_body(h2_request(weir.addr, req).await).await;
    assert_eq!(p.status, StatusCode::OK);
    check_bounded(&header(&p, "x-seen-tracestate"));
    assert_eq!(header(&p, "x-seen-b3"), "");
}

// Issue 41, item 3: attributes from the request are cut at 256 bytes, and
// a method OpenTelemetry does not know is `_OTHER` (the span named `HTTP`),
// its original kept cut. An 8,000-byte method used to be the span's name.
both_paths!(
    #[tokio::test]
    long_paths_are_cut_and_unknown_methods_are_other
);
async fn long_paths_are_cut_and_unknown_methods_are_other(path: DataPath) {
    let Some(rx) = Receiver::start("grpc") else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let toml = format!(
        "{}[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        rx.config("grpc", 1.0),
        up.url()
    );
    let weir = Weir::start_on(path, &toml).await;
    let method = "X".repeat(8000);
    let req = format!(
        "{method} /{} HTTP/1.1\r\nHost: svc\r\ntraceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01\r\nConnection: close\r\n\r\n",
        "p".repeat(50_000)
    );
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{:.200}", out);
    let spans = rx.wait_for(CLIENT_TRACE, 2).await;
    for s in &spans {
        assert_eq!(s["name"], "HTTP", "{:.300}", s.to_string());
        assert_eq!(attr(s, "http.request.method"), "_OTHER");
    }
    let server = spans.iter().find(|s| s["kind"] == "SERVER").unwrap();
    let p = attr(server, "url.path").as_str().unwrap();
    assert_eq!(p.len(), 256);
    assert_eq!(
        attr(server, "http.request.method_original")
            .as_str()
            .unwrap()
            .len(),
        256
    );
}

/// weir on `path` tracing to a collector that is not there, with `extra`
/// in `[tracing]`, in front of [`context_echo`].
async fn traced_weir(path: DataPath, extra: &str) -> (Weir, TestUpstream) {
    let up = context_echo().await;
    let collector = refused_addr().await;
    let toml = format!(
        "[tracing]\nendpoint = \"http://{collector}\"\n{extra}\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    );
    (Weir::start_on(path, &toml).await, up)
}

/// Sends a request with `traceparent` (flags `flags`): whether weir traced
/// it (the upstream got weir's `traceparent`, same trace, another parent).
async fn traced(weir: &Weir, flags: &str) -> bool {
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}");
    let req =
        format!("GET / HTTP/1.1\r\nHost: svc\r\ntraceparent: {tp}\r\nConnection: close\r\n\r\n");
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let seen = out
        .lines()
        .find_map(|l| l.strip_prefix("x-seen-traceparent: "))
        .unwrap_or_default();
    assert!(seen.contains(CLIENT_TRACE), "{seen}");
    seen != tp
}

// Issue 41, item 5: at most `max_traces_per_second` requests are traced,
// whatever callers ask. 50 requests with a sampled `traceparent` used to
// be traced all 50 (with `sample = 0`: two spans each).
both_paths!(
    #[tokio::test]
    callers_cannot_have_more_than_the_cap_traced
);
async fn callers_cannot_have_more_than_the_cap_traced(path: DataPath) {
    let (weir, _up) = traced_weir(path, "max_traces_per_second = 5").await;
    let t0 = tokio::time::Instant::now();
    let mut n = 0;
    for _ in 0..50 {
        n += usize::from(traced(&weir, "01").await);
    }
    // The bucket starts with 5 and gains 5 a second.
    let most = 5 + (5.0 * t0.elapsed().as_secs_f64()).ceil() as usize;
    assert!((5..=most).contains(&n), "{n} traced, at most {most}");
}

// Issue 41, item 5: `trust_caller_sampling = false` leaves the decision to
// `sample`: a caller's sampled flag no longer forces a trace, nor its 0
// prevents one; a picked request still joins the caller's trace.
both_paths!(
    #[tokio::test]
    an_untrusted_callers_flag_does_not_decide
);
async fn an_untrusted_callers_flag_does_not_decide(path: DataPath) {
    let (weir, _up) = traced_weir(path, "sample = 0\ntrust_caller_sampling = false").await;
    assert!(
        !traced(&weir, "01").await,
        "sampled by the caller, not by weir"
    );
    let (weir, _up) = traced_weir(path, "sample = 1\ntrust_caller_sampling = false").await;
    assert!(
        traced(&weir, "00").await,
        "picked by sample whatever the flag"
    );
    // Trusted (the default), the flag decides.
    let (weir, _up) = traced_weir(path, "sample = 0").await;
    assert!(traced(&weir, "01").await);
    assert!(!traced(&weir, "00").await);
}
