//! Idempotency keys are per principal (docs/reference/idempotency.md#idempotency-keys):
//! the same key and body from another `Authorization`, another API key,
//! another host the client named, or another value of a scoped header is a
//! new request that reaches the upstream, never a replay of someone else's
//! response; with `scope = ["none"]` keys are shared as before. And a
//! request with two key fields is a 400. Raw request bytes, on both paths,
//! with the store in memory and on a real `redis-server`.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::redis_server::RedisServer;
use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An upstream that answers every request `201 order N`, N counting them.
async fn orders() -> TestUpstream {
    let n = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let n = n.clone();
        async move {
            let _ = req.into_body().collect().await;
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            Response::builder()
                .status(201)
                .body(body(format!("order {i}")))
                .unwrap()
        }
    })
    .await
}

/// `POST /charges` with `fields` (each a whole line without CRLF), key
/// `k-shared-1` and a fixed body, as raw bytes: (status line, replayed,
/// body).
async fn charge(weir: &Weir, fields: &[&str]) -> (String, bool, String) {
    let mut req = String::from("POST /charges HTTP/1.1\r\n");
    for f in fields {
        req.push_str(f);
        req.push_str("\r\n");
    }
    req.push_str(
        "Idempotency-Key: k-shared-1\r\nContent-Length: 10\r\nConnection: close\r\n\r\namount=100",
    );
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    let status = out.lines().next().unwrap_or_default().to_string();
    let replayed = out
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true");
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, replayed, body)
}

fn svc(url: &str, extra: &str) -> String {
    format!(
        "[upstreams.pay]\nurl = \"{url}\"\nhosts = [\"pay\", \"tenant-a.pay.internal\", \"tenant-b.pay.internal\"]\npreserve_host = true\n{extra}\n"
    )
}

/// [`charge`] again while the answer is 409 `idempotency_in_flight`: with
/// the store on Redis a record is completed in the background, and a
/// repeat sent the instant the first answer arrived may find it still in
/// flight (the client is told to retry after a second).
async fn charge_settled(weir: &Weir, fields: &[&str]) -> (String, bool, String) {
    for _ in 0..100 {
        let r = charge(weir, fields).await;
        if !r.0.starts_with("HTTP/1.1 409") {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("still in flight after 2 s");
}

async fn alice_and_bob(weir: &Weir, up: &TestUpstream) {
    let alice = ["Host: pay", "Authorization: Bearer ALICE"];
    let bob = ["Host: pay", "Authorization: Bearer BOB"];
    let (s, replayed, b) = charge(weir, &alice).await;
    assert_eq!(
        (s.as_str(), replayed, b.as_str()),
        ("HTTP/1.1 201 Created", false, "order 1")
    );
    // Bob's key is Bob's: forwarded, not Alice's response.
    let (s, replayed, b) = charge(weir, &bob).await;
    assert_eq!(
        (s.as_str(), replayed, b.as_str()),
        ("HTTP/1.1 201 Created", false, "order 2")
    );
    assert_eq!(up.requests(), 2);
    // Each one's repeat is still answered from their own record.
    assert_eq!(
        charge_settled(weir, &alice).await,
        (s.clone(), true, "order 1".into())
    );
    assert_eq!(
        charge_settled(weir, &bob).await,
        (s.clone(), true, "order 2".into())
    );
    // No credentials at all is a principal of its own.
    let (_, replayed, b) = charge(weir, &["Host: pay"]).await;
    assert_eq!((replayed, b.as_str()), (false, "order 3"));
    assert_eq!(up.requests(), 3);
}

both_paths!(
    #[tokio::test]
    a_key_from_another_authorization_is_a_new_request
);
async fn a_key_from_another_authorization_is_a_new_request(path: DataPath) {
    let up = orders().await;
    let weir = Weir::start_on(path, &svc(&up.url(), "")).await;
    alice_and_bob(&weir, &up).await;
}

both_paths!(
    #[tokio::test]
    a_key_from_another_tenant_host_is_a_new_request
);
async fn a_key_from_another_tenant_host_is_a_new_request(path: DataPath) {
    let up = orders().await;
    let weir = Weir::start_on(path, &svc(&up.url(), "")).await;
    let a = ["Host: tenant-a.pay.internal"];
    let b = ["Host: tenant-b.pay.internal"];
    assert_eq!(charge(&weir, &a).await.2, "order 1");
    let (_, replayed, body) = charge(&weir, &b).await;
    assert_eq!((replayed, body.as_str()), (false, "order 2"));
    // The host without case is the same tenant.
    let (_, replayed, body) = charge(&weir, &["Host: TENANT-A.pay.internal"]).await;
    assert_eq!((replayed, body.as_str()), (true, "order 1"));
    assert_eq!(up.requests(), 2);
}

// Issue 53, item 5: tenant A's key sent by tenant B with another API key
// was answered from A's record, because the default scope named no API-key
// field. Each conventional credential field, under the default scope.
both_paths!(
    #[tokio::test]
    a_key_from_another_api_key_is_a_new_request
);
async fn a_key_from_another_api_key_is_a_new_request(path: DataPath) {
    let up = orders().await;
    let weir = Weir::start_on(path, &svc(&up.url(), "")).await;
    let fields = [
        "X-Api-Key",
        "Api-Key",
        "X-Auth-Token",
        "Proxy-Authorization",
    ];
    for (i, name) in fields.iter().enumerate() {
        let a = format!("{name}: tenantA");
        let b = format!("{name}: tenantB");
        let (a, b) = (["Host: pay", a.as_str()], ["Host: pay", b.as_str()]);
        let first = format!("order {}", 2 * i + 1);
        let (s, replayed, body) = charge(&weir, &a).await;
        assert_eq!(
            (s.as_str(), replayed, body.as_str()),
            ("HTTP/1.1 201 Created", false, first.as_str()),
            "{name}"
        );
        // Tenant B's key is B's: forwarded, not A's response.
        let (s, replayed, body) = charge(&weir, &b).await;
        assert_eq!(
            (s.as_str(), replayed, body.as_str()),
            (
                "HTTP/1.1 201 Created",
                false,
                &*format!("order {}", 2 * i + 2)
            ),
            "{name}: tenant B got tenant A's record"
        );
        // A's own repeat is answered from A's record.
        assert_eq!(
            charge_settled(&weir, &a).await,
            (s.clone(), true, first.clone()),
            "{name}"
        );
        assert_eq!(up.requests(), 2 * i + 2, "{name}");
    }
}

both_paths!(
    #[tokio::test]
    a_scoped_header_names_the_tenant_and_none_shares_keys
);
async fn a_scoped_header_names_the_tenant_and_none_shares_keys(path: DataPath) {
    let up = orders().await;
    let extra = "[upstreams.pay.idempotency]\nscope = [\"header:x-tenant-id\"]\n";
    let weir = Weir::start_on(path, &svc(&up.url(), extra)).await;
    let t1 = [
        "Host: pay",
        "X-Tenant-Id: t1",
        "Authorization: Bearer ALICE",
    ];
    let t1_other_token = [
        "Host: pay",
        "X-Tenant-Id: t1",
        "Authorization: Bearer ALICE2",
    ];
    let t2 = [
        "Host: pay",
        "X-Tenant-Id: t2",
        "Authorization: Bearer ALICE",
    ];
    assert_eq!(charge(&weir, &t1).await.2, "order 1");
    assert_eq!(
        charge(&weir, &t1_other_token).await,
        ("HTTP/1.1 201 Created".into(), true, "order 1".into())
    );
    assert_eq!(charge(&weir, &t2).await.2, "order 2");
    assert_eq!(up.requests(), 2);

    // `none`: the old behaviour, one key for every caller.
    let up = orders().await;
    let extra = "[upstreams.pay.idempotency]\nscope = [\"none\"]\n";
    let weir = Weir::start_on(path, &svc(&up.url(), extra)).await;
    assert_eq!(
        charge(&weir, &["Host: pay", "Authorization: Bearer ALICE"])
            .await
            .2,
        "order 1"
    );
    let (_, replayed, body) = charge(&weir, &["Host: pay", "Authorization: Bearer BOB"]).await;
    assert_eq!((replayed, body.as_str()), (true, "order 1"));
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    two_idempotency_keys_are_400
);
async fn two_idempotency_keys_are_400(path: DataPath) {
    let up = orders().await;
    let weir = Weir::start_on(path, &svc(&up.url(), "")).await;
    let req = "POST /charges HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: k-1\r\nIdempotency-Key: k-2\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("x-weir-error: bad_request"), "{out}");
    assert!(out.contains("more than one"), "{out}");
    assert_eq!(up.requests(), 0);
    // Folded into one field, it is one (odd) key: recorded as such.
    let req = "POST /charges HTTP/1.1\r\nHost: pay\r\nIdempotency-Key: k-1, k-2\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";
    assert!(exchange_raw(weir.addr, req.as_bytes())
        .await
        .starts_with("HTTP/1.1 201"));
    assert_eq!(up.requests(), 1);
}

/// Alice and Bob over HTTP/2 (the general path, `:authority` as the host).
#[tokio::test]
async fn over_http2_the_principal_is_kept_apart_too() {
    let up = orders().await;
    let weir = Weir::start_on(DataPath::General, &svc(&up.url(), "")).await;
    let send = |token: &'static str, authority: &'static str| {
        let req = Request::post(format!("http://{authority}/charges"))
            .header("authorization", token)
            .header("idempotency-key", "k-shared-1")
            .body(body("amount=100"))
            .unwrap();
        h2_request(weir.addr, req)
    };
    let (p, b) = read_body(send("Bearer ALICE", "pay").await).await;
    assert_eq!((p.status.as_u16(), &b[..]), (201, &b"order 1"[..]));
    let (p, b) = read_body(send("Bearer BOB", "pay").await).await;
    assert_eq!(
        (header(&p, "idempotent-replayed"), &b[..]),
        (String::new(), &b"order 2"[..])
    );
    let (p, b) = read_body(send("Bearer ALICE", "tenant-b.pay.internal").await).await;
    assert_eq!(
        (header(&p, "idempotent-replayed"), &b[..]),
        (String::new(), &b"order 3"[..])
    );
    let (p, b) = read_body(send("Bearer ALICE", "pay").await).await;
    assert_eq!(
        (header(&p, "idempotent-replayed"), &b[..]),
        ("true".into(), &b"order 1"[..])
    );
    assert_eq!(up.requests(), 3);
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    with_the_store_on_redis_alice_and_bob_are_kept_apart
);
async fn with_the_store_on_redis_alice_and_bob_are_kept_apart(path: DataPath) {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let up = orders().await;
    let state = format!(
        "[state]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\n",
        redis.url()
    );
    let weir = Weir::start_on(path, &format!("{state}\n{}", svc(&up.url(), ""))).await;
    let fleet = weir.handle.as_ref().unwrap().fleet().unwrap();
    assert!(fleet.wait_up(std::time::Duration::from_secs(5)).await);
    alice_and_bob(&weir, &up).await;
    // The records are on Redis, under keys that hold no credential.
    let keys = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "--scan"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .expect("redis-cli (Debian's redis-tools, which redis-server depends on)");
    assert_eq!(keys.matches("k-shared-1~").count(), 3, "{keys}");
    assert!(!keys.contains("ALICE") && !keys.contains("BOB"), "{keys}");
}

/// An upstream that logs a caller in: every answer is `201 session N` with
/// `Set-Cookie: session=rotated-N`, N counting them.
async fn logins() -> TestUpstream {
    let n = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let n = n.clone();
        async move {
            let _ = req.into_body().collect().await;
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            Response::builder()
                .status(201)
                .header("set-cookie", format!("session=rotated-{i}; HttpOnly"))
                .body(body(format!("session {i}")))
                .unwrap()
        }
    })
    .await
}

/// `POST /login` with `fields`, `key` and `body`, as raw bytes: the whole
/// answer.
async fn login(weir: &Weir, fields: &[&str], key: &str, body: &str) -> String {
    let mut req = String::from("POST /login HTTP/1.1\r\nHost: pay\r\n");
    for f in fields {
        req.push_str(f);
        req.push_str("\r\n");
    }
    req.push_str(&format!(
        "Idempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    exchange_raw(weir.addr, req.as_bytes()).await
}

// Issue 41, item 1: an application that authenticates by cookie. Bob
// repeating Alice's key used to get Alice's recorded response, her rotated
// session cookie included; Mallory sending a key first used to make
// Alice's own write with it fail with 422.
both_paths!(
    #[tokio::test]
    a_key_from_another_cookie_is_a_new_request_and_never_a_422
);
async fn a_key_from_another_cookie_is_a_new_request_and_never_a_422(path: DataPath) {
    let up = orders().await;
    let weir = Weir::start_on(path, &svc(&up.url(), "")).await;
    let alice = ["Host: pay", "Cookie: session=alice"];
    let bob = ["Host: pay", "Cookie: session=bob"];
    assert_eq!(charge(&weir, &alice).await.2, "order 1");
    let (s, replayed, b) = charge(&weir, &bob).await;
    assert_eq!(
        (s.as_str(), replayed, b.as_str()),
        ("HTTP/1.1 201 Created", false, "order 2")
    );
    // Alice's repeat is still hers.
    assert_eq!(
        charge(&weir, &alice).await,
        (s.clone(), true, "order 1".into())
    );
    assert_eq!(up.requests(), 2);

    // Squatting: Mallory sends the key Alice will use, with another body.
    let mallory = ["Cookie: session=mallory"];
    let out = login(&weir, &mallory, "k-alice-next", "amount=1").await;
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    let out = login(
        &weir,
        &["Cookie: session=alice"],
        "k-alice-next",
        "amount=100",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 201"), "Alice's own write: {out}");
    assert!(!out.contains("idempotency_key_reused"), "{out}");
    assert_eq!(up.requests(), 4);
}

// Issue 41, item 1: a recorded `Set-Cookie` is never replayed, whoever
// asks: the write's record is completed but not replayable (409), with
// the default scope and with keys shared by every caller.
both_paths!(
    #[tokio::test]
    a_response_that_sets_a_cookie_is_never_replayed
);
async fn a_response_that_sets_a_cookie_is_never_replayed(path: DataPath) {
    for scope in ["", "[upstreams.pay.idempotency]\nscope = [\"none\"]\n"] {
        let up = logins().await;
        let weir = Weir::start_on(path, &svc(&up.url(), scope)).await;
        let alice = ["Cookie: session=alice"];
        let first = login(&weir, &alice, "k-login-1", "user=alice").await;
        assert!(first.starts_with("HTTP/1.1 201"), "{first}");
        assert!(first.contains("session=rotated-1"), "{first}");
        for who in [&alice[..], &["Cookie: session=bob"][..]] {
            let again = login(&weir, who, "k-login-1", "user=alice").await;
            assert!(!again.contains("rotated-1"), "{scope} {who:?}: {again}");
            assert!(!again.contains("idempotent-replayed"), "{scope}: {again}");
        }
        // Alice's repeat is the write's own key: done once, not delivered
        // again, and not replayed.
        let again = login(&weir, &alice, "k-login-1", "user=alice").await;
        assert!(again.starts_with("HTTP/1.1 409"), "{scope}: {again}");
        assert!(again.contains("idempotency_not_replayable"), "{again}");
        let expected = if scope.is_empty() { 2 } else { 1 };
        assert_eq!(up.requests(), expected, "{scope}");
    }
}

/// Over HTTP/2 (the general path): Bob's cookie is another caller, the
/// `Set-Cookie` is not replayed, and Alice's cookie split into two fields
/// (RFC 9113 §8.2.3) is still Alice.
#[tokio::test]
async fn over_http2_a_cookie_is_a_principal_and_set_cookie_is_not_replayed() {
    let up = logins().await;
    let weir = Weir::start_on(DataPath::General, &svc(&up.url(), "")).await;
    let send = |cookies: &'static [&'static str], key: &'static str| {
        let mut req = Request::post("http://pay/login").header("idempotency-key", key);
        for c in cookies {
            req = req.header("cookie", *c);
        }
        h2_request(weir.addr, req.body(body("user=alice")).unwrap())
    };
    let (p, b) = read_body(send(&["session=alice; theme=dark"], "k-h2-1").await).await;
    assert_eq!((p.status.as_u16(), &b[..]), (201, &b"session 1"[..]));
    let (p, b) = read_body(send(&["session=bob; theme=dark"], "k-h2-1").await).await;
    assert_eq!(
        (header(&p, "set-cookie"), &b[..]),
        ("session=rotated-2; HttpOnly".into(), &b"session 2"[..])
    );
    let (p, _) = read_body(send(&["session=alice", "theme=dark"], "k-h2-1").await).await;
    assert_eq!(p.status.as_u16(), 409, "Alice, her cookie in two crumbs");
    assert_eq!(header(&p, "set-cookie"), "");
    assert_eq!(up.requests(), 2);
}
