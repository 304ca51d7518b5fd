//! Shared test harness: real hyper upstreams on 127.0.0.1:0, weir started
//! in-process from the library, and a plain hyper client. Everything a test
//! starts stops when its handle is dropped.
// unreachable_pub: these helpers are `pub` for the test files that include
// this module with `mod common;`; no other crate sees them.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use weir::config::Config;
use weir::proxy::{Proxy, ProxyHandle};

pub mod fixtures;
pub mod redis_server;
pub mod third_party;

/// Tests that load the machine (the chaos scenarios, the fleet's and the
/// replicas' load runs) take this, so that no two of them run at once in
/// the test binary: each was written to have the machine's two cores.
pub async fn one_heavy_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

pub type TestBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub fn body(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

/// A real HTTP/1.1 + h2c upstream running a handler; counts what it receives.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestUpstream {
    pub async fn start<F, Fut>(handler: F) -> TestUpstream
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<TestBody>> + Send + 'static,
    {
        TestUpstream::start_at("127.0.0.1:0", handler).await
    }

    /// Like [`TestUpstream::start`], listening on `addr` (a replica on
    /// 127.0.0.2, 127.0.0.3, …: all of 127/8 is loopback).
    pub async fn start_at<F, Fut>(addr: &str, handler: F) -> TestUpstream
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let handler = Arc::new(handler);
        let (c, r) = (connections.clone(), requests.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                c.fetch_add(1, Ordering::SeqCst);
                // As real servers do: without it, an h2c answer's HEADERS
                // and DATA frames can meet the peer's delayed ACK (40 ms).
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        r.fetch_add(1, Ordering::SeqCst);
                        let fut = handler(req);
                        async move { Ok::<_, Infallible>(fut.await) }
                    });
                    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    b.http1().timer(TokioTimer::new());
                    let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        TestUpstream {
            addr,
            connections,
            requests,
            task,
        }
    }

    /// An upstream that answers 200 with `text`.
    pub async fn text(text: &'static str) -> TestUpstream {
        TestUpstream::start(move |_req| async move { Response::new(body(text)) }).await
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Which of weir's two HTTP/1.1 data paths serves plain-TCP client
/// connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// As in production: a plain-TCP HTTP/1.1 connection starts on the fast
    /// path (`proxy::fast`), which hands a request it does not take (chunked,
    /// upgrade, gRPC, HTTP/2, a malformed head…) to the general path.
    Fast,
    /// Every connection on the general path (hyper, `proxy::general`):
    /// `server.fast_path = false`.
    General,
}

/// Runs an `async fn NAME(path: DataPath)` test body on both data paths: it
/// expands to `mod NAME` holding two tests, `NAME::fast` and `NAME::general`,
/// each with the given test attribute (`#[tokio::test]`, with whatever
/// arguments). An extra attribute for one variant only (an `#[ignore]` for a
/// known difference between the paths) goes after `fast:` or `general:`.
///
/// ```ignore
/// both_paths!(#[tokio::test(start_paused = true)] a_503_is_retried);
/// async fn a_503_is_retried(path: DataPath) {
///     let weir = Weir::single_on(path, &up.url(), "").await;
///     // …
/// }
///
/// both_paths!(#[tokio::test] name, general: #[ignore = "path difference: …"]);
/// ```
#[allow(unused_macros)] // not every suite runs on both paths
macro_rules! both_paths {
    (#[$test:meta] $name:ident $(, fast: #[$fast:meta])? $(, general: #[$general:meta])? $(,)?) => {
        mod $name {
            #[$test]
            $(#[$fast])?
            async fn fast() {
                super::$name($crate::common::DataPath::Fast).await
            }

            #[$test]
            $(#[$general])?
            async fn general() {
                super::$name($crate::common::DataPath::General).await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_paths;

/// Writes `bytes` to `addr` at once and reads until the peer closes.
pub async fn exchange_raw(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// weir, started in-process on 127.0.0.1:0.
pub struct Weir {
    pub handle: Option<ProxyHandle>,
    pub addr: SocketAddr,
}

impl Weir {
    /// `toml` is a full config; `[server] listen` is forced to 127.0.0.1:0.
    pub async fn start(toml: &str) -> Weir {
        Weir::start_on(DataPath::Fast, toml).await
    }

    /// Like [`Weir::start`], on `path`.
    pub async fn start_on(path: DataPath, toml: &str) -> Weir {
        Weir::with_server_on(path, "", toml).await
    }

    /// Like [`Weir::start`], with extra `[server]` fields.
    pub async fn with_server(server: &str, toml: &str) -> Weir {
        Weir::with_server_on(DataPath::Fast, server, toml).await
    }

    /// Like [`Weir::with_server`], on `path`.
    pub async fn with_server_on(path: DataPath, server: &str, toml: &str) -> Weir {
        let src = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n{server}\n{toml}"
        );
        let mut config = match Config::parse(Path::new("test.toml"), &src) {
            Ok(c) => c,
            Err(e) => panic!("test config invalid:\n{e}\n---\n{src}"),
        };
        config.server.fast_path = path == DataPath::Fast;
        let handle = Proxy::start(config).await.unwrap();
        let addr = handle.listen_addr();
        Weir {
            handle: Some(handle),
            addr,
        }
    }

    /// One upstream named `svc` reached with `Host: svc`, plus extra TOML for it.
    pub async fn single(url: &str, extra: &str) -> Weir {
        Weir::single_on(DataPath::Fast, url, extra).await
    }

    /// Like [`Weir::single`], on `path`.
    pub async fn single_on(path: DataPath, url: &str, extra: &str) -> Weir {
        Weir::start_on(
            path,
            &format!("[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n{extra}\n"),
        )
        .await
    }

    /// One upstream `svc` (reached with `Host: svc`) over the replicas
    /// `addrs` as its `endpoints`, speaking h2c (`h2c`) or HTTP/1.1 to them,
    /// on `path`, plus `extra` TOML after its table.
    pub async fn over(path: DataPath, h2c: bool, addrs: &[SocketAddr], extra: &str) -> Weir {
        let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
        let protocol = if h2c { "h2c" } else { "http1" };
        Weir::start_on(
            path,
            &format!(
                "[upstreams.svc]\nurl = \"http://svc.internal\"\nhosts = [\"svc\"]\n\
                 protocol = \"{protocol}\"\nendpoints = [{}]\n{extra}\n",
                list.join(", ")
            ),
        )
        .await
    }

    pub fn dedicated(&self, name: &str) -> SocketAddr {
        self.handle.as_ref().unwrap().upstream_addrs()[name]
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop_accepting();
        }
    }
}

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    TestBody,
>;

pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2_client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// GET `url` with `Host: host`.
pub async fn get(c: &Client, url: &str, host: &str) -> Response<Incoming> {
    let req = Request::get(url)
        .header("host", host)
        .body(body(""))
        .unwrap();
    c.request(req).await.unwrap()
}

pub async fn read_body(resp: Response<Incoming>) -> (http::response::Parts, Bytes) {
    let (parts, b) = resp.into_parts();
    (parts, b.collect().await.unwrap().to_bytes())
}

pub async fn json_error(resp: Response<Incoming>) -> (u16, String, serde_json::Value) {
    let (parts, b) = read_body(resp).await;
    let code = parts
        .headers
        .get("x-weir-error")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null);
    (parts.status.as_u16(), code, v)
}

/// A loopback port with nothing listening on it.
pub async fn refused_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Sends one request over a fresh HTTP/2 prior-knowledge connection to `addr`,
/// with the request's own URI (and so its `:authority`) untouched.
pub async fn h2_request(addr: SocketAddr, req: Request<TestBody>) -> Response<Incoming> {
    let (mut send, _conn) = h2_connect(addr).await;
    send.send_request(req).await.unwrap()
}

/// One HTTP/2 prior-knowledge connection to `addr`, for several requests;
/// the handle drives it (abort it, or watch it end).
pub async fn h2_connect(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<TestBody>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    (send, tokio::spawn(conn))
}

/// A raw TCP upstream for misbehaviour hyper will not produce: resets,
/// half-written responses. `handler(n, stream)` serves the n-th connection (0-based).
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    pub async fn start<F, Fut>(handler: F) -> RawUpstream
    where
        F: Fn(usize, tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        RawUpstream::on(listener, handler)
    }

    pub fn on<F, Fut>(listener: TcpListener, handler: F) -> RawUpstream
    where
        F: Fn(usize, tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let c = connections.clone();
        let handler = Arc::new(handler);
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let n = c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(handler(n, s));
            }
        });
        RawUpstream {
            addr,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads one request head (and discards it); false when the connection
/// ended first.
pub async fn read_head(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    true
}

/// Closes with a TCP reset.
#[allow(deprecated)] // linger 0 never blocks: it is the RST itself
pub fn reset(s: tokio::net::TcpStream) {
    let _ = s.set_linger(Some(std::time::Duration::ZERO));
    drop(s);
}

/// Writes a minimal complete response.
pub async fn respond(s: &mut tokio::net::TcpStream, status: u16, extra: &str, body: &str) {
    use tokio::io::AsyncWriteExt;
    let r = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    );
    let _ = s.write_all(r.as_bytes()).await;
}

/// The value of a response header, or "".
pub fn header(parts: &http::response::Parts, name: &str) -> String {
    parts
        .headers
        .get(name)
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Everything logged (at `info` and above) while [`Captured::install`]'s
/// guard lives, as text. The subscriber is the current thread's: run the
/// test on a `current_thread` runtime so that weir's tasks log into it.
#[derive(Clone, Default)]
pub struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// One capture for the whole test binary, as its global subscriber:
    /// it sees events whatever thread they come from. A thread's own
    /// ([`Captured::install`]) can miss them when other tests run beside it
    /// (tracing caches a call site's interest across threads), so a test
    /// whose lines come from weir's tasks uses this one and picks its own
    /// lines out (by client address, or a path only it requests).
    #[allow(dead_code)] // not every suite reads the logs
    pub fn global() -> &'static Captured {
        static LOGS: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Captured::default();
            let sink = logs.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(move || sink.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish();
            let _ = tracing::subscriber::set_global_default(subscriber);
            logs
        })
    }

    /// The lines of `target` (`weir::access`, `weir::state::fleet`).
    pub fn lines_of(&self, target: &str) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| l.contains(target))
            .map(str::to_string)
            .collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Lines this test adds to `/etc/hosts` for one name, removed on drop (also
/// when the test fails).
pub struct HostsLines {
    name: String,
}

impl HostsLines {
    /// `None` when `/etc/hosts` cannot be written (not root).
    pub fn new(name: &str) -> Option<HostsLines> {
        let h = HostsLines {
            name: name.to_string(),
        };
        h.set(&[]).ok()?;
        Some(h)
    }

    /// Makes `ips` the name's addresses.
    pub fn set(&self, ips: &[&str]) -> std::io::Result<()> {
        // Tests run as processes of their own: one edit at a time.
        let _lock = HostsLock::take();
        let text = std::fs::read_to_string("/etc/hosts")?;
        let mut out: Vec<String> = text
            .lines()
            .filter(|l| !l.split_whitespace().any(|w| w == self.name))
            .map(String::from)
            .collect();
        out.extend(ips.iter().map(|ip| format!("{ip} {}", self.name)));
        std::fs::write("/etc/hosts", out.join("\n") + "\n")
    }
}

impl Drop for HostsLines {
    fn drop(&mut self) {
        let _ = self.set(&[]);
    }
}

/// Serialises edits of `/etc/hosts` across test processes: a lock file
/// made with `create_new`, removed on drop (one older than 5 s is left
/// over from a crash, and taken over).
struct HostsLock;

impl HostsLock {
    const PATH: &'static str = "/tmp/weir-tests-etc-hosts.lock";

    fn take() -> HostsLock {
        for _ in 0..500 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(Self::PATH)
            {
                Ok(_) => return HostsLock,
                Err(_) => {
                    let stale = std::fs::metadata(Self::PATH)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > std::time::Duration::from_secs(5));
                    if stale {
                        let _ = std::fs::remove_file(Self::PATH);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
        HostsLock
    }
}

impl Drop for HostsLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(Self::PATH);
    }
}

/// An h2c upstream that answers every request `status` with `body` and a
/// `Content-Length`, and ends the stream `late` after the body, on a frame
/// of its own (as a server streaming its response does): the body is whole
/// by its length before the stream says it ended.
pub struct LateEnd {
    pub url: String,
    served: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for LateEnd {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LateEnd {
    pub async fn start(status: u16, text: &'static str, late: std::time::Duration) -> LateEnd {
        type Chunk = Result<http_body::Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let n = served.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = n.clone();
                let svc = service_fn(move |req: Request<Incoming>| {
                    let n = n.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        n.fetch_add(1, Ordering::SeqCst);
                        let frames = futures_util::stream::unfold(true, move |first| async move {
                            if first {
                                let data =
                                    http_body::Frame::data(Bytes::from_static(text.as_bytes()));
                                return Some((Ok(data), false));
                            }
                            tokio::time::sleep(late).await;
                            None
                        });
                        let frames: std::pin::Pin<
                            Box<dyn futures_util::Stream<Item = Chunk> + Send + Sync>,
                        > = Box::pin(frames);
                        let resp = Response::builder()
                            .status(status)
                            .header("content-length", text.len())
                            .body(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                tokio::spawn(async move {
                    let b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        LateEnd { url, served, task }
    }

    /// Requests answered.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}
