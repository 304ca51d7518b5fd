//! Routing on the shared listener and dedicated listeners.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream that answers with its name and the path it saw.
async fn named(name: &'static str) -> TestUpstream {
    TestUpstream::start(move |req: Request<hyper::body::Incoming>| async move {
        Response::new(body(format!("{name} {}", req.uri())))
    })
    .await
}

async fn fetch(c: &Client, weir: &Weir, host: &str, path: &str) -> (u16, String) {
    let (parts, b) = read_body(get(c, &weir.url(path), host).await).await;
    (
        parts.status.as_u16(),
        String::from_utf8_lossy(&b).into_owned(),
    )
}

#[tokio::test]
async fn hosts_wildcards_and_longest_prefix() {
    let a = named("a").await;
    let b = named("b").await;
    let w = named("wild").await;
    let api = named("api").await;
    let weir = Weir::start(&format!(
        r#"
[upstreams.a]
url = "{}"
hosts = ["a.example", "shared"]

[upstreams.b]
url = "{}"
hosts = ["B.Example"]

[upstreams.wild]
url = "{}"
hosts = ["*.svc.internal", "shared2"]

[upstreams.api]
url = "{}/base/"
hosts = ["shared", "shared2"]
path_prefix = "/api"
strip_prefix = true
"#,
        a.url(),
        b.url(),
        w.url(),
        api.url()
    ))
    .await;
    let c = client();
    assert_eq!(
        fetch(&c, &weir, "a.example", "/x").await,
        (200, "a /x".into())
    );
    // Case-insensitive, port ignored.
    assert_eq!(
        fetch(&c, &weir, "b.EXAMPLE:9999", "/y").await,
        (200, "b /y".into())
    );
    assert_eq!(
        fetch(&c, &weir, "x.svc.internal", "/z").await,
        (200, "wild /z".into())
    );
    assert_eq!(
        fetch(&c, &weir, "deep.x.svc.internal", "/").await,
        (200, "wild /".into())
    );
    // A wildcard does not match the bare suffix.
    assert_eq!(fetch(&c, &weir, "svc.internal", "/").await.0, 404);
    // Longest prefix wins; strip_prefix then base path.
    assert_eq!(
        fetch(&c, &weir, "shared", "/api/v1?q=1").await,
        (200, "api /base/v1?q=1".into())
    );
    assert_eq!(
        fetch(&c, &weir, "shared", "/api").await,
        (200, "api /base/".into())
    );
    assert_eq!(
        fetch(&c, &weir, "shared", "/apix").await,
        (200, "a /apix".into())
    );
    assert_eq!(
        fetch(&c, &weir, "shared", "/other").await,
        (200, "a /other".into())
    );
    assert_eq!(
        fetch(&c, &weir, "shared2", "/api/x").await,
        (200, "api /base/x".into())
    );
    assert_eq!(
        fetch(&c, &weir, "shared2", "/else").await,
        (200, "wild /else".into())
    );
}

#[tokio::test]
async fn base_path_without_strip_keeps_the_prefix() {
    let up = named("u").await;
    let weir = Weir::start(&format!(
        "[upstreams.u]\nurl = \"{}/v2\"\nhosts = [\"u\"]\npath_prefix = \"/orders/\"\n",
        up.url()
    ))
    .await;
    assert_eq!(
        fetch(&client(), &weir, "u", "/orders/7").await,
        (200, "u /v2/orders/7".into())
    );
}

#[tokio::test]
async fn dedicated_listener_sends_everything_to_its_upstream() {
    let up = named("ded").await;
    let weir = Weir::start(&format!(
        "[upstreams.ded]\nurl = \"{}\"\nlisten = \"127.0.0.1:0\"\n",
        up.url()
    ))
    .await;
    let addr = weir.dedicated("ded");
    let (parts, b) =
        read_body(get(&client(), &format!("http://{addr}/any/path"), "whatever").await).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b, "ded /any/path");
    // Not reachable through the shared listener: it has no hosts.
    assert_eq!(fetch(&client(), &weir, "ded", "/").await.0, 404);
}

#[tokio::test]
async fn absolute_form_target_routes_by_its_authority() {
    let up = named("abs").await;
    let weir = Weir::single(&up.url(), "").await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(
        b"GET http://svc/abs?x=1 HTTP/1.1\r\nHost: ignored.example\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("abs /abs?x=1"), "{out}");
}

#[tokio::test]
async fn unmatched_host_is_404_no_route_and_nothing_is_contacted() {
    let up = named("only").await;
    let weir = Weir::single(&up.url(), "").await;
    let (status, code, json) =
        json_error(get(&client(), &weir.url("/"), "evil.example").await).await;
    assert_eq!((status, code.as_str()), (404, "no_route"));
    assert_eq!(json["error"], "no_route");
    // An absolute URI naming the upstream's own address is not a route either.
    let target = format!("http://{}/", up.addr);
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(
        format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            up.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    assert!(out.contains("x-weir-error: no_route"), "{out}");
    assert_eq!(up.connections(), 0, "weir connected to an unrouted address");
}
