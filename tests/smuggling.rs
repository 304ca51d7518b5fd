//! The request-smuggling guard holds after a first request it could once be
//! made to frame differently from hyper (a security review's findings): a
//! repeated `Content-Length: 5` / `05`, a head with bare-LF line ends, a
//! 20-digit chunk size, and `Upgrade: foo` without `Connection: upgrade`.
//! After each, a request with both `Content-Length` and `Transfer-Encoding`
//! must get weir's 400 — never reach the upstream — on both data paths.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The request a front proxy framing by length would pass on, with a
/// request hidden in its chunked reading.
const CONFLICT: &str = "POST /conf HTTP/1.1\r\nHost: svc\r\nContent-Length: 41\r\n\
                        Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
                        GET /smuggled HTTP/1.1\r\nHost: svc\r\n\r\n";

/// weir on `path` in front of an upstream that records each request's path.
async fn recording_weir(path: DataPath) -> (TestUpstream, Arc<Mutex<Vec<String>>>, Weir) {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        s.lock().unwrap().push(req.uri().path().to_string());
        async move { Response::new(body("ok")) }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    (up, seen, weir)
}

/// Sends `bytes` on a new connection and reads (up to 5 s) until weir closes it.
async fn send_all(weir: &Weir, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

const FIRSTS: [&str; 4] = [
    "GET /a HTTP/1.1\r\nHost: svc\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\nhello",
    "GET /a HTTP/1.1\nHost: svc\n\n",
    "POST /a HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n\
     00000000000000000005\r\nhello\r\n0\r\n\r\n",
    "GET /a HTTP/1.1\r\nHost: svc\r\nUpgrade: foo\r\n\r\n",
];

both_paths!(
    #[tokio::test]
    a_conflicting_request_after_an_odd_first_one_is_refused
);
async fn a_conflicting_request_after_an_odd_first_one_is_refused(path: DataPath) {
    let (_up, seen, weir) = recording_weir(path).await;
    for first in FIRSTS {
        seen.lock().unwrap().clear();
        let out = send_all(&weir, format!("{first}{CONFLICT}").as_bytes()).await;
        let paths = seen.lock().unwrap().clone();
        assert!(
            !paths.iter().any(|p| p == "/conf" || p == "/smuggled"),
            "{first:?}: the upstream saw {paths:?}\n{out}"
        );
        assert!(
            out.contains("HTTP/1.1 400") && out.contains("x-weir-error: bad_request"),
            "{first:?}: {out}"
        );
    }
}

both_paths!(
    #[tokio::test]
    nothing_after_a_chunked_body_weir_refuses_is_served
);
/// Found by `tests/framing_props.rs`: hyper's chunked decoder takes a bare
/// LF after the last chunk as the start of a trailer, where weir's framing
/// refuses the body. The guard used to stop following there and let hyper
/// read on — and serve a request it never judged. Now it cuts the
/// connection: nothing after the body reaches the upstream.
async fn nothing_after_a_chunked_body_weir_refuses_is_served(path: DataPath) {
    let (_up, seen, weir) = recording_weir(path).await;
    let out = send_all(
        &weir,
        b"POST /first HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n\
          0\r\n\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: svc\r\n\r\n",
    )
    .await;
    let paths = seen.lock().unwrap().clone();
    assert!(
        !paths.iter().any(|p| p == "/smuggled"),
        "the upstream saw {paths:?}\n{out}"
    );
}

both_paths!(
    #[tokio::test]
    an_upgrade_that_does_not_happen_ends_the_connection
);
/// From a review: a request that asks to upgrade makes the guard stop
/// following the connection. When no upgrade happens — an HTTP/1.0 request
/// (hyper upgrades HTTP/1.1 only), or an upstream that answers 200 — the
/// connection must not carry on with requests nobody judged.
async fn an_upgrade_that_does_not_happen_ends_the_connection(path: DataPath) {
    let (_up, seen, weir) = recording_weir(path).await;
    for first in [
        "GET /a HTTP/1.0\r\nHost: svc\r\nConnection: keep-alive, upgrade\r\nUpgrade: x\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: svc\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n",
        // Found by the framing_differential fuzzer: a `Connection` value
        // that is not text names `upgrade` to a reader of bytes only; weir
        // does not upgrade it, and must not stop judging after it.
        "GET /a HTTP/1.1\r\nHost: svc\r\nConnection: \u{e9}, upgrade\r\nUpgrade: x\r\n\r\n",
    ] {
        seen.lock().unwrap().clear();
        let out = send_all(&weir, format!("{first}{CONFLICT}").as_bytes()).await;
        let paths = seen.lock().unwrap().clone();
        assert!(
            !paths.iter().any(|p| p == "/conf" || p == "/smuggled"),
            "{first:?}: the upstream saw {paths:?}\n{out}"
        );
    }
}

both_paths!(
    #[tokio::test]
    a_path_that_looks_like_weirs_marker_is_an_ordinary_request
);
/// The guard says which request it refused out of band: a client whose
/// target happens to be the path the marker once had is forwarded like any
/// other, and a refused head after it is still weir's 400.
async fn a_path_that_looks_like_weirs_marker_is_an_ordinary_request(path: DataPath) {
    let (_up, seen, weir) = recording_weir(path).await;
    let bytes = format!(
        "GET /!weir-framing-conflict HTTP/1.1\r\nHost: svc\r\n\r\n\
         GET /!weir-head-too-large HTTP/1.1\r\nHost: svc\r\n\r\n{CONFLICT}"
    );
    let out = send_all(&weir, bytes.as_bytes()).await;
    assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    assert_eq!(out.matches("HTTP/1.1 400").count(), 1, "{out}");
    assert_eq!(
        *seen.lock().unwrap(),
        ["/!weir-framing-conflict", "/!weir-head-too-large"]
    );
}
