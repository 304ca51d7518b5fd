//! The third-party test servers and clients (tests/common/third_party.rs,
//! tests/servers/) work on their own, without weir: nginx over h2c and TLS,
//! the hyper-h2 GOAWAY server, the grpcio server and client. Tests that put
//! weir between them can then trust what these report.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::third_party::*;
use common::*;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

/// A path nginx answers with the protocol it saw and the request URI.
fn nginx_echo_block(listen: &str, extra: &str) -> String {
    format!(
        "server {{\n    {listen}\n    {extra}\n    location / {{ return 200 \"nginx $server_protocol $request_uri\\n\"; }}\n}}"
    )
}

async fn text(resp: hyper::Response<hyper::body::Incoming>) -> (u16, http::HeaderMap, String) {
    let (parts, body) = read_body(resp).await;
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_answers_h2c_prior_knowledge_from_hyper_and_curl() {
    let ng = nginx(&nginx_echo_block(&nginx_listen_h2(false), ""));
    if !require(NGINX_TOOL, ng.is_some()) {
        return;
    }
    let ng = ng.unwrap();
    let req = Request::get("http://localhost/hyper?x=1")
        .body(body(""))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2_request(ng.addr(), req))
        .await
        .unwrap();
    assert_eq!(
        text(resp).await.2,
        "nginx HTTP/2.0 /hyper?x=1\n",
        "{}",
        nginx_logs(&ng)
    );

    if !require(CURL_TOOL, curl().is_some()) {
        return;
    }
    let url = format!("http://127.0.0.1:{}/curl", ng.port);
    let out = tokio::task::spawn_blocking(move || {
        run_bounded(
            Command::new(curl().unwrap()).args([
                "-sS",
                "--noproxy",
                "*",
                "--http2-prior-knowledge",
                "--max-time",
                "5",
                &url,
            ]),
            Duration::from_secs(8),
        )
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "nginx HTTP/2.0 /curl\n"
    );
}

#[test]
fn nginx_serves_h2_over_tls_with_a_certificate_made_here() {
    if nginx_bin().is_none() {
        require(NGINX_TOOL, false);
        return;
    }
    if !require(CURL_TOOL, curl().is_some()) {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = nginx_tls_files(certs.path());
    assert!(ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    let tls = format!(
        "ssl_certificate {};\n    ssl_certificate_key {};",
        cert.display(),
        key.display()
    );
    let ng = nginx(&nginx_echo_block(&nginx_listen_h2(true), &tls)).unwrap();
    for host in ["localhost", "127.0.0.1"] {
        let out = run_bounded(
            Command::new(curl().unwrap())
                .args(["-sS", "--noproxy", "*", "--http2", "--max-time", "5"])
                .arg("--cacert")
                .arg(certs.path().join("nginx-ca.pem"))
                .arg("--resolve")
                .arg(format!("localhost:{}:127.0.0.1", ng.port))
                .arg(format!("https://{host}:{}/tls", ng.port)),
            Duration::from_secs(8),
        );
        assert!(out.status.success(), "{host}: {out:?}\n{}", nginx_logs(&ng));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "nginx HTTP/2.0 /tls\n"
        );
    }
}

/// Five concurrent requests on one connection to a server that sends
/// GOAWAY(NO_ERROR) after three streams: three answers, two errors, three
/// deliveries in its log, and the connection then closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_server_answers_the_first_three_of_five_streams() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("requests.log");
    let srv = py_server(
        "h2_goaway.py",
        &["--streams", "3", "--log", log.to_str().unwrap()],
    );
    if !require(PYTHON_TOOL, srv.is_some()) {
        return;
    }
    let srv = srv.unwrap();

    let stream = tokio::net::TcpStream::connect(srv.addr()).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let calls = (0..5).map(|i| {
        let mut send = send.clone();
        async move {
            let req = Request::post(format!("http://svc/p{i}"))
                .header("x-request-id", format!("r{i}"))
                .body(body(Bytes::from(format!("body {i}"))))
                .unwrap();
            match send.send_request(req).await {
                Ok(resp) => {
                    let (status, headers, text) = text(resp).await;
                    Ok((status, header_str(&headers, "x-stream-id"), text))
                }
                Err(e) => Err(format!("{e:?}")),
            }
        }
    });
    let results = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(calls),
    )
    .await
    .unwrap();
    drop(send);

    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let errors: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!((ok.len(), errors.len()), (3, 2), "{results:?}");
    // hyper reports the streams above last_stream_id as refused by a
    // graceful GOAWAY (h2: GoAway(.., NO_ERROR, Remote)).
    for e in &errors {
        assert!(e.contains("GoAway") && e.contains("NO_ERROR"), "{e}");
    }
    let ids: BTreeSet<_> = ok.iter().map(|(_, id, _)| id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["1", "3", "5"]), "{results:?}");
    for (status, _, text) in &ok {
        assert_eq!(*status, 200);
        assert!(text.starts_with("ok POST /p"), "{text}");
    }
    // The server closes the connection once the accepted streams are done.
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the connection should close after the GOAWAY")
        .unwrap()
        .unwrap();

    // Exactly the three answered requests were delivered, once each.
    let lines = std::fs::read_to_string(&log).unwrap();
    let delivered: Vec<&str> = lines.lines().collect();
    assert_eq!(delivered.len(), 3, "{lines}");
    let mut answered: Vec<String> = ok
        .iter()
        .map(|(_, _, text)| {
            let path = text.trim().rsplit(' ').next().unwrap().to_string();
            format!("POST {path} r{}", &path[2..])
        })
        .collect();
    let mut delivered: Vec<String> = delivered.iter().map(|s| s.to_string()).collect();
    answered.sort();
    delivered.sort();
    assert_eq!(answered, delivered);

    // A new connection is served as usual.
    let req = Request::get("http://svc/again").body(body("")).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2_request(srv.addr(), req))
        .await
        .unwrap();
    let (status, headers, text) = text(resp).await;
    assert_eq!((status, text.as_str()), (200, "ok GET /again\n"));
    assert_eq!(header_str(&headers, "x-stream-id"), "1");
}

/// Like nginx, the GOAWAY server refuses a regular `host` header sent next to
/// `:authority` with a 400, and does not count it as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_server_answers_400_to_a_host_header() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("requests.log");
    let srv = py_server("h2_goaway.py", &["--log", log.to_str().unwrap()]);
    if !require(PYTHON_TOOL, srv.is_some()) {
        return;
    }
    let srv = srv.unwrap();
    let with_host = Request::get("http://svc/with-host")
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2_request(srv.addr(), with_host))
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    let without = Request::get("http://svc/without-host")
        .header("x-request-id", "id-1")
        .body(body(""))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2_request(srv.addr(), without))
        .await
        .unwrap();
    let (status, _, text) = text(resp).await;
    assert_eq!((status, text.as_str()), (200, "ok GET /without-host\n"));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "GET /without-host id-1\n"
    );
}

/// The grpcio client gets the grpcio server's eight ticks about 0.5 s apart,
/// then OK; the unary Echo returns its request.
#[test]
fn grpc_client_streams_ticks_from_the_grpc_server() {
    let srv = py_server("grpc_stream.py", &[]);
    if !require(PYTHON_TOOL, srv.is_some()) {
        return;
    }
    let srv = srv.unwrap();
    let target = format!("127.0.0.1:{}", srv.port);
    let out = run_bounded(
        py_command("grpc_client.py").unwrap().args([
            "--target",
            &target,
            "--method",
            "Ticks",
            "--timeout",
            "10",
        ]),
        Duration::from_secs(12),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 9, "{stdout}");
    assert_eq!(lines[8], "STATUS OK");
    let mut times = Vec::new();
    for (i, line) in lines[..8].iter().enumerate() {
        let (t, msg) = line.split_once(' ').unwrap();
        assert_eq!(msg, format!("tick {i}"), "{stdout}");
        times.push(t.parse::<f64>().unwrap());
    }
    assert!(times[0] < 1.0, "{stdout}");
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!((0.35..0.9).contains(&gap), "gap {gap}: {stdout}");
    }

    let out = run_bounded(
        py_command("grpc_client.py").unwrap().args([
            "--target",
            &target,
            "--method",
            "Echo",
            "--message",
            "hello",
            "--authority",
            "svc.internal",
            "--timeout",
            "5",
        ]),
        Duration::from_secs(8),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].ends_with(" hello"), "{stdout}");
    assert_eq!(lines[1], "STATUS OK");
}

fn header_str(headers: &http::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}
