//! Upstreams on Unix-domain sockets (docs/reference/endpoints.md#addresses):
//! `url = "unix:/path"` reached on both data paths, over HTTP/1.1 and h2c,
//! pooled like TCP, against servers nobody here wrote — Python's
//! `http.server` on a `socketserver.UnixStreamServer`
//! (tests/servers/unix_app.py) and gunicorn `--bind unix:` with the interop
//! app — driven by curl; an h2c server (hyper's) on a socket for HTTP/2;
//! a socket with nobody listening; and the config's checks.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::third_party::*;
use common::*;
use http_body_util::BodyExt;
use hyper::Response;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir::config::Config;

/// Waits (10 s at most) until something accepts on the socket at `path`.
fn wait_for_socket(path: &Path) -> bool {
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// curl through weir's listener at `addr` to `svc`: (status, body).
fn curl_to(addr: std::net::SocketAddr, args: &[&str], path: &str) -> (u16, String) {
    let curl = curl().unwrap();
    let out = run_bounded(
        Command::new(curl)
            .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-H", "host: svc"])
            .args(args)
            .arg(format!("http://{addr}{path}")),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn sha_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn field<'a>(record: &'a str, name: &str) -> &'a str {
    let key = format!("\"{name}\": ");
    let at = record
        .find(&key)
        .map(|i| i + key.len())
        .unwrap_or(record.len());
    let rest = &record[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim_matches('"')
}

fn metrics_of(w: &Weir) -> String {
    w.handle.as_ref().unwrap().metrics().render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_server_on_a_socket_on_both_paths() {
    if !require(PYTHON_TOOL, python().is_some()) || !require(CURL_TOOL, curl().is_some()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("app.sock");
    let _app = py_server("unix_app.py", &[sock.to_str().unwrap()]).unwrap();
    assert!(tokio::task::spawn_blocking({
        let s = sock.clone();
        move || wait_for_socket(&s)
    })
    .await
    .unwrap());
    let url = format!("unix:{}", sock.display());
    for path in [DataPath::Fast, DataPath::General] {
        let w = Weir::single_on(path, &url, "").await;
        let addr = w.addr;
        let body: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let file = dir.path().join("body");
        std::fs::write(&file, &body).unwrap();
        let sha = sha_hex(&body);
        let (get1, get2, post, h2) = tokio::task::spawn_blocking(move || {
            // Two GETs on one curl connection, then a POST, then HTTP/2
            // from the client (the general path either way).
            let two = curl_to(
                addr,
                &["--next", "-H", "host: svc", &format!("http://{addr}/b")],
                "/a",
            );
            let post = curl_to(
                addr,
                &["--data-binary", &format!("@{}", file.display())],
                "/upload",
            );
            let h2 = curl_to(addr, &["--http2-prior-knowledge"], "/h2");
            (two.clone(), two, post, h2)
        })
        .await
        .unwrap();
        let _ = get2;
        assert_eq!(get1.0, 200, "{path:?}: {get1:?}");
        // The Host a socket upstream is sent: the documented default.
        assert!(
            get1.1.contains("\"host\": \"localhost\""),
            "{path:?}: {}",
            get1.1
        );
        assert!(get1.1.contains("\"path\": \"/a\""), "{}", get1.1);
        assert!(get1.1.contains("\"path\": \"/b\""), "{}", get1.1);
        // The second request went on the pooled connection.
        assert!(
            get1.1.contains("\"on_connection\": 2"),
            "{path:?} not pooled: {}",
            get1.1
        );
        assert_eq!(post.0, 200, "{post:?}");
        assert_eq!(field(&post.1, "sha256"), sha, "{}", post.1);
        assert_eq!(field(&post.1, "body_len"), "50000");
        assert_eq!(h2.0, 200, "{h2:?}");
        assert_eq!(field(&h2.1, "method"), "GET");
        // The endpoint label names the socket.
        let m = metrics_of(&w);
        assert!(
            m.contains(&format!("endpoint=\"unix:{}\"", sock.display())),
            "{path:?}: no endpoint series for the socket"
        );
    }

    // `authority` sets the Host a socket upstream is sent.
    let w = Weir::single(&url, "authority = \"app.internal:8080\"").await;
    let addr = w.addr;
    let (status, record) = tokio::task::spawn_blocking(move || curl_to(addr, &[], "/named"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(field(&record, "host"), "app.internal:8080", "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gunicorn_bound_to_a_socket() {
    let has = |m: &str| {
        python().is_some_and(|py| {
            Command::new(py)
                .args(["-c", &format!("import {m}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    };
    if !require(
        "gunicorn in the venv (.ci/run installs it)",
        has("gunicorn"),
    ) || !require(CURL_TOOL, curl().is_some())
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("gunicorn.sock");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mut g = Command::new(python().unwrap())
        .args(["-m", "gunicorn", "--bind"])
        .arg(format!("unix:{}", sock.display()))
        .args(["--workers", "1", "--chdir"])
        .arg(manifest_dir().join("tests/servers"))
        .arg("interop_app:wsgi_app")
        .env("INTEROP_STATE", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = tokio::task::spawn_blocking({
        let s = sock.clone();
        move || wait_for_socket(&s)
    })
    .await
    .unwrap();
    if !up {
        let _ = g.kill();
        let _ = g.wait();
        panic!("gunicorn never listened on {}", sock.display());
    }
    let w = Weir::single(&format!("unix:{}", sock.display()), "").await;
    let addr = w.addr;
    let body = "x".repeat(10_000);
    let sha = sha_hex(body.as_bytes());
    let (check, h2) = tokio::task::spawn_blocking(move || {
        let check = curl_to(
            addr,
            &["--data-binary", &body],
            &format!("/check/unix?len=10000&sha={sha}"),
        );
        let h2 = curl_to(addr, &["--http2-prior-knowledge"], "/echo/unix-h2");
        (check, h2)
    })
    .await
    .unwrap();
    let _ = g.kill();
    let _ = g.wait();
    assert_eq!(check.0, 200, "{check:?}");
    assert_eq!(h2.0, 200, "{h2:?}");
    assert!(
        h2.1.contains("gunicorn") || h2.1.contains("\"method\""),
        "{}",
        h2.1
    );
}

/// An h2c server on a socket: hyper's, in this process.
async fn h2c_on_socket(path: &Path) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let what = format!(
                        "{:?} {} {}",
                        req.version(),
                        req.uri()
                            .authority()
                            .map(|a| a.to_string())
                            .unwrap_or_default(),
                        req.uri().path()
                    );
                    Ok::<_, std::convert::Infallible>(Response::new(body(what)))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (task, conns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_over_a_socket_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h2.sock");
    let (server, conns) = h2c_on_socket(&sock).await;
    let url = format!("unix:{}", sock.display());
    for (path, c) in [(DataPath::Fast, client()), (DataPath::General, h2_client())] {
        // A dedicated listener: an HTTP/2 client names its own authority.
        let extra = "protocol = \"h2c\"\nlisten = \"127.0.0.1:0\"";
        let w = Weir::single_on(path, &url, extra).await;
        let at = w.dedicated("svc");
        for i in 0..5 {
            let resp = get(&c, &format!("http://{at}/n{i}"), "svc").await;
            assert_eq!(resp.status(), 200, "{path:?}");
            let b = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                String::from_utf8_lossy(&b),
                format!("HTTP/2.0 localhost /n{i}"),
                "{path:?}"
            );
        }
    }
    // One HTTP/2 connection per weir, its streams multiplexed.
    assert_eq!(conns.load(Ordering::SeqCst), 2);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_nobody_listens_on_fails_fast_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing: PathBuf = dir.path().join("gone.sock");
    // A file that is no socket, and a path with no file at all.
    let not_a_socket = dir.path().join("plain");
    std::fs::write(&not_a_socket, b"").unwrap();
    for sock in [missing, not_a_socket] {
        for path in [DataPath::Fast, DataPath::General] {
            let w = Weir::single_on(
                path,
                &format!("unix:{}", sock.display()),
                "[upstreams.svc.retry]\nmax_attempts = 1\n",
            )
            .await;
            let started = tokio::time::Instant::now();
            let resp = tokio::time::timeout(
                Duration::from_secs(5),
                get(&client(), &format!("http://{}/", w.addr), "svc"),
            )
            .await
            .expect("a dead socket never hangs a request");
            assert_eq!(resp.status(), 502, "{path:?} {}", sock.display());
            assert!(started.elapsed() < Duration::from_secs(2));
            let reason = resp
                .headers()
                .get("x-weir-error")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            assert!(!reason.is_empty(), "no reason given");
        }
    }
}

#[test]
fn socket_urls_are_checked() {
    let parse = |up: &str| {
        let src = format!("[upstreams.svc]\n{up}\nhosts = [\"svc\"]\n");
        Config::parse(Path::new("unix.toml"), &src).map(|_| ())
    };
    assert!(parse("url = \"unix:/run/app.sock\"").is_ok());
    assert!(parse("url = \"unix:/run/app.sock\"\nauthority = \"app.internal\"").is_ok());
    assert!(parse(
        "url = \"http://x.internal\"\nendpoints = [\"unix:/run/a.sock\", \"10.0.0.1:80\"]"
    )
    .is_ok());
    for (up, names) in [
        ("url = \"unix:run/app.sock\"", "upstreams.svc.url"),
        ("url = \"unix:/run/\"", "upstreams.svc.url"),
        (
            "url = \"http://10.0.0.1\"\nauthority = \"x\"",
            "upstreams.svc.authority",
        ),
        (
            "url = \"unix:/run/app.sock\"\nauthority = \"a b\"",
            "upstreams.svc.authority",
        ),
        (
            "url = \"unix:/run/app.sock\"\ntunnel = true",
            "upstreams.svc.tunnel",
        ),
        (
            "url = \"http://x\"\nendpoints = [\"unix:app.sock\"]",
            "upstreams.svc.endpoints",
        ),
    ] {
        let e = parse(up).expect_err(up).to_string();
        assert!(e.contains(names), "{up}: {e}");
        assert!(e.contains("unix.toml"), "{e}");
    }
}

/// weir started from `server` (its `[server]` lines) and one upstream `svc`
/// at `url`, as `weir run` starts it (admin listener included).
async fn runtime(server: &str, url: &str) -> Result<weir::runtime::Runtime, String> {
    let src =
        format!("[server]\n{server}\n\n[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n");
    let config = Config::parse(Path::new("unix-listen.toml"), &src).map_err(|e| e.to_string())?;
    let opts = weir::runtime::Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    weir::runtime::Runtime::start(config, opts)
        .await
        .map_err(|e| e.to_string())
}

/// curl with `--unix-socket sock`: (status, body).
fn curl_unix(sock: &Path, args: &[&str], url: &str) -> (u16, String) {
    let out = run_bounded(
        Command::new(curl().unwrap())
            .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(sock)
            .args(args)
            .arg(url),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_nginx_reach_weir_listening_on_a_socket() {
    use std::os::unix::fs::PermissionsExt;
    if !require(CURL_TOOL, curl().is_some()) {
        return;
    }
    let up = TestUpstream::start(|req| async move {
        let host = req
            .headers()
            .get("host")
            .map(|h| h.to_str().unwrap_or("").to_string())
            .unwrap_or_default();
        Response::new(body(format!("{} {host}", req.uri().path())))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("weir.sock");
    let admin = dir.path().join("admin.sock");
    let server = format!(
        "listen = \"unix:{}\"\nadmin = \"unix:{}\"\nsocket_mode = \"0600\"",
        sock.display(),
        admin.display()
    );
    let rt = runtime(&server, &up.url()).await.unwrap();
    for f in [&sock, &admin] {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
    let (s, a) = (sock.clone(), admin.clone());
    let (h1, h2, health) = tokio::task::spawn_blocking(move || {
        (
            curl_unix(&s, &[], "http://svc/one"),
            curl_unix(&s, &["--http2-prior-knowledge"], "http://svc/two"),
            curl_unix(&a, &[], "http://localhost/healthz"),
        )
    })
    .await
    .unwrap();
    // Routed by `Host: svc`; the upstream is sent its own authority.
    let at = up.addr;
    assert_eq!(h1, (200, format!("/one {at}")));
    assert_eq!(h2, (200, format!("/two {at}")));
    assert_eq!(health.0, 200, "{health:?}");

    // nginx in front, proxying to weir's socket.
    if require(NGINX_TOOL, nginx_bin().is_some()) {
        let block = format!(
            "server {{ listen 127.0.0.1:{{PORT}}; location / {{ proxy_pass http://unix:{}:; proxy_set_header Host svc; }} }}",
            sock.display()
        );
        let ngx = nginx(&block).unwrap();
        let port = ngx.port;
        let via = tokio::task::spawn_blocking(move || {
            let out = run_bounded(
                Command::new(curl().unwrap())
                    .args(["-s", "-w", "\n%{http_code}"])
                    .arg(format!("http://127.0.0.1:{port}/via-nginx")),
                Duration::from_secs(20),
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .await
        .unwrap();
        assert_eq!(via, format!("/via-nginx {at}\n200"));
    }

    // A clean shutdown removes both socket files.
    rt.shutdown(Duration::from_secs(2)).await;
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while (sock.exists() || admin.exists()) && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!sock.exists(), "the listener's socket file is left");
    assert!(!admin.exists(), "the admin socket file is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_is_replaced_and_a_live_one_or_a_file_refused() {
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let listen = |p: &Path| format!("listen = \"unix:{}\"\nadmin = \"127.0.0.1:0\"", p.display());

    // A socket left by a process that is gone: replaced.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let rt = runtime(&listen(&stale), &up.url()).await.unwrap();
    let s = stale.clone();
    let got = tokio::task::spawn_blocking(move || {
        let mut c = std::os::unix::net::UnixStream::connect(&s).unwrap();
        use std::io::{Read, Write};
        c.write_all(b"GET / HTTP/1.1\r\nhost: svc\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    rt.shutdown(Duration::from_secs(1)).await;

    // A socket another process answers on: refused, and left alone.
    let live = dir.path().join("live.sock");
    let holder = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let e = runtime(&listen(&live), &up.url()).await.unwrap_err();
    assert!(e.contains("already in use by another process"), "{e}");
    assert!(live.exists());
    drop(holder);

    // A file that is no socket: refused, and not removed.
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"keep me").unwrap();
    let e = runtime(&listen(&plain), &up.url()).await.unwrap_err();
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
}

#[test]
fn socket_listeners_are_checked() {
    let parse = |server: &str| {
        let src = format!(
            "[server]\n{server}\n[upstreams.svc]\nurl = \"http://10.0.0.1\"\nhosts = [\"svc\"]\n"
        );
        Config::parse(Path::new("unix.toml"), &src).map(|_| ())
    };
    assert!(parse("listen = \"unix:/run/weir.sock\"\nsocket_mode = \"0666\"").is_ok());
    for (server, field) in [
        ("listen = \"unix:weir.sock\"", "server.listen"),
        ("admin = \"unix:/run/\"", "server.admin"),
        ("socket_mode = \"0999\"", "server.socket_mode"),
        ("socket_mode = \"1777\"", "server.socket_mode"),
        (
            "listen = \"unix:/run/weir.sock\"\ntls = { cert = \"/c\", key = \"/k\" }",
            "server.tls",
        ),
        (
            "listen = \"unix:/run/a.sock\"\nadmin = \"unix:/run/a.sock\"",
            "server.admin",
        ),
    ] {
        let e = parse(server).expect_err(server).to_string();
        assert!(e.contains(field), "{server}: {e}");
    }
}
