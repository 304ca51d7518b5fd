//! Graceful shutdown of the real binary: requests in flight at SIGTERM finish,
//! new connections are refused, the process exits 0 within shutdown_timeout.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::Response;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits_0() {
    let up = TestUpstream::start(|_r| async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Response::new(body("finished"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nshutdown_timeout = \"10s\"\n[upstreams.slow]\nurl = \"{}\"\nhosts = [\"slow\"]\n",
            up.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(&path)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The startup line names the bound address.
    let listen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let line = rx.recv().await.expect("weir exited before serving");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "weir is serving" {
                return v["listen"].as_str().unwrap().to_string();
            }
        }
    })
    .await
    .expect("weir did not start");

    let mut calls = Vec::new();
    for _ in 0..20 {
        let url = format!("http://{listen}/");
        calls.push(tokio::spawn(async move {
            let c = client();
            let (parts, b) = read_body(get(&c, &url, "slow").await).await;
            (parts.status.as_u16(), b)
        }));
    }
    // Wait until all 20 are in flight at the upstream.
    for _ in 0..100 {
        if up.requests() == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(up.requests(), 20);
    let signalled = tokio::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tokio::net::TcpStream::connect(&listen).await.is_err(),
        "a new connection was accepted after SIGTERM"
    );
    for c in calls {
        let (status, b) = c.await.unwrap();
        assert_eq!((status, &b[..]), (200, &b"finished"[..]));
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(10));
}

/// An application's pool of 8 keep-alive connections (Python's
/// `http.client`, one request every 20 ms, round robin), 4 s, across a
/// SIGTERM of weir at 1 s and a second weir started on the same port as
/// soon as the first stops listening: no request fails, apart from those
/// refused while no weir listened. The draining weir answers each pooled
/// connection's next request with `Connection: close` and closes it after,
/// instead of closing idle connections under the app
/// (docs/reference/shutdown.md#shutdown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_pooled_connections_survive_a_restart() {
    let python = common::third_party::python()
        .or_else(|| Some(std::path::PathBuf::from("python3")))
        .filter(|p| {
            Command::new(p)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    let Some(python) = python else {
        assert!(
            std::env::var_os("WEIR_REQUIRE_THIRD_PARTY").is_none(),
            "python3 is required here"
        );
        eprintln!("SKIPPED: python3 is not available");
        return;
    };
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::third_party::free_port();
    let config = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin = \"127.0.0.1:0\"\nshutdown_timeout = \"10s\"\n[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
                up.url()
            ),
        )
        .unwrap();
        path
    };
    let start = |path: std::path::PathBuf| {
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["--log-level", "warn", "run", "--config"])
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let listening = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let mut a = start(config("a.toml"));
    for _ in 0..200 {
        if listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(listening(), "the first weir did not start");

    const APP: &str = r#"
import http.client, json, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
pool = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _ in range(8)]
seen = {"ok": 0, "refused": 0, "failed": 0, "errors": {}}
start, i = time.time(), 0
while time.time() - start < seconds:
    c = pool[i % 8]
    i += 1
    try:
        c.request("GET", "/", headers={"Host": "svc"})
        r = c.getresponse()
        r.read()
        seen["ok" if r.status == 200 else "failed"] += 1
    except ConnectionRefusedError:
        seen["refused"] += 1
        c.close()
    except Exception as e:
        seen["failed"] += 1
        name = type(e).__name__
        seen["errors"][name] = seen["errors"].get(name, 0) + 1
        c.close()
    time.sleep(0.02)
print(json.dumps(seen))
"#;
    let app = Command::new(&python)
        .args(["-c", APP, &port.to_string(), "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .unwrap()
        .success());
    // The second weir takes the port as soon as the first lets it go.
    let mut b = None;
    for _ in 0..400 {
        if !listening() {
            b = Some(start(config("b.toml")));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut b = b.expect("the first weir kept listening after SIGTERM");
    let out = tokio::task::spawn_blocking(move || app.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let seen: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let _ = Command::new("kill")
        .args(["-TERM", &b.id().to_string()])
        .status();
    let _ = tokio::task::spawn_blocking(move || (a.wait(), b.wait())).await;
    eprintln!("the app saw {seen}");
    assert_eq!(seen["failed"], 0, "the app saw {seen}");
    assert!(seen["ok"].as_u64().unwrap() > 100, "{seen}");
}
