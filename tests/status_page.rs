//! The status page on the admin listener (docs/reference/admin.md#status-page):
//! `/status.json`'s fields over plain HTTP, the Host/Origin guard, reloads
//! adding and removing rows, and the page itself rendered by a real headless
//! Chromium against a weir whose breaker is open (its rows are drawn by the
//! page's script, so this proves the script works).
//!
//! Chromium is Debian's `chromium` package (`/usr/bin/chromium`, or
//! `WEIR_CHROMIUM`); without it the browser test says SKIPPED, unless
//! WEIR_REQUIRE_THIRD_PARTY is set (`.ci/run` sets it and installs chromium).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::third_party::{require, run_bounded};
use common::*;
use hyper::Request;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

const CHROMIUM_TOOL: &str = "chromium (apt-get install chromium, or set WEIR_CHROMIUM)";

/// How long one Chromium run may take before it is killed.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(90);

const NO_WATCH: Options = Options {
    watch: false,
    sighup: false,
    workers: 0,
};

/// $WEIR_CHROMIUM, else /usr/bin/chromium, if it exists.
fn chromium() -> Option<PathBuf> {
    let p = std::env::var_os("WEIR_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    p.exists().then_some(p)
}

/// Two upstreams: `dead` (nothing listens; its breaker opens after 3
/// failures and stays open a minute) and `ok` (answers 200; rate-limited).
fn config(dead: &str, ok: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.dead]
url = "{dead}"
hosts = ["dead"]
[upstreams.dead.retry]
max_attempts = 1
[upstreams.dead.breaker]
consecutive_failures = 3
failing_for = "0s"
open = "60s"
max_open = "60s"

[upstreams.ok]
url = "{ok}"
hosts = ["ok"]
[upstreams.ok.rate_limit]
rps = 1000
[upstreams.ok.concurrency]
limit = "adaptive"
[upstreams.ok.throttle]
enabled = true
"#
    )
}

async fn start(dir: &Path, toml: &str) -> (Runtime, PathBuf) {
    let path = dir.join("weir.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    (Runtime::start(config, NO_WATCH).await.unwrap(), path)
}

/// A request to the admin listener, `Host: 127.0.0.1:PORT` plus `headers`.
async fn admin(
    rt: &Runtime,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", rt.admin_addr));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (parts, b) = read_body(client().request(req.body(body("")).unwrap()).await.unwrap()).await;
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&b).into_owned(),
    )
}

async fn status(rt: &Runtime) -> Value {
    let (s, h, b) = admin(rt, "GET", "/status.json", &[]).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(h["content-type"], "application/json");
    serde_json::from_str(&b).unwrap_or_else(|e| panic!("{e}: {b}"))
}

fn upstream<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no upstream {name} in {s}"))
}

async fn through(rt: &Runtime, host: &str) -> u16 {
    let url = format!("http://{}/", rt.proxy.listen_addr());
    read_body(get(&client(), &url, host).await)
        .await
        .0
        .status
        .as_u16()
}

/// Sends requests to `dead` until /status.json says its breaker is open.
async fn open_the_breaker(rt: &Runtime) {
    for _ in 0..50 {
        through(rt, "dead").await;
        if upstream(&status(rt).await, "dead")["breaker"]["state"] == "open" {
            return;
        }
    }
    panic!("the breaker of `dead` did not open");
}

#[tokio::test]
async fn status_json_reports_every_field() {
    let up = TestUpstream::text("ok").await;
    let dead_url = format!("http://{}", refused_addr().await);
    let dir = tempfile::tempdir().unwrap();
    let (rt, path) = start(dir.path(), &config(&dead_url, &up.url())).await;
    for _ in 0..5 {
        assert_eq!(through(&rt, "ok").await, 200);
    }
    open_the_breaker(&rt).await;
    assert_eq!(through(&rt, "dead").await, 503);
    // Long enough for a second sample (one every 2 s): rates and history.
    tokio::time::sleep(Duration::from_millis(2300)).await;

    let s = status(&rt).await;
    for k in [
        "generated_at_unix_ms",
        "sample_interval_s",
        "history_s",
        "draining",
        "upstreams",
    ] {
        assert!(s.get(k).is_some(), "no {k} in {s}");
    }
    assert_eq!(s["sample_interval_s"], 2.0);
    assert_eq!(s["history_s"], 300.0);
    assert_eq!(s["draining"], false);
    let names: Vec<&str> = s["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["dead", "ok"], "config order");

    let fields = [
        "name",
        "target",
        "breaker",
        "window_s",
        "requests_per_s",
        "success_rate",
        "refusals_per_s",
        "refusals_total",
        "retries_per_s",
        "hedges_per_s",
        "retry_stops_per_s",
        "retry_stops_total",
        "retry_budget_tokens",
        "in_flight",
        "queued",
        "max_in_flight",
        "max_queue",
        "concurrency",
        "throttle",
        "rate_limit",
        "latency_window_s",
        "p50_ms",
        "p99_ms",
        "history",
        "endpoints",
    ];
    for name in ["dead", "ok"] {
        let u = upstream(&s, name);
        let keys: Vec<&str> = u.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = fields.to_vec();
        want.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, want, "{name}: {u}");
        let stops = u["retry_stops_total"].as_object().unwrap();
        assert_eq!(stops.len(), 9, "{u}");
        assert_eq!(u["retry_stops_per_s"].as_object().unwrap().len(), 9);
        let codes: Vec<&String> = u["refusals_total"].as_object().unwrap().keys().collect();
        assert_eq!(codes, REFUSAL_CODES, "{u}");
        let codes: Vec<&String> = u["refusals_per_s"].as_object().unwrap().keys().collect();
        assert_eq!(codes, REFUSAL_CODES, "{u}");
        assert_eq!(u["in_flight"], 0);
        assert_eq!(u["queued"], 0);
        assert_eq!(u["max_in_flight"], 1024);
        assert_eq!(u["max_queue"], 0);
        let c = &u["concurrency"];
        if name == "ok" {
            // `limit = "adaptive"`: it starts at `initial_limit`.
            assert_eq!(
                (c["mode"].as_str(), c["limit"].as_u64()),
                (Some("adaptive"), Some(4))
            );
            let t = &u["throttle"];
            assert_eq!(t["probability"], 0.0, "{u}");
            assert_eq!(t["refusals"], 0, "{u}");
            assert!(t["requests"].as_u64().is_some() && t["accepts"].as_u64().is_some());
        } else {
            assert_eq!(
                (c["mode"].as_str(), c["limit"].as_u64()),
                (Some("fixed"), Some(1024))
            );
            assert!(
                c["latency_ms"].is_null() && c["baseline_ms"].is_null(),
                "{u}"
            );
            assert!(u["throttle"].is_null(), "{u}");
        }
        assert_eq!(c["refusals"], 0, "{u}");
        assert!(u["retry_budget_tokens"].as_f64().unwrap() > 0.0, "{u}");
        let w = u["window_s"].as_f64().unwrap();
        assert!((1.0..=12.0).contains(&w), "{u}");
        assert!(!u["history"].as_array().unwrap().is_empty(), "{u}");
        for p in u["history"].as_array().unwrap() {
            for k in ["ago_s", "requests_per_s", "success_rate", "retries_per_s"] {
                assert!(p.get(k).is_some(), "{k} in {p}");
            }
        }
    }

    let ok = upstream(&s, "ok");
    assert_eq!(ok["target"], up.url());
    // One endpoint: the url's address, serving.
    let eps = ok["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 1, "{ok}");
    assert_eq!(eps[0]["addr"], up.addr.to_string());
    assert_eq!(eps[0]["state"], "active");
    assert!(eps[0]["requests"].as_u64().unwrap() > 0, "{ok}");
    for k in [
        "in_flight",
        "latency_ms",
        "failures",
        "ejections",
        "why",
        "back_in_ms",
    ] {
        assert!(eps[0].get(k).is_some(), "{k} in {ok}");
    }
    assert_eq!(ok["breaker"]["state"], "closed");
    assert_eq!(ok["breaker"]["transitions"].as_array().unwrap().len(), 0);
    assert!(ok["breaker"]["since_s"].as_f64().unwrap() >= 2.0, "{ok}");
    assert_eq!(ok["success_rate"], 1.0);
    assert!(ok["requests_per_s"].as_f64().unwrap() > 0.0, "{ok}");
    assert_eq!(ok["retries_per_s"], 0.0);
    assert!(ok["p50_ms"].as_f64().unwrap() > 0.0, "{ok}");
    assert!(ok["p99_ms"].as_f64().unwrap() >= ok["p50_ms"].as_f64().unwrap());
    let rl = &ok["rate_limit"];
    assert_eq!(rl["rps"], 1000.0);
    assert_eq!(rl["burst"], 1000);
    let tokens = rl["tokens"].as_f64().unwrap();
    assert!((900.0..=1000.0).contains(&tokens), "{rl}");
    assert_eq!(rl["keyed"], false);
    assert_eq!(rl["window_remaining"], Value::Null);

    let dead = upstream(&s, "dead");
    let b = &dead["breaker"];
    assert_eq!(b["enabled"], true);
    assert_eq!(b["state"], "open");
    let since = b["since_s"].as_f64().unwrap();
    assert!((2.0..30.0).contains(&since), "{b}");
    let until = b["half_open_in_s"].as_f64().unwrap();
    assert!(until > 10.0 && until <= 72.0, "{b}");
    let t = &b["transitions"][0];
    assert_eq!(
        (&t["from"], &t["to"]),
        (&"closed".into(), &"open".into()),
        "{b}"
    );
    let open_for = t["open_for_s"].as_f64().unwrap();
    assert!((48.0..=72.0).contains(&open_for), "{t}");
    assert!((t["ago_s"].as_f64().unwrap() - since).abs() < 0.01, "{b}");
    assert!(t["at_unix_ms"].as_u64().unwrap() > 1_600_000_000_000, "{t}");
    assert_eq!(dead["success_rate"], 0.0);
    // One refusal: the request the open breaker answered; the three
    // connect failures were answered after asking.
    assert_eq!(refusals_total(dead), 1, "{dead}");
    assert_eq!(dead["refusals_total"]["circuit_open"], 1, "{dead}");
    let rate = dead["refusals_per_s"]["circuit_open"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 1.0, "{dead}");
    assert_eq!(refusals_total(ok), 0, "{ok}");
    assert_eq!(dead["rate_limit"], Value::Null);
    // Each of the three connect failures was retryable, and max_attempts = 1
    // stopped it; the requests refused by the open breaker made no attempt.
    assert_eq!(dead["retry_stops_total"]["attempts"], 3, "{dead}");
    assert_eq!(stops_total(dead), 3, "{dead}");

    // The page itself: one file, nothing loaded from anywhere else.
    let (st, h, page) = admin(&rt, "GET", "/", &[]).await;
    assert_eq!(st, 200);
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    for external in ["<link", " src=", "@import", "url("] {
        assert!(
            !page.contains(external),
            "the page loads something: {external}"
        );
    }
    assert!(page.contains("<tbody id=\"rows\"></tbody>"));
    assert!(page.contains("/status.json"));

    // The DNS-rebinding guard of /config applies; wrong methods get 405.
    for path in ["/", "/status.json"] {
        for (k, v) in [("host", "evil.example"), ("origin", "http://evil.example")] {
            let (st, _, _) = admin(&rt, "GET", path, &[(k, v)]).await;
            assert_eq!(st, 403, "{path} with {k}: {v}");
        }
        let (st, _, _) = admin(&rt, "GET", path, &[("host", "localhost:15000")]).await;
        assert_eq!(st, 200, "{path}");
        assert_eq!(admin(&rt, "POST", path, &[]).await.0, 405, "{path}");
    }

    // A reload that removes `ok` and adds `fresh`: the rows follow.
    let fresh = TestUpstream::text("fresh").await;
    let mut next = config(&dead_url, &up.url());
    let cut = next.find("[upstreams.ok]").unwrap();
    next.truncate(cut);
    next.push_str(&format!(
        "[upstreams.fresh]\nurl = \"{}\"\nhosts = [\"fresh\"]\n",
        fresh.url()
    ));
    std::fs::write(&path, next).unwrap();
    assert_eq!(admin(&rt, "POST", "/reload", &[]).await.0, 200);
    let s = status(&rt).await;
    let names: Vec<&str> = s["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["dead", "fresh"]);
    // `dead` kept its live state, breaker and history included.
    let dead = upstream(&s, "dead");
    assert_eq!(dead["breaker"]["state"], "open");
    assert!(!dead["history"].as_array().unwrap().is_empty());
    let fresh_row = upstream(&s, "fresh");
    assert_eq!(fresh_row["breaker"]["state"], "closed");
    assert_eq!(
        fresh_row["requests_per_s"],
        Value::Null,
        "too new for a rate"
    );
    assert_eq!(fresh_row["history"].as_array().unwrap().len(), 0);
    rt.shutdown(Duration::from_secs(1)).await;
}

/// weir's refusals (`/status.json`'s `refusals_total` keys), sorted.
const REFUSAL_CODES: [&str; 11] = [
    "bad_request",
    "circuit_open",
    "connect_not_allowed",
    "header_too_large",
    "idempotency_in_flight",
    "idempotency_key_reused",
    "idempotency_not_replayable",
    "no_route",
    "overloaded",
    "rate_limited",
    "state_unavailable",
];

fn refusals_total(u: &Value) -> u64 {
    u["refusals_total"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

fn stops_total(u: &Value) -> u64 {
    u["retry_stops_total"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// The `<tr …>…</tr>` of upstream `name` in Chromium's serialised DOM.
fn row<'a>(dom: &'a str, name: &str) -> &'a str {
    let at = dom
        .find(&format!("data-upstream=\"{name}\""))
        .unwrap_or_else(|| panic!("no row for {name} in the rendered page:\n{dom}"));
    let start = dom[..at].rfind("<tr").unwrap();
    let end = at + dom[at..].find("</tr>").unwrap();
    &dom[start..end]
}

/// Runs headless Chromium on `url` with `args`, bounded in time, with its
/// own profile directory; returns its stdout.
fn run_chromium(bin: &Path, url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url);
    let out = run_bounded(&mut cmd, CHROMIUM_LIMIT);
    assert!(
        out.status.success(),
        "chromium failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_the_open_breaker() {
    let bin = chromium();
    if !require(CHROMIUM_TOOL, bin.is_some()) {
        return;
    }
    let bin = bin.unwrap();
    let up = TestUpstream::text("ok").await;
    let dead_url = format!("http://{}", refused_addr().await);
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = start(dir.path(), &config(&dead_url, &up.url())).await;
    for _ in 0..3 {
        assert_eq!(through(&rt, "ok").await, 200);
    }
    open_the_breaker(&rt).await;

    let url = format!("http://{}/", rt.admin_addr);
    let dom = tokio::task::spawn_blocking(move || {
        run_chromium(&bin, &url, &["--virtual-time-budget=5000", "--dump-dom"])
    })
    .await
    .unwrap();
    let dead = row(&dom, "dead");
    assert!(dead.contains("data-state=\"open\""), "{dead}");
    assert!(dead.contains(">open</span>"), "{dead}");
    assert!(dead.contains("closed → open"), "{dead}");
    assert!(dead.contains("<svg"), "no sparkline: {dead}");
    let ok = row(&dom, "ok");
    assert!(ok.contains(">closed</span>"), "{ok}");
    assert!(ok.contains("&nbsp;/ 1000"), "rate limit: {ok}");
    assert!(dom.contains("2 upstreams; updated"), "{dom}");
    assert!(
        !dom.contains("<span id=\"status\" class=\"error\""),
        "{dom}"
    );
    rt.shutdown(Duration::from_secs(1)).await;
}

/// Issue 58, item 4 (done in issue 53, held here): `GET /status` serves the
/// status page, as `GET /` does.
#[tokio::test]
async fn status_serves_the_page_as_the_root_does() {
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = start(dir.path(), &config(&up.url(), &up.url())).await;
    let (s, h, root) = admin(&rt, "GET", "/", &[]).await;
    assert_eq!(s, 200);
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let (s, h, status) = admin(&rt, "GET", "/status", &[]).await;
    assert_eq!(s, 200);
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert!(h.contains_key("content-security-policy"));
    assert_eq!(status, root);
    assert!(status.contains("<title>weir status</title>"));
    rt.shutdown(Duration::from_millis(10)).await;
}

/// Issue 58, item 1: while the config file on disk is not the config that
/// runs, the page says so above the table: its last reload was rejected,
/// with each error and its place. Nothing on the page said so before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_banner_while_the_file_is_not_the_running_config() {
    let bin = chromium();
    if !require(CHROMIUM_TOOL, bin.is_some()) {
        return;
    }
    let bin = bin.unwrap();
    let up = TestUpstream::text("ok").await;
    let dead_url = format!("http://{}", refused_addr().await);
    let dir = tempfile::tempdir().unwrap();
    let good = config(&dead_url, &up.url());
    let (rt, path) = start(dir.path(), &good).await;
    let url = format!("http://{}/", rt.admin_addr);
    let render = |bin: PathBuf, url: String| {
        tokio::task::spawn_blocking(move || {
            run_chromium(&bin, &url, &["--virtual-time-budget=5000", "--dump-dom"])
        })
    };
    let empty = "<div id=\"reload\" role=\"alert\" class=\"\"></div>";
    let dom = render(bin.clone(), url.clone()).await.unwrap();
    assert!(dom.contains(empty), "{dom}");

    std::fs::write(&path, format!("{good}timeout = 5\n")).unwrap();
    assert_eq!(admin(&rt, "POST", "/reload", &[]).await.0, 422);
    let dom = render(bin.clone(), url.clone()).await.unwrap();
    let at = dom.find("id=\"reload\"").unwrap();
    let banner = &dom[at..at + dom[at..].find("</div>").unwrap()];
    assert!(banner.contains("class=\"stale\""), "{banner}");
    assert!(
        banner.contains(
            "The config file on disk is not the config that runs: its last reload (admin, "
        ),
        "{banner}"
    );
    assert!(
        banner.contains("was rejected with 1 error; the running config stays."),
        "{banner}"
    );
    // The error with its place: the file, line and column, and the field.
    let line = good.lines().count() + 1;
    assert!(
        banner.contains(&format!(
            "weir.toml:{line}:1 `upstreams.ok.throttle.timeout`: unknown field `timeout`</li>"
        )),
        "{banner}"
    );

    // Put right and reloaded: no banner.
    std::fs::write(&path, &good).unwrap();
    assert_eq!(admin(&rt, "POST", "/reload", &[]).await.0, 200);
    let dom = render(bin, url).await.unwrap();
    assert!(dom.contains(empty), "{dom}");
    rt.shutdown(Duration::from_secs(1)).await;
}

/// Writes docs/status-page.png (the screenshot in docs/guide/operations.md): `ok` with 150 s
/// of traffic, some of it failing and retried (40 % of it from 50 s to
/// 90 s), `dead` with its breaker open, and `orders` on three replicas,
/// one refusing, with a row per endpoint. Run it with
/// `cargo test --test it status_page:: -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/status-page.png; run on purpose"]
async fn write_the_readme_screenshot() {
    let bin = chromium();
    if !require(CHROMIUM_TOOL, bin.is_some()) {
        return;
    }
    let bin = bin.unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(AtomicBool::new(false));
    let (count, failing) = (n.clone(), bad.clone());
    // Every 12th request a 503 (retried), two in five while `bad`; 2–9 ms each.
    let up = TestUpstream::start(move |_req| {
        let i = count.fetch_add(1, Ordering::Relaxed);
        let failing = failing.load(Ordering::Relaxed);
        async move {
            tokio::time::sleep(Duration::from_millis(2 + (i * 7 % 8) as u64)).await;
            let mut r = hyper::Response::new(body("ok"));
            if i % 12 == 5 || (failing && i % 5 < 2) {
                *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            }
            r
        }
    })
    .await;
    let dead_url = format!("http://{}", refused_addr().await);
    // `orders`: three replicas, one refusing, for the endpoint rows.
    let replica = TestUpstream::start(|_req| async { hyper::Response::new(body("ok")) }).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = config(&dead_url, &up.url()).replace(
        "open = \"60s\"\nmax_open = \"60s\"",
        "open = \"4s\"\nmax_open = \"16s\"",
    ) + &format!(
        "\n[upstreams.orders]\nurl = \"http://orders\"\nendpoints = [\"{}\", \"{}\", \"{}\"]\nhosts = [\"orders\"]\n",
        up.addr,
        replica.addr,
        refused_addr().await
    );
    let (rt, _) = start(dir.path(), &toml).await;
    let load: Vec<_> = (0..2)
        .map(|_| {
            let url = format!("http://{}/", rt.proxy.listen_addr());
            tokio::spawn(async move {
                let c = client();
                for i in 0..100_000u32 {
                    let host = match i % 20 {
                        0 => "dead",
                        1 | 5 | 9 | 13 | 17 => "orders",
                        _ => "ok",
                    };
                    let _ = read_body(get(&c, &url, host).await).await;
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(50)).await;
    bad.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(40)).await;
    bad.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let url = format!("http://{}/", rt.admin_addr);
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status-page.png");
    let shot = format!("--screenshot={}", out.display());
    tokio::task::spawn_blocking(move || {
        run_chromium(
            &bin,
            &url,
            &[
                "--virtual-time-budget=3000",
                "--window-size=1280,720",
                &shot,
            ],
        )
    })
    .await
    .unwrap();
    for l in load {
        l.abort();
    }
    rt.shutdown(Duration::from_secs(1)).await;
}

// ---------------------------------------------------------------------------
// The page at 1280 × 800: no column cut (issue 32, item 6).

/// Appended to the page for the layout check: after each render, whether
/// the page or its table is wider than the window and whether any cell's
/// content runs out of its cell, as JSON in `<pre id="layout">` (which
/// `--dump-dom` prints).
const MEASURE: &str = r#"<script>
"use strict";
(function () {
  const drawn = render;
  render = function (s) {
    drawn(s);
    const vw = document.documentElement.clientWidth;
    const cut = [];
    const page = document.documentElement.scrollWidth;
    if (page > vw) cut.push("the page is " + page + " px wide");
    const table = document.querySelector("table");
    const heads = [...table.querySelectorAll("thead th")].map(h => h.textContent);
    if (table.scrollWidth > table.clientWidth) cut.push("the table scrolls: " + table.scrollWidth);
    const body = document.body.getBoundingClientRect().right;
    const right = table.getBoundingClientRect().right;
    if (right > body + 0.5) cut.push("the table ends at " + right + ", past the page's " + body);
    for (const tr of table.querySelectorAll("tr")) {
      let col = 0;
      for (const c of tr.children) {
        const name = (heads[col] || "?") + " of " + (tr.dataset.endpoint || tr.dataset.upstream || "the head");
        col += c.colSpan;
        const r = c.getBoundingClientRect();
        if (r.right > vw + 0.5) cut.push(name + " ends at " + r.right);
        if (c.scrollWidth > c.clientWidth + 1) cut.push(name + " overflows: " + c.scrollWidth + " > " + c.clientWidth);
        for (const e of c.querySelectorAll("*")) {
          const q = e.getBoundingClientRect();
          if (q.width > 0 && (q.right > r.right + 0.5 || q.left < r.left - 0.5)) {
            cut.push(name + ": " + e.tagName + " \"" + e.textContent + "\" runs out of it");
          }
        }
      }
    }
    let out = document.getElementById("layout");
    if (!out) {
      out = document.createElement("pre");
      out.id = "layout";
      out.hidden = true;
      document.body.appendChild(out);
    }
    out.textContent = JSON.stringify({ width: vw, columns: heads.length,
      rows: table.querySelectorAll("tbody tr").length, cut: cut });
  };
})();
</script>
"#;

/// Serves `page` (weir's own, with [`MEASURE`] before `</body>`) at `/` and
/// `json` at `/status.json`, as weir's admin listener would.
async fn page_server(page: &str, json: String) -> TestUpstream {
    let page = page.replace("</body>", &format!("{MEASURE}</body>"));
    assert!(page.contains(MEASURE), "no </body> in the page");
    TestUpstream::start(move |req| {
        let (ctype, text) = match req.uri().path() {
            "/status.json" => ("application/json", json.clone()),
            _ => ("text/html; charset=utf-8", page.clone()),
        };
        async move {
            let mut r = hyper::Response::new(body(text));
            r.headers_mut()
                .insert("content-type", http::HeaderValue::from_static(ctype));
            r
        }
    })
    .await
}

/// The layout report [`MEASURE`] leaves in the DOM Chromium dumps, with the
/// page at `url` in a 1280 × 800 window.
async fn layout_at_1280(bin: &Path, url: String) -> Value {
    let bin = bin.to_path_buf();
    let dom = tokio::task::spawn_blocking(move || {
        run_chromium(
            &bin,
            &url,
            &[
                "--virtual-time-budget=5000",
                "--window-size=1280,800",
                "--dump-dom",
            ],
        )
    })
    .await
    .unwrap();
    let at = dom
        .find("<pre id=\"layout\"")
        .unwrap_or_else(|| panic!("the page did not render:\n{dom}"));
    let rest = &dom[at..];
    let rest = &rest[rest.find('>').unwrap() + 1..];
    let json = &rest[..rest.find("</pre>").unwrap()];
    let json = json
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// `u` with every list the page draws at its longest and every number at
/// its widest: all eight stop reasons and every refusal code seen, four
/// transitions, a keyed limiter with a window and a bucket, a full queue,
/// eight endpoints on long IPv6 addresses, all ejected.
fn at_its_widest(u: &mut Value) {
    let all = |m: &mut Value, v: Value| {
        for (_, x) in m.as_object_mut().unwrap() {
            *x = v.clone();
        }
    };
    all(&mut u["retry_stops_total"], 123_456_789.into());
    all(&mut u["retry_stops_per_s"], 12_345.67.into());
    all(&mut u["refusals_total"], 987_654_321.into());
    all(&mut u["refusals_per_s"], 98_765.43.into());
    u["target"] = "https://payments-backend.eu-west-1.internal.example.com:8443".into();
    u["requests_per_s"] = 123_456.7.into();
    u["success_rate"] = 0.123.into();
    u["retries_per_s"] = 12_345.67.into();
    u["retry_budget_tokens"] = 123_456.7.into();
    u["in_flight"] = 100_000.into();
    u["max_in_flight"] = 100_000.into();
    u["max_queue"] = 100_000.into();
    u["queued"] = 100_000.into();
    u["concurrency"] = serde_json::json!({
        "mode": "adaptive", "limit": 100000, "latency_ms": 30000.0,
        "baseline_ms": 30000.0, "refusals": 987654321u64,
    });
    u["throttle"] = serde_json::json!({
        "probability": 0.899, "requests": 1234567, "accepts": 1234567, "refusals": 987654321u64,
    });
    u["p50_ms"] = 12_345.6.into();
    u["p99_ms"] = 30_000.0.into();
    u["rate_limit"] = serde_json::json!({
        "rps": 123456.5, "burst": 1234567, "tokens": 1234567.0,
        "window_limit": 12345678, "window_s": 86400.0, "window_remaining": 12345678,
        "keyed": true, "keys": 100000,
    });
    let transition = |from: &str, to: &str, open: Value| {
        serde_json::json!({
            "from": from, "to": to, "ago_s": 86399.0,
            "at_unix_ms": 1_700_000_000_000u64, "open_for_s": open,
        })
    };
    u["breaker"]["state"] = "half_open".into();
    u["breaker"]["enabled"] = true.into();
    u["breaker"]["since_s"] = 86399.0.into();
    u["breaker"]["half_open_in_s"] = 3599.0.into();
    u["breaker"]["transitions"] = Value::Array(vec![
        transition("half_open", "open", 3599.0.into()),
        transition("open", "half_open", Value::Null),
        transition("half_open", "open", 3599.0.into()),
        transition("closed", "open", 3599.0.into()),
    ]);
    u["endpoints"] = (0..8)
        .map(|i| {
            serde_json::json!({
                "addr": format!("[2001:db8:1234:5678:9abc:def0:1234:{i:04x}]:65535"),
                "state": if i % 2 == 0 { "ejected" } else { "probation" },
                "in_flight": 100000, "latency_ms": 12345.6, "requests": 1234567890u64,
                "failures": 123456789, "ejections": 123456,
                "why": "consecutive_failures", "back_in_ms": 299999,
            })
        })
        .collect();
}

/// At 1280 × 800 no column of the status page is cut: not with weir's own
/// /status.json for an upstream with six endpoints whose retries stopped
/// and requests were refused, nor with every list at its longest and
/// every number at its widest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_fits_every_column_in_1280_by_800() {
    let bin = chromium();
    if !require(CHROMIUM_TOOL, bin.is_some()) {
        return;
    }
    let bin = bin.unwrap();
    // One endpoint answers 503 to every other request; five refuse.
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let up = TestUpstream::start(move |_req| {
        let i = count.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut r = hyper::Response::new(body("ok"));
            if i % 2 == 1 {
                *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            }
            r
        }
    })
    .await;
    let mut endpoints = vec![format!("\"{}\"", up.addr)];
    for _ in 0..5 {
        endpoints.push(format!("\"{}\"", refused_addr().await));
    }
    let dead_url = format!("http://{}", refused_addr().await);
    let toml = format!(
        "{}
[upstreams.payments-eu-west-1-primary]
url = \"{}\"
hosts = [\"pay\"]
endpoints = [{}]
[upstreams.payments-eu-west-1-primary.retry]
max_attempts = 2
[upstreams.payments-eu-west-1-primary.rate_limit]
rps = 20
burst = 10
window = {{ limit = 1000, period = \"1m\" }}
",
        config(&dead_url, &up.url()),
        up.url(),
        endpoints.join(", ")
    );
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = start(dir.path(), &toml).await;
    open_the_breaker(&rt).await;
    let mut answers = std::collections::BTreeSet::new();
    for i in 0..40 {
        let host = if i % 8 == 0 { "dead" } else { "pay" };
        answers.insert(through(&rt, host).await);
    }
    // Long enough for a second sample: rates.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let json = admin(&rt, "GET", "/status.json", &[]).await.2;
    let s: Value = serde_json::from_str(&json).unwrap();
    let pay = upstream(&s, "payments-eu-west-1-primary");
    assert_eq!(pay["endpoints"].as_array().unwrap().len(), 6, "{pay}");
    assert!(stops_total(pay) > 0, "{pay}");
    assert!(
        pay["refusals_total"]["rate_limited"].as_u64().unwrap() > 0,
        "{answers:?} {pay}"
    );
    assert!(
        upstream(&s, "dead")["refusals_total"]["circuit_open"]
            .as_u64()
            .unwrap()
            > 0
    );
    let page = admin(&rt, "GET", "/", &[]).await.2;

    let mut widest = s.clone();
    for u in widest["upstreams"].as_array_mut().unwrap() {
        at_its_widest(u);
    }
    for (what, json) in [("weir's own", json), ("the widest", widest.to_string())] {
        let server = page_server(&page, json).await;
        let layout = layout_at_1280(&bin, format!("{}/", server.url())).await;
        assert_eq!(layout["width"], 1280, "{what}: {layout}");
        assert_eq!(layout["columns"], 12, "{what}: {layout}");
        assert!(layout["rows"].as_u64().unwrap() >= 9, "{what}: {layout}");
        assert_eq!(layout["cut"], Value::Array(vec![]), "{what}: {layout}");
    }
    rt.shutdown(Duration::from_secs(1)).await;
}
