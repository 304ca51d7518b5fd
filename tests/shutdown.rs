//! Graceful shutdown of the real binary: requests in flight at SIGTERM finish,
//! new connections are refused, the process exits 0 within shutdown_timeout.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

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
