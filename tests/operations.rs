//! Operating weir: metrics values, the admin endpoints, reload under load,
//! the file watch, and the loopback guard.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

const NO_WATCH: Options = Options {
    watch: false,
    sighup: false,
    workers: 0,
};

async fn start(dir: &Path, toml: &str, opts: Options) -> (Runtime, PathBuf) {
    let path = dir.join("weir.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    (Runtime::start(config, opts).await.unwrap(), path)
}

async fn admin(rt: &Runtime, method: &str, path: &str) -> (u16, String) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", rt.admin_addr))
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    (
        parts.status.as_u16(),
        String::from_utf8_lossy(&b).into_owned(),
    )
}

async fn through(rt: &Runtime, host: &str, path: &str) -> (u16, String) {
    let url = format!("http://{}{path}", rt.proxy.listen_addr());
    let (parts, _) = read_body(get(&client(), &url, host).await).await;
    (parts.status.as_u16(), header(&parts, "x-weir-error"))
}

/// Parses the Prometheus text format strictly: every line is a comment
/// (`# HELP`/`# TYPE`) or `name{label="value",…} number`. Returns the samples
/// keyed by `name{labels in order}`.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            assert!(
                ["HELP weir_", "TYPE weir_", "HELP process_", "TYPE process_"]
                    .iter()
                    .any(|p| rest.starts_with(p)),
                "bad comment: {line}"
            );
            if let Some(t) = rest.strip_prefix("TYPE ") {
                let kind = t.split(' ').nth(1).unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && (name.starts_with("weir_") || name.starts_with("process_")),
            "bad metric name: {line}"
        );
        let mut rest = &line[name_end..];
        let mut labels = String::new();
        if let Some(r) = rest.strip_prefix('{') {
            let close = r
                .rfind('}')
                .unwrap_or_else(|| panic!("unclosed labels: {line}"));
            let inner = &r[..close];
            // label="value" pairs; values may hold escaped quotes.
            let mut chars = inner.chars().peekable();
            let mut pairs = Vec::new();
            while chars.peek().is_some() {
                let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "bad label in {line}"
                );
                assert_eq!(chars.next(), Some('"'), "unquoted label value in {line}");
                let mut val = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => val.push(chars.next().unwrap()),
                        Some('"') => break,
                        Some(c) => val.push(c),
                        None => panic!("unterminated value in {line}"),
                    }
                }
                pairs.push(format!("{key}={val}"));
                match chars.next() {
                    Some(',') | None => {}
                    Some(c) => panic!("unexpected {c:?} in {line}"),
                }
            }
            pairs.sort();
            labels = pairs.join(",");
            rest = &r[close + 1..];
        }
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before value: {line}"));
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        out.insert(format!("{name}{{{labels}}}"), v);
    }
    out
}

/// The value of `name{k=v,…}` (labels in any order).
fn val(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    let (name, labels) = key.split_once('{').unwrap();
    let mut pairs: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|p| !p.is_empty())
        .collect();
    pairs.sort();
    let norm = format!("{name}{{{}}}", pairs.join(","));
    *m.get(&norm).unwrap_or_else(|| panic!("no series {key}"))
}

#[tokio::test(start_paused = true)]
async fn metrics_count_exactly_what_happened() {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        if req.uri().path().starts_with("/fail") {
            Response::builder().status(503).body(body("no")).unwrap()
        } else {
            Response::new(body("yes"))
        }
    })
    .await;
    let u = up.url();
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.flaky]
url = "{u}"
hosts = ["flaky"]
[upstreams.flaky.retry.backoff]
base = "1ms"
jitter = "none"
[upstreams.flaky.retry.budget]
ratio = 0.5
min_per_sec = 0
[upstreams.flaky.breaker]
consecutive_failures = 50
failing_for = "0s"
window = 50
min_samples = 50
failure_rate = 0.8

[upstreams.fragile]
url = "{u}"
hosts = ["fragile"]
[upstreams.fragile.retry]
max_attempts = 1
[upstreams.fragile.breaker]
consecutive_failures = 2
failing_for = "0s"
open = "1m"

[upstreams.limited]
url = "{u}"
hosts = ["limited"]
[upstreams.limited.rate_limit]
rps = 1.0
burst = 2
"#
    );
    let (rt, _) = start(dir.path(), &toml, NO_WATCH).await;

    for _ in 0..4 {
        assert_eq!(through(&rt, "flaky", "/ok").await.0, 200);
    }
    // Budget: 4 × 0.5 deposited. This request deposits 0.5, retries twice
    // (2.5 → 0.5) and stops on attempts.
    assert_eq!(through(&rt, "flaky", "/fail").await.0, 503);
    // Deposits 0.5 (1.0), retries once (0.0), then the budget stops it.
    assert_eq!(through(&rt, "flaky", "/fail").await.0, 503);
    // Two failures trip `fragile`; the third request is refused.
    assert_eq!(through(&rt, "fragile", "/fail").await.0, 503);
    assert_eq!(through(&rt, "fragile", "/fail").await.0, 503);
    assert_eq!(
        through(&rt, "fragile", "/ok").await,
        (503, "circuit_open".into())
    );
    // A burst of 2 then a 429.
    assert_eq!(through(&rt, "limited", "/ok").await.0, 200);
    assert_eq!(through(&rt, "limited", "/ok").await.0, 200);
    assert_eq!(
        through(&rt, "limited", "/ok").await,
        (429, "rate_limited".into())
    );
    assert_eq!(through(&rt, "nobody", "/").await, (404, "no_route".into()));

    let (status, text) = admin(&rt, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let m = parse_metrics(&text);
    let expect = [
        ("weir_requests_total{upstream=flaky,code=200,error=}", 4.0),
        ("weir_requests_total{upstream=flaky,code=503,error=}", 2.0),
        (
            "weir_upstream_attempts_total{upstream=flaky,result=ok}",
            4.0,
        ),
        (
            "weir_upstream_attempts_total{upstream=flaky,result=status_5xx}",
            5.0,
        ),
        ("weir_retries_total{upstream=flaky,cause=status_503}", 3.0),
        (
            "weir_retry_stops_total{upstream=flaky,reason=attempts}",
            1.0,
        ),
        ("weir_retry_stops_total{upstream=flaky,reason=budget}", 1.0),
        ("weir_retry_stops_total{upstream=flaky,reason=unsafe}", 0.0),
        ("weir_retry_budget_tokens{upstream=flaky}", 0.0),
        ("weir_breaker_state{upstream=flaky,state=closed}", 1.0),
        ("weir_requests_total{upstream=fragile,code=503,error=}", 2.0),
        (
            "weir_requests_total{upstream=fragile,code=503,error=circuit_open}",
            1.0,
        ),
        (
            "weir_upstream_attempts_total{upstream=fragile,result=status_5xx}",
            2.0,
        ),
        (
            "weir_retry_stops_total{upstream=fragile,reason=attempts}",
            2.0,
        ),
        (
            "weir_breaker_transitions_total{upstream=fragile,to=open}",
            1.0,
        ),
        ("weir_breaker_state{upstream=fragile,state=open}", 1.0),
        ("weir_breaker_state{upstream=fragile,state=closed}", 0.0),
        ("weir_requests_total{upstream=limited,code=200,error=}", 2.0),
        (
            "weir_requests_total{upstream=limited,code=429,error=rate_limited}",
            1.0,
        ),
        ("weir_rate_limited_total{upstream=limited}", 1.0),
        ("weir_in_flight_requests{upstream=flaky}", 0.0),
        (
            "weir_requests_total{upstream=none,code=404,error=no_route}",
            1.0,
        ),
        // Created at zero before the first retry, for every cause retry_on can
        // produce (not `refused_stream`: an HTTP/1.1 upstream, issue 58).
        ("weir_retries_total{upstream=limited,cause=status_503}", 0.0),
        (
            "weir_retries_total{upstream=fragile,cause=connect_failure}",
            0.0,
        ),
        ("weir_config_reloads_total{result=ok}", 1.0),
        ("weir_config_reloads_total{result=error}", 0.0),
        ("weir_config_last_reload_success{}", 1.0),
        ("weir_request_duration_seconds_count{upstream=flaky}", 6.0),
        // weir's refusals (one circuit_open, one rate_limited) take no
        // place in the latency histogram: 2 of fragile's 3, 2 of limited's 3.
        ("weir_request_duration_seconds_count{upstream=fragile}", 2.0),
        ("weir_request_duration_seconds_count{upstream=limited}", 2.0),
        (
            "weir_upstream_attempt_duration_seconds_count{upstream=flaky}",
            9.0,
        ),
    ];
    for (k, v) in expect {
        assert_eq!(val(&m, k), v, "{k}");
    }
    // After every kind of refusal above, `code` is an HTTP status in every
    // series; weir's reason is in `error`.
    for key in m.keys().filter(|k| k.starts_with("weir_requests_total{")) {
        let code = key
            .split("code=")
            .nth(1)
            .and_then(|r| r.split([',', '}']).next());
        assert!(code.is_some_and(|c| c.parse::<u16>().is_ok()), "{key}");
    }
    let build = format!("weir_build_info{{version={}}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(val(&m, &build), 1.0);
    // The process collector (Linux /proc).
    for k in [
        "process_resident_memory_bytes{}",
        "process_open_fds{}",
        "process_start_time_seconds{}",
        "process_max_fds{}",
    ] {
        assert!(val(&m, k) > 0.0, "{k}");
    }
    assert!(m.contains_key("process_cpu_seconds_total{}"));
    // Nothing from the requests leaked into label values.
    assert!(!text.contains("nobody"));
    rt.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn admin_endpoints_and_the_loopback_guard() {
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.a]\nurl = \"{}\"\nhosts = [\"a\"]\n",
        up.url()
    );
    let (rt, path) = start(dir.path(), &toml, NO_WATCH).await;
    assert_eq!(admin(&rt, "GET", "/healthz").await.0, 200);
    assert_eq!(admin(&rt, "GET", "/readyz").await.0, 200);
    let (s, cfg) = admin(&rt, "GET", "/config").await;
    assert_eq!(s, 200);
    assert!(
        cfg.contains("[upstreams.a]") && cfg.contains("max_attempts = 3"),
        "{cfg}"
    );
    assert_eq!(admin(&rt, "GET", "/reload").await.0, 405);
    assert_eq!(admin(&rt, "GET", "/nope").await.0, 404);

    // An invalid file: 422 naming the place, counted, the running config stays.
    std::fs::write(&path, format!("{toml}timeout = 5\n")).unwrap();
    let (s, msg) = admin(&rt, "POST", "/reload").await;
    assert_eq!(s, 422);
    assert!(msg.contains("weir.toml:7:11"), "{msg}");
    assert_eq!(through(&rt, "a", "/").await.0, 200);
    let m = parse_metrics(&admin(&rt, "GET", "/metrics").await.1);
    assert_eq!(val(&m, "weir_config_reloads_total{result=error}"), 1.0);
    assert_eq!(val(&m, "weir_config_last_reload_success{}"), 0.0);

    // Issue 41, item 4: a rejected reload quoting a URL with a password
    // shows it as `***` in the 422 body and in the log line, as /config
    // does; it used to echo it whole.
    let logs = Captured::global();
    let secret = "[state]\nbackend = \"redis\"\nurl = \"redis://weir:hunter2@cache:6379/x\"\n";
    std::fs::write(&path, format!("{toml}{secret}")).unwrap();
    let (s, msg) = admin(&rt, "POST", "/reload").await;
    assert_eq!(s, 422);
    assert!(
        msg.contains("redis://weir:***@cache:6379/x") && !msg.contains("hunter2"),
        "{msg}"
    );
    let rejected = logs.lines_of("config reload rejected");
    assert!(
        rejected.iter().any(|l| l.contains("weir:***@cache")),
        "{rejected:?}"
    );
    assert!(
        rejected.iter().all(|l| !l.contains("hunter2")),
        "{rejected:?}"
    );
    std::fs::write(&path, &toml).unwrap();

    // The guard itself, with a peer that is not loopback: one rule for
    // every page but /metrics, /healthz and /readyz. Issue 53, item 7: the
    // status page (`/`, `/status`, `/status.json`) served a remote peer
    // that sent `Host: localhost`, every upstream's name and target in it;
    // the peer's address decides, never its Host.
    let outsider: std::net::SocketAddr = "10.1.2.3:40000".parse().unwrap();
    let mapped: std::net::SocketAddr = "[::ffff:10.1.2.3]:40000".parse().unwrap();
    let insider: std::net::SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let loopback_only = [
        ("GET", "/config"),
        ("POST", "/reload"),
        ("GET", "/"),
        ("GET", "/status"),
        ("GET", "/status.json"),
    ];
    for (method, path) in loopback_only {
        let req = |host: Option<&str>| {
            let mut r = Request::builder().method(method).uri(path);
            if let Some(h) = host {
                r = r.header("host", h);
            }
            r.body(()).unwrap()
        };
        for host in [None, Some("localhost"), Some("127.0.0.1:15000")] {
            for peer in [outsider, mapped] {
                let r = weir::admin::route(&rt.reloader, peer, req(host)).await;
                assert_eq!(
                    r.status(),
                    403,
                    "{method} {path} (Host {host:?}) answered the non-loopback peer {peer}"
                );
                let body = r.into_body().collect().await.unwrap().to_bytes();
                let body = String::from_utf8_lossy(&body);
                assert!(!body.contains(&up.url()), "{path}: {body}");
            }
            let r = weir::admin::route(&rt.reloader, insider, req(host)).await;
            assert_ne!(r.status(), 403, "{method} {path} (Host {host:?})");
        }
    }
    // What the outsider was refused: the insider's status names the target.
    let req = Request::get("/status.json")
        .header("host", "localhost")
        .body(())
        .unwrap();
    let r = weir::admin::route(&rt.reloader, insider, req).await;
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains(&up.url()));
    for path in ["/metrics", "/healthz", "/readyz"] {
        let req = Request::get(path)
            .header("host", "weir.example")
            .body(())
            .unwrap();
        let r = weir::admin::route(&rt.reloader, outsider, req).await;
        assert_eq!(r.status(), 200, "{path} is open to any peer");
    }

    // Regression (DNS rebinding): a loopback peer naming a foreign host, or
    // a cross-origin page, is refused; loopback names are served.
    for (method, path) in [("GET", "/config"), ("POST", "/reload")] {
        let with = |name: &'static str, value: &'static str| {
            Request::builder()
                .method(method)
                .uri(path)
                .header(name, value)
                .body(())
                .unwrap()
        };
        for (name, value) in [
            ("host", "evil.example"),
            ("host", "evil.example:15000"),
            ("origin", "http://evil.example"),
            ("origin", "null"),
        ] {
            let r = weir::admin::route(&rt.reloader, insider, with(name, value)).await;
            assert_eq!(r.status(), 403, "{method} {path} with {name}: {value}");
        }
        for (name, value) in [
            ("host", "localhost:15000"),
            ("host", "127.0.0.1:15000"),
            ("host", "[::1]:15000"),
            ("origin", "http://localhost:15000"),
        ] {
            let r = weir::admin::route(&rt.reloader, insider, with(name, value)).await;
            assert_ne!(r.status(), 403, "{method} {path} with {name}: {value}");
        }
    }

    // Draining: /readyz turns 503.
    rt.proxy.stop_accepting();
    assert_eq!(admin(&rt, "GET", "/readyz").await.0, 503);
    rt.shutdown(Duration::from_secs(1)).await;
}

fn reload_config(ok_up: &str, bad_up: &str, variant: usize) -> String {
    let base = format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.steady]
url = "{ok_up}"
hosts = ["steady"]

[upstreams.broken]
url = "{bad_up}"
hosts = ["broken"]
[upstreams.broken.retry]
max_attempts = 1
[upstreams.broken.breaker]
consecutive_failures = 3
failing_for = "0s"
open = "5m"
"#
    );
    match variant {
        0 => base,
        1 => format!(
            "{base}\n[upstreams.steady.breaker]\nconsecutive_failures = 9\nfailing_for = \"0s\"\n\n[upstreams.extra]\nurl = \"{ok_up}\"\nlisten = \"127.0.0.1:0\"\n"
        ),
        _ => format!("{base}\n[upstreams.steady.retry]\nmax_attempts = \"three\"\n"),
    }
}

#[tokio::test]
async fn reload_under_load_drops_no_request() {
    let ok = TestUpstream::text("ok").await;
    let bad = TestUpstream::start(|_r| async move {
        Response::builder().status(503).body(body("down")).unwrap()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (rt, path) = start(
        dir.path(),
        &reload_config(&ok.url(), &bad.url(), 0),
        NO_WATCH,
    )
    .await;
    let rt = Arc::new(rt);

    // Open the breaker of an upstream present in both configs.
    for _ in 0..3 {
        assert_eq!(through(&rt, "broken", "/").await.0, 503);
    }
    assert_eq!(through(&rt, "broken", "/").await.1, "circuit_open");

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (rt, stop, sent, failed) = (rt.clone(), stop.clone(), sent.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                let url = format!("http://{}/", rt.proxy.listen_addr());
                let req = Request::get(url)
                    .header("host", "steady")
                    .body(body(""))
                    .unwrap();
                let ok = match c.request(req).await {
                    Ok(resp) => resp.status() == 200 && read_body(resp).await.1 == "ok",
                    Err(_) => false,
                };
                sent.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut extra_seen = false;
    for i in 0..25 {
        let variant = if i % 5 == 4 { 2 } else { i % 2 };
        std::fs::write(&path, reload_config(&ok.url(), &bad.url(), variant)).unwrap();
        let (status, msg) = admin(&rt, "POST", "/reload").await;
        if variant == 2 {
            assert_eq!(status, 422, "{msg}");
        } else {
            assert_eq!(status, 200, "{msg}");
        }
        if variant == 1 {
            // The extra upstream's dedicated listener is up and serving.
            let addr = rt.proxy.upstream_addrs()["extra"];
            let (parts, b) = read_body(get(&client(), &format!("http://{addr}/"), "x").await).await;
            assert_eq!((parts.status.as_u16(), &b[..]), (200, &b"ok"[..]));
            extra_seen = true;
        } else if variant == 0 {
            assert!(!rt.proxy.upstream_addrs().contains_key("extra"));
        }
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert!(extra_seen);
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent > 100, "only {sent} requests were sent");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads (of {sent})"
    );
    let m = parse_metrics(&admin(&rt, "GET", "/metrics").await.1);
    assert_eq!(val(&m, "weir_config_reloads_total{result=error}"), 5.0);
    assert_eq!(val(&m, "weir_config_reloads_total{result=ok}"), 21.0);
    assert_eq!(
        through(&rt, "broken", "/").await.1,
        "circuit_open",
        "the breaker was reset by a reload"
    );
    rt.shutdown(Duration::from_secs(1)).await;
}

#[cfg(unix)]
#[tokio::test]
async fn the_file_watch_sees_a_configmap_symlink_swap() {
    use std::os::unix::fs::symlink;
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write_version = |name: &str, host: &str| {
        let v = d.join(name);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(
            v.join("weir.toml"),
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.a]\nurl = \"{}\"\nhosts = [\"{host}\"]\n",
                up.url()
            ),
        )
        .unwrap();
    };
    // The layout the kubelet makes: weir.toml → ..data/weir.toml, ..data → ..<timestamp>.
    write_version("..2026_11_29_01", "old-host");
    symlink("..2026_11_29_01", d.join("..data")).unwrap();
    symlink("..data/weir.toml", d.join("weir.toml")).unwrap();
    let path = d.join("weir.toml");
    let config = Config::load(&path).unwrap();
    let rt = Runtime::start(
        config,
        Options {
            watch: true,
            sighup: false,
            workers: 0,
        },
    )
    .await
    .unwrap();
    assert_eq!(through(&rt, "old-host", "/").await.0, 200);

    // The swap: a new directory, a temporary link, renamed over ..data.
    write_version("..2026_11_29_02", "new-host");
    symlink("..2026_11_29_02", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..2026_11_29_01")).unwrap();

    let mut seen = false;
    for _ in 0..50 {
        if through(&rt, "new-host", "/").await.0 == 200 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the swap was not picked up within 5 s");
    assert_eq!(through(&rt, "old-host", "/").await.0, 404);
    let m = parse_metrics(&admin(&rt, "GET", "/metrics").await.1);
    assert_eq!(
        val(&m, "weir_config_reloads_total{result=ok}"),
        2.0,
        "debounce should make one reload of one swap"
    );
    rt.shutdown(Duration::from_secs(1)).await;
}

/// `weir_upstream_bytes_total`, `weir_upstream_connections_open` and
/// `weir_client_connections_open`, on both paths: the fast path (an
/// HTTP/1.1 upstream) and the general one (an HTTP/2 upstream with
/// `protocol = "grpc"`, which the fast path leaves to it).
#[tokio::test]
async fn connections_and_bytes_are_counted_on_both_paths() {
    let up = TestUpstream::start(|_req: Request<hyper::body::Incoming>| async move {
        Response::new(body(vec![b'x'; 10_000]))
    })
    .await;
    let u = up.url();
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
         [upstreams.fast]\nurl = \"{u}\"\nhosts = [\"fast\"]\n\
         [upstreams.general]\nurl = \"{u}\"\nhosts = [\"general\"]\nprotocol = \"grpc\"\n"
    );
    let (rt, _) = start(dir.path(), &toml, NO_WATCH).await;
    for host in ["fast", "general"] {
        for _ in 0..3 {
            assert_eq!(through(&rt, host, "/").await.0, 200);
        }
    }
    // A client connection that stays open while the scrape is made.
    let held = tokio::net::TcpStream::connect(rt.proxy.listen_addr())
        .await
        .unwrap();
    let mut m = BTreeMap::new();
    for _ in 0..100 {
        m = parse_metrics(&admin(&rt, "GET", "/metrics").await.1);
        if val(&m, "weir_client_connections_open{}") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(val(&m, "weir_client_connections_open{}") >= 1.0);
    for host in ["fast", "general"] {
        let bytes = |d: &str| {
            val(
                &m,
                &format!("weir_upstream_bytes_total{{upstream={host},direction={d}}}"),
            )
        };
        // Three responses of 10,000 body bytes each came back; three
        // requests went out.
        assert!(
            bytes("received") >= 30_000.0,
            "{host}: {}",
            bytes("received")
        );
        assert!(bytes("sent") >= 3.0 * 16.0, "{host}: {}", bytes("sent"));
        let open = val(
            &m,
            &format!("weir_upstream_connections_open{{upstream={host}}}"),
        );
        assert!(
            (1.0..=3.0).contains(&open),
            "{host}: {open} pooled connections"
        );
    }
    drop(held);
}

/// Issue 46, item 5: `/metrics` has no series for a label combination that
/// cannot happen: no `upstream="dead"` with `error="no_route"` (a request
/// with no route has no upstream), and an upstream's error series at zero
/// only for the codes its config can produce. The default config's
/// upstream: no rate limit (no `rate_limited`), a breaker and idempotency
/// keys (`circuit_open`, `idempotency_*`), no tunnel (`connect_not_allowed`).
#[tokio::test]
async fn metrics_have_no_series_that_cannot_happen() {
    let dir = tempfile::tempdir().unwrap();
    let src = weir::config::BUILTIN
        .replace("127.0.0.1:15001", "127.0.0.1:0")
        .replace("127.0.0.1:15000", "127.0.0.1:0");
    let (rt, _) = start(
        dir.path(),
        &format!(
            "{src}\n[upstreams.plain]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"plain\"]\ntunnel = true\n\
             [upstreams.plain.breaker]\nenabled = false\n[upstreams.plain.idempotency]\nenabled = false\n\
             [upstreams.plain.rate_limit]\nrps = 10.0\n"
        ),
        NO_WATCH,
    )
    .await;
    let text = admin(&rt, "GET", "/metrics").await.1;
    let errors = |upstream: &str| -> Vec<String> {
        let mut v: Vec<String> = parse_metrics(&text)
            .into_keys()
            .filter_map(|k| {
                let labels = k.strip_prefix("weir_requests_total{")?.strip_suffix('}')?;
                let labels: Vec<&str> = labels.split(',').collect();
                labels
                    .contains(&&*format!("upstream={upstream}"))
                    .then_some(())?;
                let error = labels.iter().find_map(|l| l.strip_prefix("error="))?;
                (!error.is_empty()).then(|| error.to_string())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        errors("app"),
        [
            "bad_response",
            "circuit_open",
            "connect_failed",
            "connect_not_allowed",
            "deadline_exceeded",
            "idempotency_in_flight",
            "idempotency_key_reused",
            "idempotency_not_replayable",
            "overloaded",
            "upstream_reset",
            "upstream_timeout",
        ]
    );
    assert_eq!(
        errors("plain"),
        [
            "bad_response",
            "connect_failed",
            "deadline_exceeded",
            "overloaded",
            "rate_limited",
            "upstream_reset",
            "upstream_timeout",
        ]
    );
    assert_eq!(errors("none"), ["bad_request", "no_route"]);
    // Without a Redis backend no command goes to one, and without a
    // `[hedge]` table no hedge is sent, and without a cache nothing is
    // cached: none of these families has a series.
    let present: Vec<&str> = text
        .lines()
        .filter(|k| !k.starts_with('#'))
        .filter(|k| {
            k.starts_with("weir_state_commands_total")
                || k.starts_with("weir_state_errors_total")
                || k.starts_with("weir_state_roundtrip_seconds")
                || k.starts_with("weir_hedges_total")
                || k.starts_with("weir_cache_")
                || k.starts_with("weir_rate_limited_total{upstream=\"app\"")
                || k.starts_with("weir_tunnels_open{upstream=\"app\"")
                || k.starts_with("weir_retry_stops_total{reason=\"rate_limited\",upstream=\"app\"")
                || k.starts_with(
                    "weir_retry_stops_total{reason=\"circuit_open\",upstream=\"plain\"",
                )
        })
        .collect();
    assert!(present.is_empty(), "{present:?}");
    // `plain` has a rate limit and tunnels: its series are there at zero.
    for series in [
        "weir_rate_limited_total{upstream=\"plain\"}",
        "weir_tunnels_open{upstream=\"plain\"}",
    ] {
        assert!(
            text.contains(&format!("{series} 0")),
            "{series} missing:\n{text}"
        );
    }
    rt.shutdown(Duration::from_millis(10)).await;
}

/// `/status.json`'s `.reload`, as a JSON value.
async fn reload_status(rt: &Runtime) -> serde_json::Value {
    let (status, text) = admin(rt, "GET", "/status.json").await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["reload"].clone()
}

/// Issue 58, item 1: a rejected reload shows in `/status.json`: when it
/// was tried, that it was not applied, each error with its place, and the
/// file's hash against the running config's. Only
/// `weir_config_last_reload_success 0` said so before.
#[tokio::test]
async fn status_json_says_a_rejected_reload_and_whether_the_file_runs() {
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.a]\nurl = \"{}\"\nhosts = [\"a\"]\n",
        up.url()
    );
    let (rt, path) = start(dir.path(), &toml, NO_WATCH).await;
    let r = reload_status(&rt).await;
    assert!(r["last"].is_null(), "{r}");
    assert_eq!(r["file_is_running"], true, "{r}");
    let running = r["running_sha256"].as_str().unwrap().to_string();
    assert_eq!(running.len(), 64, "{r}");
    assert_eq!(r["file_sha256"], running.as_str(), "{r}");

    // Two mistakes, one with no close name: rejected, and said.
    std::fs::write(&path, format!("{toml}timeout = 5\nfrobnicate = true\n")).unwrap();
    assert_eq!(admin(&rt, "POST", "/reload").await.0, 422);
    let r = reload_status(&rt).await;
    assert_eq!(r["file_is_running"], false, "{r}");
    assert_eq!(r["running_sha256"], running.as_str(), "{r}");
    assert_ne!(r["file_sha256"], running.as_str(), "{r}");
    let last = &r["last"];
    assert_eq!(last["applied"], false, "{r}");
    assert_eq!(last["trigger"], "admin", "{r}");
    assert!(
        last["at_unix_ms"].as_u64().unwrap() > 1_700_000_000_000,
        "{r}"
    );
    let errors = last["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{r}");
    assert_eq!(errors[0]["line"], 7, "{r}");
    assert_eq!(errors[0]["column"], 11, "{r}");
    assert_eq!(errors[0]["field"], "upstreams.a.timeout", "{r}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("bare number"),
        "{r}"
    );
    assert_eq!(errors[1]["field"], "upstreams.a.frobnicate", "{r}");
    assert_eq!(errors[1]["message"], "unknown field `frobnicate`", "{r}");
    assert!(errors[0]["file"].as_str().unwrap().ends_with("weir.toml"));

    // The file put right and reloaded: applied, no errors, the file runs.
    std::fs::write(&path, format!("{toml}timeout = \"5s\"\n")).unwrap();
    assert_eq!(admin(&rt, "POST", "/reload").await.0, 200);
    let r = reload_status(&rt).await;
    assert_eq!(r["last"]["applied"], true, "{r}");
    assert_eq!(r["last"]["errors"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["file_is_running"], true, "{r}");
    assert_ne!(r["running_sha256"], running.as_str(), "{r}");

    // Edited, not reloaded (no watch here): not the config that runs.
    std::fs::write(&path, format!("{toml}timeout = \"6s\"\n")).unwrap();
    let r = reload_status(&rt).await;
    assert_eq!(r["file_is_running"], false, "{r}");
    assert_eq!(r["last"]["applied"], true, "{r}");
    rt.shutdown(Duration::from_millis(10)).await;
}

/// The series `/metrics` shows now (names and labels, not values), weir's
/// own (not the process collector's).
async fn series(rt: &Runtime) -> std::collections::BTreeSet<String> {
    parse_metrics(&admin(rt, "GET", "/metrics").await.1)
        .into_keys()
        .filter(|k| k.starts_with("weir_"))
        .collect()
}

/// The built-in default config on free ports.
fn default_config() -> String {
    weir::config::BUILTIN
        .replace("127.0.0.1:15001", "127.0.0.1:0")
        .replace("127.0.0.1:15000", "127.0.0.1:0")
}

/// The default config with one of each feature that has series of its
/// own: `app` speaks h2c to three endpoints, with a cache, hedging, a rate
/// limit, tunnels, an adaptive limit and client-side throttling; tracing
/// on (the log exporter) and the shared state on a Redis (that is not
/// there: its series are there, reading down).
fn every_feature_config() -> String {
    let src = default_config();
    let (head, app) = src.split_at(src.find("[upstreams.app]").unwrap());
    format!(
        "[tracing]\nexporter = \"log\"\n\n[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\n\
         {head}{app}\nprotocol = \"h2c\"\ntunnel = true\n\
         endpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]\n\
         [upstreams.app.cache]\nenabled = true\n\
         [upstreams.app.hedge]\nafter = \"20ms\"\n\
         [upstreams.app.rate_limit]\nrps = 100.0\n\
         [upstreams.app.concurrency]\nlimit = \"adaptive\"\n\
         [upstreams.app.throttle]\nenabled = true\n"
    )
}

/// Whether any series in `s` starts with one of `prefixes`.
fn any_of(s: &std::collections::BTreeSet<String>, prefixes: &[&str]) -> Vec<String> {
    s.iter()
        .filter(|k| prefixes.iter().any(|p| k.starts_with(p)))
        .cloned()
        .collect()
}

/// Issue 58, item 3: the series the default config cannot move — 200 lines
/// of `/metrics` for one upstream — are gone: ejection series for its one
/// endpoint (one endpoint is never ejected), the tracing exporter's with
/// tracing off, `weir_state_backend_up` with the memory backend, the
/// adaptive limit's latency with a fixed limit, and `refused_stream` (an
/// HTTP/2 event) on an HTTP/1.1 upstream. Each is there with the feature
/// that moves it.
#[tokio::test]
async fn metrics_the_config_cannot_move_are_absent() {
    let cannot = [
        "weir_endpoint_ejections_total{",
        "weir_endpoint_ejected{",
        "weir_endpoints{state=ejected,",
        "weir_trace_spans_",
        "weir_state_backend_up{",
        "weir_concurrency_latency_seconds{",
        "weir_retries_total{cause=refused_stream,",
        "weir_upstream_attempts_total{result=refused_stream,",
        "weir_requests_total{code=502,error=refused_stream,",
    ];
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = start(dir.path(), &default_config(), NO_WATCH).await;
    let plain = series(&rt).await;
    assert_eq!(any_of(&plain, &cannot), Vec::<String>::new());
    // What stays: the endpoint's own series, and its active count.
    for k in [
        "weir_endpoints{state=active,upstream=app}",
        "weir_endpoint_requests_total{endpoint=127.0.0.1:8080,upstream=app}",
        "weir_concurrency_limit{upstream=app}",
        "weir_retries_total{cause=status_503,upstream=app}",
    ] {
        assert!(plain.contains(k), "{k} missing: {plain:#?}");
    }
    rt.shutdown(Duration::from_millis(10)).await;

    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = start(dir.path(), &every_feature_config(), NO_WATCH).await;
    let full = series(&rt).await;
    for p in cannot {
        assert!(
            !any_of(&full, &[p]).is_empty(),
            "no {p}… with its feature on"
        );
    }
    for k in [
        "weir_endpoint_ejections_total{endpoint=127.0.0.1:2,reason=probe_failed,upstream=app}",
        "weir_endpoint_ejected{endpoint=127.0.0.1:3,upstream=app}",
        "weir_trace_spans_exported_total{}",
        "weir_trace_spans_dropped_total{reason=queue_full}",
        "weir_cache_bytes{upstream=app}",
        "weir_hedges_total{result=won,upstream=app}",
        "weir_rate_limited_total{upstream=app}",
        "weir_tunnels_open{upstream=app}",
        "weir_throttle_probability{upstream=app}",
        "weir_state_commands_total{op=ping}",
    ] {
        assert!(full.contains(k), "{k} missing: {full:#?}");
    }
    rt.shutdown(Duration::from_millis(10)).await;
}

/// Issue 58, item 3: a reload that turns features off takes their series
/// with it (a cache turned off by a reload kept its series, and so did
/// every other feature), and one that turns them on makes them: after a
/// reload, `/metrics` has the series a fresh start with the new config has.
#[tokio::test]
async fn a_reload_leaves_the_series_a_fresh_start_would_have() {
    let fresh = |toml: String| async move {
        let dir = tempfile::tempdir().unwrap();
        let (rt, _) = start(dir.path(), &toml, NO_WATCH).await;
        let s = series(&rt).await;
        rt.shutdown(Duration::from_millis(10)).await;
        s
    };
    let plain = fresh(default_config()).await;
    let full = fresh(every_feature_config()).await;
    assert_ne!(plain, full);

    let dir = tempfile::tempdir().unwrap();
    let (rt, path) = start(dir.path(), &every_feature_config(), NO_WATCH).await;
    assert_eq!(series(&rt).await, full);
    // Every feature off.
    std::fs::write(&path, default_config()).unwrap();
    let (status, msg) = admin(&rt, "POST", "/reload").await;
    assert_eq!(status, 200, "{msg}");
    let now = series(&rt).await;
    assert_eq!(
        now.difference(&plain).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "series a fresh start with the default config has not"
    );
    assert_eq!(now, plain);
    // And on again.
    std::fs::write(&path, every_feature_config()).unwrap();
    let (status, msg) = admin(&rt, "POST", "/reload").await;
    assert_eq!(status, 200, "{msg}");
    assert_eq!(series(&rt).await, full);
    rt.shutdown(Duration::from_millis(10)).await;
}
