//! CONNECT: a TCP tunnel to an upstream with `tunnel = true`, 405
//! `connect_not_allowed` for any other, never forwarded upstream.
//!
//! Regressions: an app with `HTTPS_PROXY` pointing at weir had its
//! connection closed with 0 bytes (curl: "Proxy CONNECT aborted"), and
//! `CONNECT app:443` was forwarded upstream as `CONNECT / HTTP/1.1`.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::third_party::*;
use common::*;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::config::Config;
use weir::metrics::Metrics;
use weir::proxy::{Proxy, ProxyHandle};

async fn weir(toml: &str) -> (ProxyHandle, Arc<Metrics>) {
    let src = format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n{toml}");
    let config = Config::parse(Path::new("tunnel.toml"), &src).unwrap();
    let metrics = Arc::new(Metrics::new());
    (
        Proxy::start_with(config, metrics.clone()).await.unwrap(),
        metrics,
    )
}

/// An upstream that echoes every byte back, counting connections.
async fn echo() -> RawUpstream {
    RawUpstream::start(|_, s| async move {
        let (mut r, mut w) = s.into_split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    })
    .await
}

/// Sends a CONNECT head; returns the stream and the response head.
async fn connect(addr: std::net::SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        head.push(b[0]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

fn gauge(m: &Metrics) -> f64 {
    m.values("weir_tunnels_open", "svc", "")
        .values()
        .sum::<f64>()
}

#[tokio::test]
async fn a_tunnel_joins_the_client_to_the_upstream_and_holds_a_slot() {
    let up = echo().await;
    let (w, m) = weir(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\ntunnel = true\n",
        up.url()
    ))
    .await;
    // The port the client names does not matter: weir dials the upstream.
    let (mut s, head) = connect(w.listen_addr(), "svc:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("x-weir-attempts: 1"), "{head}");
    s.write_all(b"ping through the tunnel").await.unwrap();
    let mut got = vec![0u8; 23];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, b"ping through the tunnel");
    assert_eq!(gauge(&m), 1.0);
    drop(s);
    for _ in 0..100 {
        if gauge(&m) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gauge(&m), 0.0, "the tunnel was not closed");
    assert_eq!(up.connections(), 1);
}

#[tokio::test]
async fn connect_elsewhere_is_405_and_never_forwarded() {
    let up = echo().await;
    let (w, m) = weir(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        up.url()
    ))
    .await;
    for target in ["svc:443", "example.com:443"] {
        let (mut s, head) = connect(w.listen_addr(), target).await;
        assert!(head.starts_with("HTTP/1.1 405"), "{target}: {head}");
        assert!(
            head.contains("x-weir-error: connect_not_allowed"),
            "{target}: {head}"
        );
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut rest = vec![0u8; len];
        s.read_exact(&mut rest).await.unwrap();
        let body = String::from_utf8_lossy(&rest);
        assert!(body.contains("tunnel = true"), "{target}: {body}");
    }
    assert_eq!(up.connections(), 0, "a CONNECT reached the upstream");
    let errors = m.values("weir_requests_total", "svc", "error");
    assert_eq!(errors.get("connect_not_allowed"), Some(&1.0), "{errors:?}");
    let codes = m.values("weir_requests_total", "svc", "code");
    assert_eq!(codes.get("405"), Some(&1.0), "{codes:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_tunnel_is_retried_as_a_connect_failure() {
    let refused = refused_addr().await;
    let (w, m) = weir(&format!(
        "[upstreams.svc]\nurl = \"http://{refused}\"\nhosts = [\"svc\"]\ntunnel = true\n"
    ))
    .await;
    let (_s, head) = connect(w.listen_addr(), "svc:443").await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(head.contains("x-weir-error: connect_failed"), "{head}");
    assert!(head.contains("x-weir-attempts: 3"), "{head}");
    let results = m.values("weir_upstream_attempts_total", "svc", "result");
    assert_eq!(results.get("connect_failure"), Some(&3.0), "{results:?}");
}

/// curl through weir as its HTTPS proxy (`-x`): the TLS session runs end to
/// end between curl and nginx inside the tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_nginx_over_tls_through_a_weir_tunnel() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, _) = nginx_tls_files(certs.path());
    let ng = nginx(&format!(
        "server {{\n    listen 127.0.0.1:{{PORT}} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    location / {{ return 200 \"nginx $server_protocol $request_uri\\n\"; }}\n}}",
        cert.display(),
        key.display()
    ));
    if !require(NGINX_TOOL, ng.is_some()) || !require(CURL_TOOL, curl().is_some()) {
        return;
    }
    let ng = ng.unwrap();
    let (w, _m) = weir(&format!(
        "[upstreams.api]\nurl = \"https://localhost:{}\"\nhosts = [\"localhost\"]\ntunnel = true\n",
        ng.port
    ))
    .await;
    let proxy = format!("http://{}", w.listen_addr());
    let url = format!("https://localhost:{}/through", ng.port);
    let ca = certs.path().join("nginx-ca.pem");
    let out = tokio::task::spawn_blocking(move || {
        run_bounded(
            Command::new(curl().unwrap())
                .args(["-s", "-S", "--http1.1", "-x", &proxy, "--cacert"])
                .arg(&ca)
                .arg(&url),
            Duration::from_secs(20),
        )
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "nginx HTTP/1.1 /through\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
