//! Requests that name their host ambiguously, from raw bytes: userinfo in
//! `Host`, in an absolute-form target, in HTTP/2's `:authority` and in a
//! CONNECT target is a 400 `bad_request` on both paths and reaches no
//! upstream (docs/reference/routing.md#routing); the admin listener refuses two
//! `Host` or two `Origin` fields and judges an absolute-form target's
//! authority as it judges `Host` (docs/reference/admin.md#admin-listener).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use std::path::Path;
use std::time::Duration;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

fn pay(url: &str) -> String {
    format!(
        "[upstreams.pay]\nurl = \"{url}\"\nhosts = [\"pay\", \"tun.example\"]\npreserve_host = true\ntunnel = true\n"
    )
}

both_paths!(
    #[tokio::test]
    userinfo_in_the_host_or_the_target_is_400
);
async fn userinfo_in_the_host_or_the_target_is_400(path: DataPath) {
    let up = TestUpstream::text("charged").await;
    let weir = Weir::start_on(path, &pay(&up.url())).await;
    for (head, field) in [
        (
            "GET /charges HTTP/1.1\r\nHost: evil@pay\r\n",
            "the Host field",
        ),
        (
            "GET http://user:PASSWORD@pay/charges HTTP/1.1\r\nHost: pay\r\n",
            "the request target",
        ),
        (
            "CONNECT user@tun.example:443 HTTP/1.1\r\nHost: tun.example:443\r\n",
            "the request target",
        ),
        (
            "CONNECT tun.example:443 HTTP/1.1\r\nHost: user@tun.example:443\r\n",
            "the Host field",
        ),
    ] {
        let req = format!("{head}Connection: close\r\n\r\n");
        let out = exchange_raw(weir.addr, req.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{head}: {out}");
        assert!(out.contains("x-weir-error: bad_request"), "{head}: {out}");
        assert!(
            out.contains(&format!("{field} carries userinfo")),
            "{head}: {out}"
        );
        assert!(
            !out.contains("PASSWORD"),
            "the answer repeats the credentials: {out}"
        );
    }
    assert_eq!(
        up.connections(),
        0,
        "a request with userinfo reached the upstream"
    );
    // Without userinfo the same requests are served.
    let out = exchange_raw(
        weir.addr,
        b"GET http://pay/charges HTTP/1.1\r\nHost: pay\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[tokio::test]
async fn userinfo_in_the_http2_authority_is_400() {
    let up = TestUpstream::text("charged").await;
    let weir = Weir::start_on(DataPath::General, &pay(&up.url())).await;
    let req = hyper::Request::get("http://user:PASSWORD@pay/charges")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(h2_request(weir.addr, req).await).await;
    assert_eq!(parts.status.as_u16(), 400, "{b:?}");
    assert_eq!(header(&parts, "x-weir-error"), "bad_request");
    assert_eq!(up.connections(), 0);
}

async fn admin_runtime() -> Runtime {
    let up = TestUpstream::text("ok").await;
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n{}",
        pay(&up.url())
    );
    let config = Config::parse(Path::new("admin.toml"), &src).unwrap();
    let opts = Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    Runtime::start(config, opts).await.unwrap()
}

#[tokio::test]
async fn the_admin_refuses_two_hosts_two_origins_and_a_foreign_absolute_target() {
    let rt = admin_runtime().await;
    let status = |out: &str| out.split(' ').nth(1).unwrap_or_default().to_string();
    for head in [
        "GET http://evil.example/config HTTP/1.1\r\nHost: localhost\r\n",
        "GET http://localhost@evil.example/config HTTP/1.1\r\nHost: localhost\r\n",
        "GET /config HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n",
        "GET /config HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost\r\nOrigin: http://evil.example\r\n",
        "POST /reload HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nContent-Length: 0\r\n",
    ] {
        let req = format!("{head}Connection: close\r\n\r\n");
        let out = exchange_raw(rt.admin_addr, req.as_bytes()).await;
        // hyper answers two Host fields itself (400) or weir refuses (403):
        // either way not served.
        let s = status(&out);
        assert!(s == "403" || s == "400", "{head}: {out}");
    }
    for head in [
        "GET http://localhost/config HTTP/1.1\r\nHost: localhost\r\n",
        "GET /config HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost\r\n",
    ] {
        let req = format!("{head}Connection: close\r\n\r\n");
        let out = exchange_raw(rt.admin_addr, req.as_bytes()).await;
        assert_eq!(status(&out), "200", "{head}: {out}");
    }
    rt.shutdown(Duration::from_secs(1)).await;
}
