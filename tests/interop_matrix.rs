//! The interop matrix (issue 40): weir, run as a subprocess, between real
//! third-party servers and clients nobody here wrote, every request body
//! checked by SHA-256 at the far end and the framing headers the server
//! saw asserted.
//!
//! **weir.** The binary cargo built (`CARGO_BIN_EXE_weir`), or `$WEIR_BIN`
//! (to point the same matrix at another build: `WEIR_BIN=/path/to/weir
//! cargo test --test it interop_matrix::`), run as `weir run --config FILE`: one
//! process per server and variant (below), each with one upstream on a
//! dedicated listener on a free loopback port, `access_log = "all"`, and
//! `RUST_LOG=info,weir::proxy::fast=trace` so that its log says which
//! connections the fast path handed to the general path (one listener per
//! process, because a client address names one connection only per
//! destination: the kernel reuses local ports towards other ones).
//!
//! **Servers** (each started here on a free 127.0.0.1 port, its process
//! group killed when done), all serving one app — tests/servers/interop_app.py,
//! and tests/servers/interop_node.js for Node — that answers a JSON record of
//! what it saw (method, `content-length` and `transfer-encoding` as received,
//! body length, body SHA-256), downloads, 204, 304, `/flaky` (503 once per
//! id) and `/slow` (slow once per id):
//! - Python's `http.server` (`BaseHTTPRequestHandler` as shipped: HTTP/1.0
//!   answers, and a body read by its `Content-Length` only);
//! - gunicorn (sync workers) and uvicorn, with the WSGI and ASGI forms of
//!   the app;
//! - Node's `http` module;
//! - nginx (Debian's nginx-light), which cannot hash a body: it keeps every
//!   request body in a file (`client_body_in_file_only on`) and answers, by
//!   proxying to itself, a record of the framing headers it received and the
//!   file's name; the test hashes the file. nginx serves downloads, HEAD, 304
//!   (`if_modified_since before`) from a static file and 204 itself; it has
//!   no `/flaky` or `/slow`.
//!
//! **Clients:** curl (`--http2-prior-knowledge` for h2c), Python `requests`
//! and `httpx` over HTTP/2 with prior knowledge (tests/servers/interop_client.py),
//! Node's `fetch` (tests/servers/interop_fetch.js), grpcio on both ends of a
//! `protocol = "grpc"` upstream (tests/servers/interop_grpc.py: a message's
//! digest and trailing metadata, and a trailers-only error; a client
//! stream, 10 messages 100 ms apart, through `per_try_timeout = "500ms"`;
//! and the gRPC policy rows of tests/interop/grpc_policies.rs), and h2load
//! (POSTs to `/check`, which answers 2xx only when the body arrived whole
//! with its `Content-Length`).
//!
//! **Pushback** (docs/reference/retries.md#pushback): grpcio's server
//! fails a keyed call UNAVAILABLE with `grpc-retry-pushback-ms` (`-1`: the
//! call is not retried, the server saw it once; `2000`: the retry reached
//! it at least 2 s after the first call), through a weir that retries
//! `unavailable`; and nginx answers a GET 503 with `x-envoy-overloaded:
//! true`, which weir passes back after one attempt (nginx's own access log
//! counts them), from curl over HTTP/1.1 (the fast path) and h2c (the
//! general path).
//!
//! **Which of weir's paths serves a request** (`src/proxy/fast/head/mod.rs`,
//! `plan`): the fast path takes an HTTP/1.1 request on a cleartext connection
//! whose body (of known length, or chunked without trailers) is at most the
//! upstream's `retry.max_replay_body_bytes` (and 1 MiB), without `Expect`,
//! gRPC or an upgrade; anything else hands the *connection*, from that
//! request on, to the general path. So here:
//! - an HTTP/1.1 client's request on a fresh connection, small enough for
//!   its variant, is the fast path. Variants, one weir each per server:
//!   `cap64k` (the default cap, 64 KiB: bodies up to 64 KiB are the fast
//!   path's), `cap1m` (`max_replay_body_bytes = 1048576`: up to 1 MiB, so
//!   64 KiB + 1 and 1 MiB go the fast path too) and `cap16`
//!   (`max_replay_body_bytes = 16`: every body over 16 bytes streams through
//!   the general path);
//! - a larger body, an `Expect: 100-continue` request, and every h2c client
//!   (the fast path is HTTP/1.1 only) are the general path;
//! - "primed": a `requests` call on a fresh connection whose first request
//!   was a GET with `Expect: 100-continue`, which hands the connection to
//!   hyper — so GETs, downloads, 204, 304, keyed and hedged requests from an
//!   HTTP/1.1 client are served by the general path too, bodies buffered as the
//!   fast path would.
//!
//! Each case's name says the path it is meant to take, and the test checks
//! that it did: weir's trace line `to the general path peer=…` names the
//! connections handed over, its access line the client address of each
//! request.
//!
//! **Pairings that cannot work**, asserted as such: `http.server` reads a
//! body by `Content-Length` only, so a body its client sent chunked (and
//! weir passed on chunked) reaches its app as 0 bytes and is answered 200
//! anyway, or — when the server closes with the body unread — weir answers
//! 502 `upstream_reset`. Either is expected, and said in the case.
//!
//! **Framing asserted:** a body the client sent with a length must arrive
//! with that `Content-Length` and no `Transfer-Encoding`, everywhere (a GET
//! with neither, or `Content-Length: 0`); a body sent chunked may arrive
//! chunked or with its length, and whole; an h2c body without
//! `content-length` that weir holds (within the cap) must arrive with a
//! `Content-Length` (issue 40's rule). An upstream's `Content-Length` must
//! reach an HTTP/1.1 client (downloads, HEAD); 204 and 304 come without a
//! body or `Transfer-Encoding`; a keyed POST sent again is answered from
//! weir's record (`idempotent-replayed: true`); the keyed POST after a 503
//! took 2 attempts and the hedged GET's hedge won (`x-weir-hedge: won`),
//! each seen twice by the server.
//!
//! All failures are collected and reported in one table at the end.
#![allow(clippy::unwrap_used)]

use crate::common;
#[path = "interop/grpc_policies.rs"]
mod grpc_policies;

use common::third_party::{
    free_port, nginx, nginx_logs, python, require, run_bounded, server_script, wait_for_port,
    CURL_TOOL, NGINX_TOOL, PYTHON_TOOL,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The real monotonic clock (the test's own run time and waits on other
/// processes).
#[allow(clippy::disallowed_methods)]
fn real_now() -> Instant {
    Instant::now()
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
/// The size of the downloads.
const DOWNLOAD: usize = 8 * MIB;
/// How long `/slow` keeps its first request, and when weir hedges.
const SLOW_MS: u64 = 1500;
const HEDGE_AFTER: &str = "300ms";
/// How long the clients may take, all together (a healthy run takes 15–25 s
/// on 2 cores); a case not run by then fails as such. Each request's own
/// limit is 30 s.
const BUDGET: Duration = Duration::from_secs(150);

// ---------------------------------------------------------------------------
// Processes

/// A process this test started in a process group of its own (so that
/// gunicorn's workers go with their master); dropping it kills that group
/// and reaps the process.
struct Proc {
    name: &'static str,
    port: u16,
    child: std::process::Child,
    log: PathBuf,
}

impl Proc {
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its log (stderr).
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

fn signal_group(pid: u32, signal: &str) {
    let _ = Command::new("/bin/kill")
        .args([format!("-{signal}"), "--".into(), format!("-{pid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for Proc {
    fn drop(&mut self) {
        signal_group(self.child.id(), "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf, port: u16) -> Proc {
    let err = std::fs::File::create(&log).unwrap();
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
    Proc {
        name,
        port,
        child,
        log,
    }
}

/// Starts `cmd`, which prints `PORT <n>` first.
fn spawn_port_line(name: &'static str, cmd: &mut Command, log: PathBuf) -> Proc {
    cmd.stdout(Stdio::piped());
    let mut p = spawn(name, cmd, log, 0);
    let stdout = p.child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        for _ in lines.by_ref() {}
    });
    let line = rx.recv_timeout(Duration::from_secs(15));
    match &line {
        Ok(Some(Ok(l))) if l.starts_with("PORT ") => p.port = l[5..].trim().parse().unwrap(),
        _ => panic!("{name} printed no `PORT <n>`: {line:?}\n{}", p.log_tail()),
    }
    p
}

/// Starts `cmd`, which listens on `port`, and waits for it.
fn spawn_on_port(name: &'static str, cmd: &mut Command, log: PathBuf, port: u16) -> Proc {
    cmd.stdout(Stdio::null());
    let mut p = spawn(name, cmd, log, port);
    let deadline = real_now() + Duration::from_secs(20);
    while !wait_for_port(port, Duration::from_millis(200)) {
        assert!(p.alive(), "{name} exited at start:\n{}", p.log_tail());
        assert!(
            real_now() < deadline,
            "{name} did not listen on {port}:\n{}",
            p.log_tail()
        );
    }
    p
}

// ---------------------------------------------------------------------------
// The matrix's vocabulary

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Server {
    PyHttp,
    Gunicorn,
    Uvicorn,
    Node,
    Nginx,
}

impl Server {
    const ALL: [Server; 5] = [
        Server::PyHttp,
        Server::Gunicorn,
        Server::Uvicorn,
        Server::Node,
        Server::Nginx,
    ];

    fn name(self) -> &'static str {
        match self {
            Server::PyHttp => "http.server",
            Server::Gunicorn => "gunicorn",
            Server::Uvicorn => "uvicorn",
            Server::Node => "node-http",
            Server::Nginx => "nginx",
        }
    }

    /// Its upstreams' names in weir's config.
    fn key(self) -> &'static str {
        match self {
            Server::PyHttp => "pyhttp",
            Server::Gunicorn => "gunicorn",
            Server::Uvicorn => "uvicorn",
            Server::Node => "node",
            Server::Nginx => "nginx",
        }
    }

    /// Whether the app reads a chunked body.
    fn reads_chunked(self) -> bool {
        self != Server::PyHttp
    }

    /// Whether it serves `/flaky`, `/slow` and `/check`.
    fn has_app_routes(self) -> bool {
        self != Server::Nginx
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Client {
    Curl,
    Requests,
    Httpx,
    Fetch,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Curl => "curl",
            Client::Requests => "requests",
            Client::Httpx => "httpx",
            Client::Fetch => "fetch",
        }
    }
}

/// One of a server's listeners in weir, by its `max_replay_body_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// The default (64 KiB); hedging on (`after = 300ms`).
    Cap64k,
    Cap1m,
    Cap16,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Cap64k, Variant::Cap1m, Variant::Cap16];

    fn cap(self) -> usize {
        match self {
            Variant::Cap64k => 64 * KIB,
            Variant::Cap1m => MIB,
            Variant::Cap16 => 16,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Cap64k => "cap64k",
            Variant::Cap1m => "cap1m",
            Variant::Cap16 => "cap16",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataPath {
    Fast,
    Hyper,
}

impl DataPath {
    fn name(self) -> &'static str {
        match self {
            DataPath::Fast => "fast path",
            DataPath::Hyper => "the general path",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    None,
    /// Sent with `Content-Length`.
    Sized(usize),
    /// Sent without a length: HTTP/1.1 chunked, HTTP/2 DATA without
    /// `content-length`.
    Chunked(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Echo,
    /// The second keyed request: answered from weir's record.
    Replay,
    Download(usize),
    Head(usize),
    NoContent,
    NotModified,
    Flaky,
    Slow,
}

#[derive(Debug, Clone)]
struct Case {
    id: String,
    /// What is sent, for the case's name.
    what: String,
    server: Server,
    client: Client,
    h2: bool,
    primed: bool,
    variant: Variant,
    method: &'static str,
    kind: Kind,
    body: Body,
    expect_continue: bool,
    key: Option<String>,
}

impl Case {
    /// The case's name in the report: what, server, client and
    /// connection, weir's listener, and the path meant to serve it.
    fn name(&self) -> String {
        let conn = match (self.h2, self.primed) {
            (true, _) => "h2c",
            (false, true) => "h1-primed",
            (false, false) => "h1",
        };
        format!(
            "{} · {} · {} {conn} · {} ({})",
            self.what,
            self.server.name(),
            self.client.name(),
            self.variant.name(),
            self.expected_path().name()
        )
    }

    /// The request target (path and query); the path is unique to the case
    /// (a replay shares its original's).
    fn target(&self) -> String {
        let id = &self.id;
        match self.kind {
            Kind::Echo | Kind::Replay => format!("/echo/{id}"),
            Kind::Download(n) | Kind::Head(n) => format!("/download/{id}?n={n}"),
            Kind::NoContent => format!("/status/204/{id}"),
            Kind::NotModified => format!("/status/304/{id}"),
            Kind::Flaky => format!("/flaky/{id}"),
            Kind::Slow => format!("/slow/{id}?ms={SLOW_MS}"),
        }
    }

    fn path_only(&self) -> String {
        self.target().split('?').next().unwrap().to_string()
    }

    fn headers(&self) -> Vec<(String, String)> {
        let mut h = Vec::new();
        if let Some(k) = &self.key {
            h.push(("Idempotency-Key".to_string(), k.clone()));
        }
        if self.expect_continue {
            h.push(("Expect".to_string(), "100-continue".to_string()));
        }
        if self.kind == Kind::NotModified {
            if self.server == Server::Nginx {
                // nginx's own conditional GET on a static file.
                h.push((
                    "If-Modified-Since".to_string(),
                    "Fri, 01 Jan 2100 00:00:00 GMT".to_string(),
                ));
            } else {
                h.push(("If-None-Match".to_string(), "\"v1\"".to_string()));
            }
        }
        h
    }

    /// Which of weir's paths serves it (see the module's doc). A chunked
    /// body is measured by its data: the sizes here are far from every cap.
    fn expected_path(&self) -> DataPath {
        if self.h2 || self.primed || self.expect_continue {
            return DataPath::Hyper;
        }
        let cap = self.variant.cap().min(MIB);
        let len = match self.body {
            Body::None => 0,
            Body::Sized(n) | Body::Chunked(n) => n,
        };
        if len > cap {
            DataPath::Hyper
        } else {
            DataPath::Fast
        }
    }
}

fn size_name(n: usize) -> String {
    match n {
        0 => "0 B".into(),
        n if n % MIB == 0 => format!("{} MiB", n / MIB),
        n if n % KIB == 0 => format!("{} KiB", n / KIB),
        n if n > KIB && (n - 1) % KIB == 0 => format!("{} KiB + 1", (n - 1) / KIB),
        n => format!("{n} B"),
    }
}

/// The cases, numbered as they are added.
struct Plan {
    cases: Vec<Case>,
}

impl Plan {
    /// Adds a case (`conn`: "h1", "h1-primed" or "h2c"); returns it for
    /// the fields that have defaults.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        server: Server,
        client: Client,
        conn: &str,
        variant: Variant,
        method: &'static str,
        kind: Kind,
        body: Body,
        what: &str,
    ) -> &mut Case {
        self.cases.push(Case {
            id: format!("c{}", self.cases.len()),
            what: what.to_string(),
            server,
            client,
            h2: conn == "h2c",
            primed: conn == "h1-primed",
            variant,
            method,
            kind,
            body,
            expect_continue: false,
            key: None,
        });
        self.cases.last_mut().unwrap()
    }
}

/// Every case for one server.
fn plan(server: Server, plan: &mut Plan) {
    use Body::*;
    use Client::*;
    use Kind::*;
    use Variant::*;
    let s = server;
    // Request bodies with Content-Length, every size, on both paths: curl on
    // a fresh connection (the fast path up to the cap), curl to the 1 MiB
    // cap (the fast path up to 1 MiB), requests primed (the general path,
    // buffered up to 64 KiB, streamed above), httpx over h2c (the general path),
    // fetch to the 16-byte cap (the general path, streamed, but for 0 B).
    for n in [0, KIB, 64 * KIB, 64 * KIB + 1, MIB, 8 * MIB] {
        let what = format!("POST {}", size_name(n));
        plan.add(s, Curl, "h1", Cap64k, "POST", Echo, Sized(n), &what);
        plan.add(s, Curl, "h1", Cap1m, "POST", Echo, Sized(n), &what);
        plan.add(
            s,
            Requests,
            "h1-primed",
            Cap64k,
            "POST",
            Echo,
            Sized(n),
            &what,
        );
        plan.add(s, Httpx, "h2c", Cap64k, "POST", Echo, Sized(n), &what);
        plan.add(s, Fetch, "h1", Cap16, "POST", Echo, Sized(n), &what);
    }
    // Answers: GET, HEAD, an 8 MiB download, 204, 304, from every client,
    // over both paths.
    let head_n = if s == Server::Nginx { DOWNLOAD } else { 1000 };
    for (client, conn) in [
        (Curl, "h1"),
        (Requests, "h1-primed"),
        (Httpx, "h2c"),
        (Fetch, "h1"),
        (Curl, "h2c"),
    ] {
        plan.add(s, client, conn, Cap64k, "GET", Echo, None, "GET");
        plan.add(s, client, conn, Cap64k, "HEAD", Head(head_n), None, "HEAD");
        plan.add(
            s,
            client,
            conn,
            Cap64k,
            "GET",
            Download(DOWNLOAD),
            None,
            "GET an 8 MiB download",
        );
        plan.add(s, client, conn, Cap64k, "GET", NoContent, None, "GET a 204");
        plan.add(
            s,
            client,
            conn,
            Cap64k,
            "GET",
            NotModified,
            None,
            "GET a 304",
        );
    }
    // Chunked POSTs: small (held, so the fast path's when the cap allows),
    // and 1 MiB (streamed through the general path). http.server cannot read a
    // chunked body; its large one is left out (weir's write fails against
    // a server that answered and closed, and that says nothing new).
    let chunked = "chunked POST 3000 B";
    plan.add(s, Curl, "h1", Cap64k, "POST", Echo, Chunked(3000), chunked);
    plan.add(s, Curl, "h1", Cap16, "POST", Echo, Chunked(3000), chunked);
    plan.add(
        s,
        Requests,
        "h1",
        Cap64k,
        "POST",
        Echo,
        Chunked(3000),
        chunked,
    );
    plan.add(
        s,
        Requests,
        "h1-primed",
        Cap64k,
        "POST",
        Echo,
        Chunked(3000),
        chunked,
    );
    plan.add(s, Fetch, "h1", Cap64k, "POST", Echo, Chunked(3000), chunked);
    plan.add(
        s,
        Httpx,
        "h2c",
        Cap64k,
        "POST",
        Echo,
        Chunked(3000),
        "POST 3000 B without content-length",
    );
    if s.reads_chunked() {
        plan.add(
            s,
            Curl,
            "h1",
            Cap64k,
            "POST",
            Echo,
            Chunked(MIB),
            "chunked POST 1 MiB",
        );
        plan.add(
            s,
            Httpx,
            "h2c",
            Cap64k,
            "POST",
            Echo,
            Chunked(MIB),
            "POST 1 MiB without content-length",
        );
    }
    // Expect: 100-continue (always the general path, the body streamed).
    for (client, variant, n) in [
        (Curl, Cap64k, 128 * KIB),
        (Curl, Cap1m, KIB),
        (Requests, Cap1m, 128 * KIB),
    ] {
        let what = format!("POST {} with Expect: 100-continue", size_name(n));
        plan.add(s, client, "h1", variant, "POST", Echo, Sized(n), &what)
            .expect_continue = true;
    }
    // PUT (idempotent, so replayable and hedgeable when held).
    for (client, conn, variant) in [
        (Curl, "h1", Cap64k),
        (Curl, "h1", Cap1m),
        (Requests, "h1-primed", Cap1m),
        (Httpx, "h2c", Cap64k),
        (Fetch, "h1", Cap1m),
    ] {
        plan.add(
            s,
            client,
            conn,
            variant,
            "PUT",
            Echo,
            Sized(128 * KIB),
            "PUT 128 KiB",
        );
    }
    // Keyed POSTs, each sent twice: the second is answered from weir's
    // record (`idempotent-replayed: true`), the upstream not reached.
    for (client, conn, variant, n) in [
        (Curl, "h1", Cap64k, KIB),
        (Requests, "h1-primed", Cap64k, KIB),
        (Httpx, "h2c", Cap64k, KIB),
        (Fetch, "h1", Cap64k, KIB),
        (Curl, "h1", Cap64k, 128 * KIB),
        (Curl, "h1", Cap1m, 128 * KIB),
        (Httpx, "h2c", Cap64k, 128 * KIB),
    ] {
        let what = format!("keyed POST {}", size_name(n));
        let c = plan.add(s, client, conn, variant, "POST", Echo, Sized(n), &what);
        let (id, key) = (c.id.clone(), format!("key-{}", c.id));
        c.key = Some(key.clone());
        let r = plan.add(
            s,
            client,
            conn,
            variant,
            "POST",
            Replay,
            Sized(n),
            &format!("{what}, sent again"),
        );
        // The same request: its original's target and key.
        r.id = id;
        r.key = Some(key);
    }
    if !s.has_app_routes() {
        return;
    }
    // A keyed POST whose first attempt gets 503: retried, the body sent
    // again whole.
    for (client, conn) in [
        (Curl, "h1"),
        (Requests, "h1-primed"),
        (Httpx, "h2c"),
        (Fetch, "h1"),
    ] {
        let c = plan.add(
            s,
            client,
            conn,
            Cap64k,
            "POST",
            Flaky,
            Sized(KIB),
            "keyed POST 1 KiB retried after a 503",
        );
        c.key = Some(format!("key-{}", c.id));
    }
    // A hedged GET: the first attempt is slow, the hedge answers.
    for (client, conn) in [(Curl, "h1"), (Requests, "h1-primed"), (Httpx, "h2c")] {
        plan.add(s, client, conn, Cap64k, "GET", Slow, None, "hedged GET");
    }
}

// ---------------------------------------------------------------------------
// What came back

/// What a client saw.
#[derive(Debug, Default, Clone)]
struct Outcome {
    status: u16,
    version: String,
    headers: Vec<(String, String)>,
    body_len: u64,
    sha256: String,
    json: Option<Value>,
    error: Option<String>,
}

impl Outcome {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn from_json(v: &Value) -> Outcome {
        Outcome {
            status: v["status"].as_u64().unwrap_or(0) as u16,
            version: v["http_version"].as_str().unwrap_or("").to_string(),
            headers: v["headers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| {
                            (
                                p[0].as_str().unwrap_or("").to_ascii_lowercase(),
                                p[1].as_str().unwrap_or("").to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            body_len: v["body_len"].as_u64().unwrap_or(0),
            sha256: v["sha256"].as_str().unwrap_or("").to_string(),
            json: v.get("json").filter(|j| j.is_object()).cloned(),
            error: v["error"].as_str().map(str::to_string),
        }
    }
}

/// What the server said it received.
#[derive(Debug)]
struct Record {
    method: String,
    content_length: Option<String>,
    transfer_encoding: Option<String>,
    body_len: u64,
    sha256: String,
    seen: u64,
}

fn record_of(v: &Value) -> Result<Record, String> {
    // nginx reports "" for a header it did not get.
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let (body_len, sha256) = match v.get("body_file") {
        Some(f) => match f.as_str().filter(|f| !f.is_empty()) {
            Some(f) => {
                let bytes = std::fs::read(f).map_err(|e| format!("nginx's body file {f}: {e}"))?;
                (bytes.len() as u64, sha_hex(&bytes))
            }
            None => (0, sha_hex(b"")),
        },
        None => (
            v["body_len"].as_u64().ok_or("no body_len in the record")?,
            s("sha256").ok_or("no sha256 in the record")?,
        ),
    };
    Ok(Record {
        method: s("method").unwrap_or_default(),
        content_length: s("content_length"),
        transfer_encoding: s("transfer_encoding"),
        body_len,
        sha256,
        seen: v["seen"].as_u64().unwrap_or(1),
    })
}

fn sha_hex(b: &[u8]) -> String {
    let d = Sha256::digest(b);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request body of `n` bytes: a xorshift stream seeded by `n`.
fn request_body(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ n as u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The servers' download: byte i is i % 251.
fn download_body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Files and digests of the bodies the cases send.
struct Bodies {
    dir: PathBuf,
    sha: BTreeMap<usize, String>,
}

impl Bodies {
    fn new(dir: &Path, cases: &[Case]) -> Bodies {
        let mut sha = BTreeMap::new();
        let dir = dir.join("bodies");
        std::fs::create_dir_all(&dir).unwrap();
        for c in cases {
            if let Body::Sized(n) | Body::Chunked(n) = c.body {
                sha.entry(n).or_insert_with(|| {
                    let b = request_body(n);
                    std::fs::write(dir.join(n.to_string()), &b).unwrap();
                    sha_hex(&b)
                });
            }
        }
        Bodies { dir, sha }
    }

    fn file(&self, n: usize) -> PathBuf {
        self.dir.join(n.to_string())
    }
}

/// The checks of one case: its problems.
fn check(c: &Case, o: &Outcome, bodies: &Bodies, download_sha: &str) -> Vec<String> {
    let mut bad = Vec::new();
    if let Some(e) = &o.error {
        bad.push(format!("client error: {e}"));
        return bad;
    }
    if c.h2 && !(o.version == "HTTP/2" || o.version == "2") {
        bad.push(format!("answered over {:?}, not HTTP/2", o.version));
    }
    let weir_error = o.header("x-weir-error").map(str::to_string);
    let expected_status = match c.kind {
        Kind::NoContent => 204,
        Kind::NotModified => 304,
        _ => 200,
    };
    // http.server and a body its client sent chunked: when weir passes it
    // on chunked, http.server reads none of it and answers, or closes with
    // the body unread and weir's write fails (502 upstream_reset).
    if c.server == Server::PyHttp
        && matches!(c.body, Body::Chunked(_))
        && o.status == 502
        && weir_error.as_deref() == Some("upstream_reset")
    {
        return bad;
    }
    if o.status != expected_status {
        bad.push(format!(
            "status {} (expected {expected_status}){}",
            o.status,
            weir_error
                .map(|e| format!(", x-weir-error: {e}"))
                .unwrap_or_default()
        ));
        return bad;
    }
    // The record, for the kinds whose answer carries one.
    let record = match c.kind {
        Kind::Echo | Kind::Replay | Kind::Flaky | Kind::Slow => match &o.json {
            Some(v) => match record_of(v) {
                Ok(r) => Some(r),
                Err(e) => {
                    bad.push(e);
                    None
                }
            },
            None => None,
        },
        _ => None,
    };
    if let Some(r) = &record {
        if !r.method.eq_ignore_ascii_case(c.method) {
            bad.push(format!("the server saw method {}", r.method));
        }
        let te = r.transfer_encoding.as_deref();
        let cl = r.content_length.as_deref();
        match c.body {
            Body::None => {
                if te.is_some() || cl.is_some_and(|v| v != "0") {
                    bad.push(format!(
                        "a request without a body arrived with content-length {cl:?}, transfer-encoding {te:?}"
                    ));
                }
            }
            Body::Sized(n) => {
                if cl != Some(n.to_string().as_str()) || te.is_some() {
                    bad.push(format!(
                        "sent with content-length {n}; the server saw content-length {cl:?}, transfer-encoding {te:?}"
                    ));
                }
                if r.body_len != n as u64 || r.sha256 != bodies.sha[&n] {
                    bad.push(format!(
                        "the server read {} bytes{} (sent {n})",
                        r.body_len,
                        if r.sha256 == bodies.sha[&n] {
                            ""
                        } else {
                            ", not the bytes sent"
                        }
                    ));
                }
            }
            Body::Chunked(n) => {
                let held = n <= c.variant.cap();
                if c.h2 && held && (cl != Some(n.to_string().as_str()) || te.is_some()) {
                    // The rule of issue 40: an HTTP/2 body without
                    // content-length that weir holds goes with one.
                    bad.push(format!(
                        "an h2c body of {n} bytes without content-length, held by weir, arrived with content-length {cl:?}, transfer-encoding {te:?} (expected content-length {n})"
                    ));
                }
                let pyhttp_chunked = c.server == Server::PyHttp && te.is_some();
                if pyhttp_chunked {
                    // Expected: http.server reads Content-Length only.
                    if r.body_len != 0 {
                        bad.push(format!(
                            "http.server read {} bytes of a chunked body (it reads none)",
                            r.body_len
                        ));
                    }
                } else if r.body_len != n as u64 || r.sha256 != bodies.sha[&n] {
                    bad.push(format!(
                        "the server read {} bytes{} (sent {n} without a length; it saw content-length {cl:?}, transfer-encoding {te:?})",
                        r.body_len,
                        if r.sha256 == bodies.sha[&n] {
                            ""
                        } else {
                            ", not the bytes sent"
                        }
                    ));
                }
                if te.is_some_and(|t| !t.eq_ignore_ascii_case("chunked"))
                    || (te.is_some() && cl.is_some())
                {
                    bad.push(format!(
                        "framing content-length {cl:?} with transfer-encoding {te:?}"
                    ));
                }
            }
        }
    } else if matches!(c.kind, Kind::Echo | Kind::Replay | Kind::Flaky | Kind::Slow) {
        bad.push(format!(
            "no JSON record in the answer ({} bytes)",
            o.body_len
        ));
    }
    let replayed = o.header("idempotent-replayed");
    match c.kind {
        Kind::Replay if replayed != Some("true") => bad.push(format!(
            "not answered from weir's record: idempotent-replayed {replayed:?}"
        )),
        Kind::Echo if c.key.is_some() && replayed.is_some() => {
            bad.push("the first keyed request was answered as a replay".into())
        }
        _ => {}
    }
    let te_out = o.header("transfer-encoding");
    let cl_out = o.header("content-length");
    match c.kind {
        Kind::Download(n) => {
            if o.body_len != n as u64 || o.sha256 != download_sha {
                bad.push(format!(
                    "the client got {} bytes{} (the server sent {n})",
                    o.body_len,
                    if o.sha256 == download_sha {
                        ""
                    } else {
                        ", not the bytes sent"
                    }
                ));
            }
            if !c.h2 && (cl_out != Some(n.to_string().as_str()) || te_out.is_some()) {
                bad.push(format!(
                    "the server answered with content-length {n}; the HTTP/1.1 client got content-length {cl_out:?}, transfer-encoding {te_out:?}"
                ));
            }
        }
        Kind::Head(n) => {
            if o.body_len != 0 {
                bad.push(format!("a HEAD answer with {} body bytes", o.body_len));
            }
            if !c.h2 && cl_out != Some(n.to_string().as_str()) {
                bad.push(format!(
                    "HEAD: the server said content-length {n}; the client got {cl_out:?}"
                ));
            }
        }
        Kind::NoContent | Kind::NotModified => {
            if o.body_len != 0 {
                bad.push(format!("{} with {} body bytes", o.status, o.body_len));
            }
            if te_out.is_some() {
                bad.push(format!("{} with transfer-encoding {te_out:?}", o.status));
            }
        }
        Kind::Flaky => {
            let attempts = o.header("x-weir-attempts");
            if attempts != Some("2") || record.as_ref().is_some_and(|r| r.seen != 2) {
                bad.push(format!(
                    "expected a retry after the 503: x-weir-attempts {attempts:?}, the server saw it {} times",
                    record.as_ref().map_or(0, |r| r.seen)
                ));
            }
        }
        Kind::Slow => {
            let hedge = o.header("x-weir-hedge");
            if hedge != Some("won") || record.as_ref().is_some_and(|r| r.seen != 2) {
                bad.push(format!(
                    "expected the hedge to win: x-weir-hedge {hedge:?}, the server saw it {} times",
                    record.as_ref().map_or(0, |r| r.seen)
                ));
            }
        }
        Kind::Echo | Kind::Replay => {}
    }
    bad
}

// ---------------------------------------------------------------------------
// Clients

/// One request with curl.
fn run_curl(c: &Case, url: &str, bodies: &Bodies, dir: &Path, end: Instant) -> Outcome {
    let Some(left) = end.checked_duration_since(real_now()) else {
        return not_run();
    };
    let out_file = dir.join(format!("{}-{}.body", c.id, c.kind_tag()));
    let hdr_file = dir.join(format!("{}-{}.head", c.id, c.kind_tag()));
    let mut cmd = Command::new("curl");
    // With --head curl writes the head to the output: a HEAD's body is
    // never read.
    let out_file = match c.method {
        "HEAD" => PathBuf::from("/dev/null"),
        _ => out_file,
    };
    cmd.args(["-sS", "--max-time", "30", "-o"])
        .arg(&out_file)
        .arg("-D")
        .arg(&hdr_file)
        .args(["-w", "%{http_code} %{http_version}"]);
    if c.h2 {
        cmd.arg("--http2-prior-knowledge");
    }
    if c.method == "HEAD" {
        cmd.arg("--head");
    } else if c.method != "GET" && c.method != "POST" {
        cmd.args(["-X", c.method]);
    }
    // curl adds `Expect: 100-continue` to larger bodies by itself.
    if !c.expect_continue {
        cmd.args(["-H", "Expect:"]);
    }
    for (k, v) in c.headers() {
        cmd.args(["-H", &format!("{k}: {v}")]);
    }
    match c.body {
        Body::None => {}
        Body::Sized(n) => {
            cmd.arg("--data-binary")
                .arg(format!("@{}", bodies.file(n).display()));
        }
        Body::Chunked(n) => {
            cmd.args(["-H", "Transfer-Encoding: chunked", "--data-binary"])
                .arg(format!("@{}", bodies.file(n).display()));
        }
    }
    cmd.arg(url);
    let out = run_bounded(&mut cmd, left.min(Duration::from_secs(35)));
    let mut o = Outcome::default();
    if !out.status.success() {
        o.error = Some(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return o;
    }
    let w = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut w = w.split_whitespace();
    o.status = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    o.version = w.next().unwrap_or("").to_string();
    // The last header block (after any 100 Continue).
    let head = std::fs::read_to_string(&hdr_file).unwrap_or_default();
    for line in head.lines() {
        let line = line.trim_end();
        if line.starts_with("HTTP/") {
            o.headers.clear();
        } else if let Some((k, v)) = line.split_once(':') {
            o.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let body = std::fs::read(&out_file).unwrap_or_default();
    o.body_len = body.len() as u64;
    o.sha256 = sha_hex(&body);
    if body.first() == Some(&b'{') {
        o.json = serde_json::from_slice(&body).ok();
    }
    if c.method != "HEAD" {
        let _ = std::fs::remove_file(&out_file);
    }
    o
}

impl Case {
    /// A replay shares its original's id; files are told apart by kind.
    fn kind_tag(&self) -> &'static str {
        match self.kind {
            Kind::Replay => "replay",
            _ => "first",
        }
    }
}

fn not_run() -> Outcome {
    Outcome {
        error: Some(format!("not run: the clients' {BUDGET:?} had run out")),
        ..Outcome::default()
    }
}

/// A batch of requests through tests/servers/interop_client.py or
/// interop_fetch.js; results in order.
fn run_script(
    client: Client,
    cases: &[(Case, String, Option<String>)],
    bodies: &Bodies,
    dir: &Path,
    tag: &str,
    end: Instant,
) -> Vec<Outcome> {
    let Some(limit) = end.checked_duration_since(real_now()) else {
        return vec![not_run(); cases.len()];
    };
    let specs: Vec<Value> = cases
        .iter()
        .map(|(c, url, primer)| {
            let body_file = match c.body {
                Body::None => Value::Null,
                Body::Sized(n) | Body::Chunked(n) => json!(bodies.file(n)),
            };
            json!({
                "id": format!("{}-{}", c.id, c.kind_tag()),
                "method": c.method,
                "url": url,
                "headers": c.headers().into_iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "body_file": body_file,
                "chunked": matches!(c.body, Body::Chunked(_)),
                "primer": primer,
            })
        })
        .collect();
    let spec_file = dir.join(format!("spec-{tag}.json"));
    std::fs::write(&spec_file, serde_json::to_vec(&specs).unwrap()).unwrap();
    let mut cmd = match client {
        Client::Fetch => {
            let mut cmd = Command::new("node");
            cmd.arg(server_script("interop_fetch.js"));
            cmd
        }
        Client::Requests | Client::Httpx => {
            let mut cmd = Command::new(python().unwrap());
            cmd.arg(server_script("interop_client.py"))
                .arg(client.name());
            cmd
        }
        Client::Curl => unreachable!(),
    };
    cmd.arg(&spec_file);
    let out = run_bounded(&mut cmd, limit);
    let failed = |why: String| {
        vec![
            Outcome {
                error: Some(why),
                ..Outcome::default()
            };
            cases.len()
        ]
    };
    if !out.status.success() {
        return failed(format!(
            "{} exited {}: {}",
            client.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(Value::Array(a)) if a.len() == cases.len() => a.iter().map(Outcome::from_json).collect(),
        other => failed(format!(
            "{} printed no results: {other:?} {}",
            client.name(),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

// ---------------------------------------------------------------------------
// weir's log: which path served what

/// Per request path, the data path of each access line in order.
fn paths_from_log(log: &str) -> BTreeMap<String, Vec<DataPath>> {
    let field = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        let rest = &line[at..];
        let v = match rest.strip_prefix('"') {
            Some(q) => q.split('"').next()?,
            None => rest.split_whitespace().next()?,
        };
        Some(v.to_string())
    };
    let mut handed = std::collections::HashSet::new();
    let mut out: BTreeMap<String, Vec<DataPath>> = BTreeMap::new();
    for line in log.lines() {
        if line.contains("to the general path") {
            if let Some(peer) = field(line, "peer") {
                handed.insert(peer);
            }
        } else if line.contains("weir::access") {
            let (Some(path), Some(client)) = (field(line, "path"), field(line, "client")) else {
                continue;
            };
            let p = if handed.contains(&client) {
                DataPath::Hyper
            } else {
                DataPath::Fast
            };
            out.entry(path).or_default().push(p);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The test

struct Tools {
    python: bool,
    nginx: bool,
    curl: bool,
    node: bool,
    h2load: bool,
    py_modules: bool,
}

fn tools() -> Tools {
    let runs = |cmd: &mut Command| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let has_python = python().is_some();
    Tools {
        python: has_python,
        nginx: common::third_party::nginx_bin().is_some(),
        curl: common::third_party::curl().is_some(),
        node: runs(
            Command::new("node").args(["-e", "if (typeof fetch !== 'function') process.exit(1)"]),
        ),
        h2load: runs(Command::new("h2load").arg("--version")),
        py_modules: has_python
            && runs(
                Command::new(python().unwrap())
                    .args(["-c", "import gunicorn, uvicorn, requests, httpx, h2, grpc"]),
            ),
    }
}

/// `N` distinct loopback ports that were free a moment ago (held together
/// while they are picked, so that none comes twice).
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// Starts weir (`$WEIR_BIN`, or the one cargo built) with one upstream
/// (`upstream`: its tables, whose `listen` is added here) on free ports,
/// its log at trace level for the fast path's hand-overs; waits for its
/// listener.
fn start_weir(bin: &Path, dir: &Path, tag: &str, upstream: &str) -> Proc {
    let [port, shared, admin] = free_ports();
    let upstream = upstream.replacen("\n", &format!("\nlisten = \"127.0.0.1:{port}\"\n"), 1);
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{shared}\"\nadmin = \"127.0.0.1:{admin}\"\n\
         access_log = \"all\"\nshutdown_timeout = \"1s\"\n\n{upstream}"
    );
    let config = dir.join(format!("weir-{tag}.toml"));
    std::fs::write(&config, &toml).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info,weir::proxy::fast=trace")
        .env("WEIR_LOG_FORMAT", "text")
        .env_remove("WEIR_CONFIG");
    spawn_on_port("weir", &mut cmd, dir.join(format!("weir-{tag}.log")), port)
}

/// nginx: every request body kept in a file and a record of its framing
/// answered (by proxying to itself); downloads, HEAD and 304 from a static
/// file; 204 from `return`.
fn nginx_block(static_dir: &Path) -> String {
    let d = static_dir.display();
    let record = r#"{"server":"nginx","method":"$http_x_rec_method","path":"$http_x_rec_path","content_length":"$http_x_rec_cl","transfer_encoding":"$http_x_rec_te","expect":"$http_x_rec_expect","idempotency_key":"$http_x_rec_key","body_file":"$http_x_rec_file","seen":1}"#;
    format!(
        "server {{
    listen 127.0.0.1:{{PORT}};
    keepalive_requests 100000;
    client_max_body_size 0;
    client_body_in_file_only on;
    location /echo/ {{
        proxy_pass http://127.0.0.1:{{PORT}}/record/;
        proxy_set_header X-Rec-Method $request_method;
        proxy_set_header X-Rec-Path $uri;
        proxy_set_header X-Rec-CL $http_content_length;
        proxy_set_header X-Rec-TE $http_transfer_encoding;
        proxy_set_header X-Rec-Expect $http_expect;
        proxy_set_header X-Rec-Key $http_idempotency_key;
        proxy_set_header X-Rec-File $request_body_file;
    }}
    location /record/ {{
        default_type application/json;
        return 200 '{record}';
    }}
    location /download/ {{ root {d}; try_files /blob =404; }}
    location /status/304/ {{ root {d}; try_files /blob =404; if_modified_since before; }}
    location /status/204/ {{ return 204; }}
    location /overloaded/ {{
        access_log overloaded.log;
        add_header x-envoy-overloaded true always;
        return 503 'shedding load';
    }}
}}"
    )
}

#[test]
fn interop_matrix() {
    let started = real_now();
    let t = tools();
    let all = t.python && t.nginx && t.curl && t.node && t.py_modules;
    let what = "the interop matrix's peers: nginx-light, curl, node 18+ (http, fetch), and in \
                target/ci-venv (or $WEIR_PYTHON) h2, grpcio, gunicorn, uvicorn, requests, \
                httpx[http2]";
    if !all {
        let missing: Vec<&str> = [
            (!t.python, PYTHON_TOOL),
            (!t.nginx, NGINX_TOOL),
            (!t.curl, CURL_TOOL),
            (!t.node, "node with fetch (apt-get install nodejs)"),
            (
                !t.py_modules,
                "gunicorn uvicorn requests httpx[http2] in the venv",
            ),
        ]
        .iter()
        .filter(|(m, _)| *m)
        .map(|(_, n)| *n)
        .collect();
        eprintln!("missing: {missing:?}");
        if !require(what, false) {
            return;
        }
    }
    // h2load is required as tests/grpc.rs requires it (.ci/run sets
    // WEIR_REQUIRE_H2LOAD once it is installed); without it that part is
    // skipped.
    assert!(
        t.h2load || std::env::var_os("WEIR_REQUIRE_H2LOAD").is_none(),
        "h2load is required here (WEIR_REQUIRE_H2LOAD is set; apt-get install nghttp2-client)"
    );
    if !t.h2load {
        eprintln!("SKIPPED: the h2load runs (apt-get install nghttp2-client)");
    }
    let dir = tempfile::Builder::new()
        .prefix("weir-interop")
        .tempdir()
        .unwrap();
    let d = dir.path().to_path_buf();
    let state = d.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let static_dir = d.join("static");
    std::fs::create_dir_all(&static_dir).unwrap();
    let download = download_body(DOWNLOAD);
    std::fs::write(static_dir.join("blob"), &download).unwrap();
    let download_sha = sha_hex(&download);
    drop(download);

    // The servers, started side by side.
    let py = python().unwrap();
    let servers_dir = server_script("");
    let mut procs: BTreeMap<Server, Proc> = BTreeMap::new();
    {
        let mut cmd = Command::new(&py);
        cmd.arg(server_script("interop_app.py"))
            .args(["--state"])
            .arg(&state);
        procs.insert(
            Server::PyHttp,
            spawn_port_line("http.server", &mut cmd, d.join("pyhttp.log")),
        );
        let mut cmd = Command::new("node");
        cmd.arg(server_script("interop_node.js"));
        procs.insert(
            Server::Node,
            spawn_port_line("node", &mut cmd, d.join("node.log")),
        );
        let port = free_port();
        let mut cmd = Command::new(&py);
        cmd.args(["-m", "gunicorn", "--bind"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--workers", "8", "--worker-class", "sync", "--chdir"])
            .arg(&servers_dir)
            .args(["--log-level", "warning", "interop_app:wsgi_app"])
            .env("INTEROP_STATE", &state);
        procs.insert(
            Server::Gunicorn,
            spawn_on_port("gunicorn", &mut cmd, d.join("gunicorn.log"), port),
        );
        let port = free_port();
        let mut cmd = Command::new(&py);
        cmd.args(["-m", "uvicorn", "--app-dir"])
            .arg(&servers_dir)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--no-access-log",
                "--lifespan",
                "off",
                "--log-level",
                "warning",
                "--timeout-keep-alive",
                "30",
                "interop_app:asgi_app",
            ])
            .env("INTEROP_STATE", &state);
        procs.insert(
            Server::Uvicorn,
            spawn_on_port("uvicorn", &mut cmd, d.join("uvicorn.log"), port),
        );
    }
    let grpc = {
        let mut cmd = Command::new(&py);
        cmd.arg(server_script("interop_grpc.py")).arg("server");
        spawn_port_line("grpcio", &mut cmd, d.join("grpc.log"))
    };
    let ng = nginx(&nginx_block(&static_dir)).unwrap();
    let server_port = |s: Server| match s {
        Server::Nginx => ng.port,
        _ => procs[&s].port,
    };

    // weir: one process per server and variant, each with one dedicated
    // listener (so that a client address in its log names one connection:
    // the kernel reuses a local port towards another destination).
    let bin = std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")));
    let mut weirs: BTreeMap<(Server, Variant), Proc> = BTreeMap::new();
    for s in Server::ALL {
        for v in Variant::ALL {
            let mut upstream = format!(
                "[upstreams.{}]\nurl = \"http://127.0.0.1:{}\"\n\
                 [upstreams.{}.retry]\nmax_replay_body_bytes = {}\n",
                s.key(),
                server_port(s),
                s.key(),
                v.cap()
            );
            if v == Variant::Cap64k {
                upstream += &format!(
                    "[upstreams.{}.hedge]\nafter = \"{HEDGE_AFTER}\"\nmax_extra = 1.0\n",
                    s.key()
                );
            }
            let tag = format!("{}-{}", s.key(), v.name());
            weirs.insert((s, v), start_weir(&bin, &d, &tag, &upstream));
        }
    }
    let grpc_weir = start_weir(
        &bin,
        &d,
        "grpc",
        &format!(
            "[upstreams.grpc]\nurl = \"http://127.0.0.1:{}\"\nprotocol = \"grpc\"\n",
            grpc.port
        ),
    );
    let grpc_weirs = grpc_policies::start(&bin, &d, grpc.port);
    let pushback_weir = start_weir(
        &bin,
        &d,
        "grpc-pushback",
        &format!(
            "[upstreams.grpc]\nurl = \"http://127.0.0.1:{}\"\nprotocol = \"grpc\"\n\
             [upstreams.grpc.retry]\nretry_on = [\"connect-failure\", \"unavailable\"]\n",
            grpc.port
        ),
    );
    // A client stream through `per_try_timeout = "500ms"` (issue 54, item
    // 5): the upload is not counted against it.
    let grpc_upload_weir = start_weir(
        &bin,
        &d,
        "grpc-upload",
        &format!(
            "[upstreams.grpcupload]\nurl = \"http://127.0.0.1:{}\"\nprotocol = \"grpc\"\n\
             per_try_timeout = \"500ms\"\n",
            grpc.port
        ),
    );
    eprintln!(
        "weir {} and its peers up after {:?}",
        bin.display(),
        real_now() - started
    );

    // The cases.
    let mut p = Plan { cases: Vec::new() };
    for s in Server::ALL {
        plan(s, &mut p);
    }
    let cases = p.cases;
    let bodies = Bodies::new(&d, &cases);
    let url = |c: &Case| {
        format!(
            "http://127.0.0.1:{}{}",
            weirs[&(c.server, c.variant)].port,
            c.target()
        )
    };
    let primer = |c: &Case| {
        c.primed.then(|| {
            format!(
                "http://127.0.0.1:{}/echo/primer",
                weirs[&(c.server, c.variant)].port
            )
        })
    };

    // One thread per server (and client script), each running its cases
    // in order.
    let mut results: Vec<(Case, Outcome)> = Vec::new();
    let end = real_now() + BUDGET;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for s in Server::ALL {
            for client in [Client::Curl, Client::Requests, Client::Httpx, Client::Fetch] {
                let mine: Vec<Case> = cases
                    .iter()
                    .filter(|c| c.server == s && c.client == client)
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let (bodies, d) = (&bodies, &d);
                handles.push(scope.spawn(move || {
                    let outcomes: Vec<Outcome> = match client {
                        Client::Curl => mine
                            .iter()
                            .map(|c| run_curl(c, &url(c), bodies, d, end))
                            .collect(),
                        _ => {
                            let batch: Vec<(Case, String, Option<String>)> = mine
                                .iter()
                                .map(|c| (c.clone(), url(c), primer(c)))
                                .collect();
                            let tag = format!("{}-{}", s.key(), client.name());
                            run_script(client, &batch, bodies, d, &tag, end)
                        }
                    };
                    mine.into_iter().zip(outcomes).collect::<Vec<_>>()
                }));
            }
        }
        for h in handles {
            results.extend(h.join().unwrap());
        }
    });

    // gRPC: grpcio to grpcio through weir (the general path, HTTP/2 both ways).
    let mut failures: Vec<(String, String)> = Vec::new();
    let grpc_body = request_body(MIB);
    let grpc_file = d.join("grpc-body");
    std::fs::write(&grpc_file, &grpc_body).unwrap();
    let grpc_sha = sha_hex(&grpc_body);
    for method in ["Digest", "Refuse"] {
        let name = format!(
            "gRPC {method} (1 MiB message) · grpcio · grpcio h2c · grpc (the general path)"
        );
        let mut cmd = Command::new(&py);
        cmd.arg(server_script("interop_grpc.py"))
            .args(["client", "--target"])
            .arg(format!("127.0.0.1:{}", grpc_weir.port))
            .args(["--method", method, "--body"])
            .arg(&grpc_file);
        let out = run_bounded(&mut cmd, Duration::from_secs(40));
        let v: Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(_) => {
                failures.push((
                    name,
                    format!(
                        "the grpcio client printed no result: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ));
                continue;
            }
        };
        let trailing = |k: &str| v["trailing"][k].as_str().unwrap_or("").to_string();
        let problem = match method {
            "Digest" => (v["code"] != "OK"
                || v["response"] != grpc_sha.as_str()
                || trailing("x-body-sha256") != grpc_sha
                || trailing("x-body-len") != MIB.to_string())
            .then(|| format!("expected OK, the digest in the message and in the trailers: {v}")),
            _ => (v["code"] != "FAILED_PRECONDITION"
                || v["details"] != "refused on purpose"
                || trailing("x-why") != "test")
                .then(|| format!("expected the trailers-only FAILED_PRECONDITION with x-why: {v}")),
        };
        if let Some(p) = problem {
            failures.push((name, p));
        }
    }

    failures.extend(grpc_policies::rows(
        &py,
        &grpc_weirs,
        grpc_weir.port,
        grpc.port,
    ));
    failures.extend(grpc_pushback(&py, pushback_weir.port, &d));
    failures.extend(envoy_overloaded(
        weirs[&(Server::Nginx, Variant::Cap1m)].port,
        &ng,
    ));
    // A gRPC client stream, grpcio to grpcio: 10 messages 100 ms apart
    // through `per_try_timeout = "500ms"` end OK after about a second
    // (until issue 54, item 5: DEADLINE_EXCEEDED at ~550 ms), each message
    // counted at the far end.
    {
        let name = "gRPC Upload (10 messages 100 ms apart, per_try_timeout 500ms) · grpcio · \
                    grpcio h2c · grpc (the general path)"
            .to_string();
        let message = d.join("grpc-message");
        std::fs::write(&message, request_body(KIB)).unwrap();
        let mut cmd = Command::new(&py);
        cmd.arg(server_script("interop_grpc.py"))
            .args(["client", "--target"])
            .arg(format!("127.0.0.1:{}", grpc_upload_weir.port))
            .args([
                "--method",
                "Upload",
                "--messages",
                "10",
                "--every-ms",
                "100",
            ])
            .arg("--body")
            .arg(&message);
        let out = run_bounded(&mut cmd, Duration::from_secs(40));
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v) => {
                let ms = v["ms"].as_u64().unwrap_or(0);
                let whole = format!("10 messages, {} bytes", 10 * KIB);
                if v["code"] != "OK"
                    || v["response"] != whole.as_str()
                    || v["trailing"]["x-messages"] != "10"
                    || ms < 900
                {
                    failures.push((
                        name,
                        format!("expected OK after ~1 s with every message: {v}"),
                    ));
                }
            }
            Err(_) => failures.push((
                name,
                format!(
                    "the grpcio client printed no result: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )),
        }
    }

    // h2load: POSTs over h2c, checked by the server itself (`/check`): 1 KiB
    // (held by weir) and 64 KiB + 1 (streamed).
    let n_h2load = 20;
    let mut h2load_paths = Vec::new();
    for s in Server::ALL
        .into_iter()
        .filter(|s| t.h2load && s.has_app_routes())
    {
        for n in [KIB, 64 * KIB + 1] {
            let path = format!("/check/h2load-{}-{n}", s.key());
            let target = format!(
                "http://127.0.0.1:{}{path}?len={n}&sha={}",
                weirs[&(s, Variant::Cap64k)].port,
                bodies.sha[&n]
            );
            let name = format!(
                "{n_h2load} POSTs of {} · {} · h2load h2c · cap64k (the general path)",
                size_name(n),
                s.name()
            );
            let mut cmd = Command::new("h2load");
            cmd.args(["-n", &n_h2load.to_string(), "-c", "2", "-m", "4", "-d"])
                .arg(bodies.file(n))
                .arg(&target);
            let out = run_bounded(&mut cmd, Duration::from_secs(60));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let status_line = text
                .lines()
                .find(|l| l.starts_with("status codes:"))
                .unwrap_or("no status line")
                .to_string();
            if !text.contains(&format!("status codes: {n_h2load} 2xx")) {
                failures.push((
                    name.clone(),
                    format!(
                        "the server found the body's framing or bytes wrong (/check answers 422): {status_line}"
                    ),
                ));
            }
            h2load_paths.push((name, s, path));
        }
    }

    // Stop every weir (SIGTERM: it drains and flushes its log), then read
    // which path served what.
    for w in weirs.values() {
        signal_group(w.child.id(), "TERM");
    }
    let deadline = real_now() + Duration::from_secs(10);
    for w in weirs.values_mut() {
        while w.alive() && real_now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let served: BTreeMap<(Server, Variant), BTreeMap<String, Vec<DataPath>>> = weirs
        .iter()
        .map(|(k, w)| {
            let log = std::fs::read_to_string(&w.log).unwrap_or_default();
            (*k, paths_from_log(&log))
        })
        .collect();

    // The hand-over line is what tells the paths apart: without any, the
    // log's wording has changed and no path can be checked.
    let handed_over = weirs
        .values()
        .any(|w| std::fs::read_to_string(&w.log).is_ok_and(|l| l.contains("to the general path")));
    if !handed_over {
        failures.push((
            "(every case)".to_string(),
            "weir logged no `to the general path` line (weir::proxy::fast at trace): \
             which path served what cannot be checked"
                .to_string(),
        ));
    }
    let mut by_path: BTreeMap<String, usize> = BTreeMap::new();
    let mut counted = [0usize; 2];
    for (c, o) in &results {
        for p in check(c, o, &bodies, &download_sha) {
            failures.push((c.name(), p));
        }
        // The k-th request with this path is this case.
        let path = c.path_only();
        let k = by_path.entry(path.clone()).or_insert(0);
        let expected = c.expected_path();
        counted[(expected == DataPath::Hyper) as usize] += 1;
        let took = served[&(c.server, c.variant)]
            .get(&path)
            .and_then(|v| v.get(*k));
        match took {
            Some(_) if !handed_over => {}
            Some(&took) if took != expected => failures.push((
                c.name(),
                format!(
                    "served by weir's {}, not its {}",
                    took.name(),
                    expected.name()
                ),
            )),
            Some(_) => {}
            None if o.error.is_none() => {
                failures.push((c.name(), "weir logged no access line for it".to_string()))
            }
            None => {}
        }
        *k += 1;
    }
    for (name, s, path) in &h2load_paths {
        if served[&(*s, Variant::Cap64k)]
            .get(path)
            .is_some_and(|v| v.iter().any(|p| *p != DataPath::Hyper))
        {
            failures.push((name.clone(), "a request on the fast path".to_string()));
        }
    }

    let took = real_now() - started;
    eprintln!(
        "interop matrix: {} cases ({} meant for the fast path, {} for hyper's), 3 gRPC calls, 2 pushback rows, {} h2load runs, in {took:?}; {} failures",
        results.len(),
        counted[0],
        counted[1],
        h2load_paths.len(),
        failures.len()
    );
    if !failures.is_empty() {
        failures.sort();
        let mut table = String::from("\n| case | what went wrong |\n|---|---|\n");
        for (name, problem) in &failures {
            table += &format!("| {name} | {problem} |\n");
        }
        let logs: Vec<String> = procs
            .values()
            .chain([&grpc, &grpc_weir, &pushback_weir, &grpc_upload_weir])
            .chain(grpc_weirs.procs())
            .map(|p| format!("--- {} (last lines)\n{}", p.name, p.log_tail()))
            .collect();
        panic!(
            "{} of the interop matrix's checks failed (weir: {}):{table}\n{}\n--- nginx\n{}",
            failures.len(),
            bin.display(),
            logs.join("\n"),
            nginx_logs(&ng)
        );
    }
}

/// One grpcio call through `port` to `method` with `body`, and metadata;
/// the client's JSON line, or why there is none.
fn grpc_call(
    py: &Path,
    port: u16,
    method: &str,
    body: &Path,
    metadata: &[&str],
) -> Result<Value, String> {
    let mut cmd = Command::new(py);
    cmd.arg(server_script("interop_grpc.py"))
        .args(["client", "--target"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--method", method, "--body"])
        .arg(body);
    for m in metadata {
        cmd.args(["--metadata", m]);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(40));
    serde_json::from_slice(&out.stdout).map_err(|_| {
        format!(
            "the grpcio client printed no result: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// gRPC's pushback, grpcio on both ends (tests/servers/interop_grpc.py's
/// `Pushback`, first call UNAVAILABLE with `grpc-retry-pushback-ms`, and
/// `Count`), through `port`: a weir that retries `unavailable`. Each call
/// carries an `idempotency-key`, which makes it retryable.
fn grpc_pushback(py: &Path, port: u16, dir: &Path) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for value in ["-1", "2000"] {
        let name = format!(
            "gRPC UNAVAILABLE with grpc-retry-pushback-ms: {value} · grpcio · grpcio h2c · grpc (the general path)"
        );
        let body = dir.join(format!("pushback{value}"));
        std::fs::write(&body, value).unwrap();
        let key = format!("idempotency-key=pushback{value}");
        let called = grpc_call(py, port, "Pushback", &body, &[&key]).and_then(|v| {
            let counted = grpc_call(py, port, "Count", &body, &["idempotency-key=count"])?;
            Ok((v, counted))
        });
        let (v, counted) = match called {
            Ok(r) => r,
            Err(e) => {
                failures.push((name, e));
                continue;
            }
        };
        let calls = |v: &Value| -> Value {
            serde_json::from_str(v["response"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
        };
        let problem = if value == "-1" {
            // Not retried: the client hears the UNAVAILABLE, the server saw one call.
            (v["code"] != "UNAVAILABLE"
                || v["trailing"]["x-weir-retry-stop"] != "pushback"
                || calls(&counted)["calls"] != 1)
                .then(|| format!("expected UNAVAILABLE after 1 call, x-weir-retry-stop: pushback: {v}; count {counted}"))
        } else {
            // Retried once, 2 s after the first call at the earliest.
            let second = calls(&v);
            (v["code"] != "OK"
                || second["calls"] != 2
                || second["gap_ms"].as_u64().is_none_or(|ms| ms < 2000))
            .then(|| format!("expected OK on a retry ≥ 2000 ms after the first call: {v}"))
        };
        if let Some(p) = problem {
            failures.push((name, p));
        }
    }
    failures
}

/// nginx answers `/overloaded/` 503 with `x-envoy-overloaded: true`: weir
/// (at `port`, an nginx listener without hedging) makes one attempt and
/// passes it back with `x-weir-retry-stop: pushback`, from curl over
/// HTTP/1.1 (the fast path) and h2c (the general path). nginx's access log
/// for that location counts the attempts.
fn envoy_overloaded(port: u16, ng: &common::third_party::Child) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for h2 in [false, true] {
        let (conn, path) = if h2 {
            ("h2c", "the general path")
        } else {
            ("h1", "fast path")
        };
        let name =
            format!("GET answered 503 x-envoy-overloaded · nginx · curl {conn} · cap1m ({path})");
        let target = format!("/overloaded/{conn}");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "30", "-o", "/dev/null", "-D", "-"]);
        if h2 {
            cmd.arg("--http2-prior-knowledge");
        }
        cmd.arg(format!("http://127.0.0.1:{port}{target}"));
        let out = run_bounded(&mut cmd, Duration::from_secs(35));
        let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        let has = |field: &str| head.lines().any(|l| l.trim_end() == field);
        let log = ng
            .dir()
            .and_then(|d| std::fs::read_to_string(d.join("overloaded.log")).ok())
            .unwrap_or_default();
        let seen = log.lines().filter(|l| l.contains(&target)).count();
        let fine = head.contains(" 503")
            && has("x-weir-attempts: 1")
            && has("x-weir-retry-stop: pushback")
            && has("x-envoy-overloaded: true")
            && seen == 1;
        if !fine {
            failures.push((
                name,
                format!("expected one attempt (nginx saw {seen}), 503 with x-weir-retry-stop: pushback: {head}"),
            ));
        }
    }
    failures
}
