//! What `weir run` writes to stderr, read from the real binary: no colour
//! codes when stderr is not a terminal; the access log (`[server]
//! access_log`) in JSON with its fields, on both data paths, `errors` by
//! default; a reload that names what it changed; no Rust debug wrappers.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::third_party::free_port;
use common::*;
use hyper::{Request, Response};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

struct Weir {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Weir {
    fn start(config: &std::path::Path, format: &str) -> Weir {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["--log-format", format, "run", "--workers", "1", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Weir {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to 10 s) for a line containing `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        for _ in 0..100 {
            while let Ok(l) = self.lines.try_recv() {
                self.seen.push(l);
            }
            if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no line with {needle:?}:\n{}", self.seen.join("\n"));
    }

    fn access_lines(&mut self) -> Vec<serde_json::Value> {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "weir::access")
            .collect()
    }
}

/// Two upstreams on one server: `fast` (cleartext HTTP/1.1, the fast path)
/// and `general` (HTTP/2 with `protocol = "grpc"`, whose requests the fast
/// path leaves to the general path; an `h2c` one it serves itself).
fn config(listen: u16, admin: u16, port: u16, server_extra: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin = \"127.0.0.1:{admin}\"\n{server_extra}\n\
         [upstreams.fast]\nurl = \"http://127.0.0.1:{port}\"\nhosts = [\"fast\"]\n\
         [upstreams.fast.retry]\nmax_attempts = 2\n[upstreams.fast.retry.backoff]\nbase = \"1ms\"\n\
         [upstreams.general]\nurl = \"http://127.0.0.1:{port}\"\nhosts = [\"general\"]\nprotocol = \"grpc\"\n\
         [upstreams.general.retry]\nmax_attempts = 2\n[upstreams.general.retry.backoff]\nbase = \"1ms\"\n{extra}"
    )
}

async fn upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        if req.uri().path().starts_with("/fail") {
            Response::builder().status(503).body(body("no")).unwrap()
        } else {
            Response::new(body("yes"))
        }
    })
    .await
}

async fn wait_ready(admin: u16) {
    for _ in 0..200 {
        if let Ok(r) = client()
            .get(format!("http://127.0.0.1:{admin}/readyz").parse().unwrap())
            .await
        {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("weir did not become ready");
}

async fn send(listen: u16, host: &str, path: &str) -> u16 {
    get(&client(), &format!("http://127.0.0.1:{listen}{path}"), host)
        .await
        .status()
        .as_u16()
}

/// weir (`access_log = "all"`, JSON lines) on free ports in front of the
/// upstream on `port`, ready; its listen port, and the directory its
/// config lives in (removed when dropped).
async fn logging_all(port: u16, extra: &str) -> (Weir, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_port(), free_port());
    let path = dir.path().join("weir.toml");
    let text = config(listen, admin, port, "access_log = \"all\"", extra);
    std::fs::write(&path, text).unwrap();
    let weir = Weir::start(&path, "json");
    wait_ready(admin).await;
    (weir, listen, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_lines_in_json_on_both_paths() {
    let up = upstream().await;
    let (mut weir, listen, _dir) = logging_all(up.addr.port(), "").await;
    for host in ["fast", "general"] {
        assert_eq!(send(listen, host, "/ok?secret=1").await, 200);
        assert_eq!(send(listen, host, "/fail").await, 503);
    }
    assert_eq!(send(listen, "nobody", "/x").await, 404);
    weir.wait_for("no_route");
    let lines = weir.access_lines();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    for host in ["fast", "general"] {
        let ok = lines
            .iter()
            .find(|l| l["upstream"] == host && l["status"] == 200)
            .unwrap_or_else(|| panic!("{host}: {lines:#?}"));
        assert_eq!(ok["method"], "GET");
        assert_eq!(ok["path"], "/ok", "the query is never logged");
        assert_eq!(ok["attempts"], 1);
        assert_eq!(ok["error"], "-");
        assert!(ok["duration_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(ok["message"], "request");
        let failed = lines
            .iter()
            .find(|l| l["upstream"] == host && l["status"] == 503)
            .unwrap_or_else(|| panic!("{host}: {lines:#?}"));
        assert_eq!(failed["attempts"], 2, "{host}");
        assert_eq!(failed["retry_stop"], "attempts", "{host}");
    }
    let none = lines.iter().find(|l| l["status"] == 404).unwrap();
    assert_eq!(none["upstream"], "none");
    assert_eq!(none["error"], "no_route");
    // Not a terminal: no colour codes anywhere.
    assert!(!weir.seen.iter().any(|l| l.contains('\u{1b}')));
}

/// The access log's request side (docs/reference/logs.md#logs): the
/// client's address, the request id — the client's `x-request-id`, or one
/// weir made and forwarded, which the upstream received — the user agent,
/// and the body bytes each way, on both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_says_who_asked_and_how_much_crossed() {
    let ids = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = ids.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let id = req
            .headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        seen.lock().unwrap().push(id);
        async move {
            let _ = http_body_util::BodyExt::collect(req.into_body()).await;
            Response::new(body(vec![b'r'; 1234]))
        }
    })
    .await;
    let (mut weir, listen, _dir) = logging_all(up.addr.port(), "").await;
    for host in ["fast", "general"] {
        for id in [Some("order-42"), None] {
            let mut b = Request::post(format!("http://127.0.0.1:{listen}/up"))
                .header("host", host)
                .header("user-agent", "checkout/1.0");
            if let Some(id) = id {
                b = b.header("x-request-id", id);
            }
            let resp = client()
                .request(b.body(body(vec![b'q'; 321])).unwrap())
                .await
                .unwrap();
            let (parts, got) = read_body(resp).await;
            assert_eq!((parts.status.as_u16(), got.len()), (200, 1234));
        }
    }
    weir.wait_for("\"general\"");
    std::thread::sleep(Duration::from_millis(200));
    let lines = weir.access_lines();
    let forwarded = ids.lock().unwrap().clone();
    assert_eq!(forwarded.len(), 4, "{forwarded:?}");
    for (i, host) in ["fast", "general"].into_iter().enumerate() {
        let mine: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["upstream"] == host).collect();
        assert_eq!(mine.len(), 2, "{host}: {lines:#?}");
        for l in &mine {
            assert!(
                l["client"].as_str().unwrap().starts_with("127.0.0.1:"),
                "{l}"
            );
            assert_eq!(l["user_agent"], "checkout/1.0", "{l}");
            assert_eq!(l["bytes_in"], 321, "{l}");
            assert_eq!(l["bytes_out"], 1234, "{l}");
        }
        // The client's id is logged and forwarded as it came.
        assert_eq!(mine[0]["request_id"], "order-42", "{host}");
        assert_eq!(forwarded[2 * i], "order-42");
        // Without one, weir made an id (32 hex digits), forwarded it, and
        // logged the same.
        let made = mine[1]["request_id"].as_str().unwrap();
        assert!(
            made.len() == 32 && made.bytes().all(|b| b.is_ascii_hexdigit()),
            "{made}"
        );
        assert_eq!(forwarded[2 * i + 1], made, "{host}");
    }
}

/// The access log's attempts come from the attempts themselves, not from
/// the fields written for the client: with `annotate = false` (no
/// `x-weir-attempts` on the response) the line still has them, on both
/// paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_counts_attempts_when_responses_are_not_annotated() {
    let up = upstream().await;
    let extra = "[defaults]\nannotate = false\n";
    let (mut weir, listen, _dir) = logging_all(up.addr.port(), extra).await;
    for host in ["fast", "general"] {
        let resp = get(&client(), &format!("http://127.0.0.1:{listen}/fail"), host).await;
        assert_eq!(resp.status(), 503);
        assert!(resp.headers().get("x-weir-attempts").is_none(), "{host}");
    }
    weir.wait_for("\"general\"");
    let lines = weir.access_lines();
    for host in ["fast", "general"] {
        let failed = lines
            .iter()
            .find(|l| l["upstream"] == host && l["status"] == 503)
            .unwrap_or_else(|| panic!("{host}: {lines:#?}"));
        assert_eq!(failed["attempts"], 2, "{host}: {failed}");
        assert_eq!(failed["retry_stop"], "attempts", "{host}: {failed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_logs_errors_in_text_and_a_reload_names_its_changes() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_port(), free_port());
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, config(listen, admin, up.addr.port(), "", "")).unwrap();
    let mut weir = Weir::start(&path, "text");
    wait_ready(admin).await;
    for host in ["fast", "general"] {
        assert_eq!(send(listen, host, "/ok").await, 200);
        assert_eq!(send(listen, host, "/fail").await, 503);
    }
    let line = weir.wait_for("upstream=\"general\"");
    assert!(line.contains("status=503"), "{line}");
    weir.wait_for("upstream=\"fast\"");
    // `errors`: the 200s have no line.
    assert!(
        !weir.seen.iter().any(|l| l.contains("status=200")),
        "{}",
        weir.seen.join("\n")
    );

    // A reload says what it changed.
    let changed = config(
        listen,
        admin,
        up.addr.port(),
        "",
        "[upstreams.extra]\nurl = \"http://127.0.0.1:9\"\nhosts = [\"extra\"]\n",
    )
    .replace(
        "max_attempts = 2\n[upstreams.fast.retry.backoff]",
        "max_attempts = 3\n[upstreams.fast.retry.backoff]",
    );
    std::fs::write(&path, changed).unwrap();
    let req = Request::post(format!("http://127.0.0.1:{admin}/reload"))
        .body(body(""))
        .unwrap();
    assert_eq!(client().request(req).await.unwrap().status(), 200);
    let line = weir.wait_for("config reloaded");
    assert!(line.contains("added=extra"), "{line}");
    assert!(line.contains("changed=fast"), "{line}");
    assert!(
        line.contains("removed= ") || line.contains("removed=\"\""),
        "{line}"
    );
    // No Rust debug wrappers in any field.
    for l in &weir.seen {
        assert!(!l.contains("Some(") && !l.contains("Dedicated("), "{l}");
        assert!(!l.contains('\u{1b}'), "colour codes: {l}");
    }
}

/// Issue 41, item 7: the JSON access log escapes what the text log
/// escapes. A request target with U+202E (a bidi override: what follows
/// reads backwards in a terminal or viewer) used to be written raw in
/// JSON, as was a zero-width space; both are `\u{…}` now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_access_log_writes_bidi_and_control_characters_escaped() {
    let up = upstream().await;
    let (mut weir, listen, _dir) = logging_all(up.addr.port(), "").await;
    let req =
        "GET /ok/evil\u{202e}gpj.exe\u{200b} HTTP/1.1\r\nHost: fast\r\nConnection: close\r\n\r\n";
    let addr: std::net::SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let out = exchange_raw(addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    weir.wait_for("gpj.exe");
    let lines = weir.access_lines();
    let line = lines
        .iter()
        .find(|l| l["path"].as_str().is_some_and(|u| u.contains("gpj")))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(line["path"], "/ok/evil\\u{202e}gpj.exe\\u{200b}", "{line}");
    assert!(!weir.seen.iter().any(|l| l.contains('\u{202e}')));
}
