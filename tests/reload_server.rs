//! A reload that changes `[server]` is honest (docs/reference/reload.md#reload):
//! a new shared listener or an upstream's dedicated listener is bound and
//! serves at once, the old one closed; a change weir cannot apply to the
//! running process (`admin`, `max_connections`) is refused with 422 naming
//! the field where the file sets it, and the running config stays — it is
//! never reported as applied while the old value serves.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::third_party::free_port;
use common::*;
use hyper::Request;
use std::path::{Path, PathBuf};
use weir::config::Config;
use weir::runtime::{Options, Runtime};

fn config(up: &str, listen: u16, admin: u16, dedicated: u16, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin = \"127.0.0.1:{admin}\"\n{extra}\n\
         [upstreams.svc]\nurl = \"{up}\"\nhosts = [\"svc\"]\n\
         [upstreams.side]\nurl = \"{up}\"\nlisten = \"127.0.0.1:{dedicated}\"\n"
    )
}

async fn start(dir: &Path, toml: &str) -> (Runtime, PathBuf) {
    let path = dir.join("weir.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let opts = Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    (Runtime::start(config, opts).await.unwrap(), path)
}

/// `POST /reload` on `admin`: (status, body).
async fn reload(admin: u16) -> (u16, String) {
    let req = Request::post(format!("http://127.0.0.1:{admin}/reload"))
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    (
        parts.status.as_u16(),
        String::from_utf8_lossy(&b).into_owned(),
    )
}

/// A GET through the listener on `port` with `Host: svc`: the status, or
/// `None` when nothing listens.
async fn get_on(port: u16) -> Option<u16> {
    let req = Request::get(format!("http://127.0.0.1:{port}/"))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let resp = client().request(req).await.ok()?;
    Some(resp.status().as_u16())
}

#[tokio::test]
async fn listeners_move_on_reload_and_fixed_fields_are_refused_by_name() {
    let up = TestUpstream::text("ok").await;
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin, side) = (free_port(), free_port(), free_port());
    let (rt, path) = start(dir.path(), &config(&up.url(), listen, admin, side, "")).await;
    assert_eq!(get_on(listen).await, Some(200));
    assert_eq!(get_on(side).await, Some(200));

    // The shared listener and the dedicated one move: served at once.
    let (listen2, side2) = (free_port(), free_port());
    std::fs::write(&path, config(&up.url(), listen2, admin, side2, "")).unwrap();
    let (status, text) = reload(admin).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(get_on(listen2).await, Some(200), "the new shared listener");
    assert_eq!(get_on(side2).await, Some(200), "the new dedicated listener");
    // The old ones are closed (after draining, and nothing was in flight).
    let mut closed = false;
    for _ in 0..50 {
        if get_on(listen).await.is_none() && get_on(side).await.is_none() {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(closed, "the old listeners still serve");

    // The admin address cannot move under a running process: refused,
    // named, located, and the running config says the old address.
    let admin2 = free_port();
    let moved = config(&up.url(), listen2, admin2, side2, "");
    std::fs::write(&path, &moved).unwrap();
    let (status, text) = reload(admin).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("server.admin"), "{text}");
    assert!(text.contains("weir.toml:3:"), "{text}");
    assert!(text.contains("cannot change on reload"), "{text}");
    let (_, body) = {
        let req = Request::get(format!("http://127.0.0.1:{admin}/config"))
            .body(body(""))
            .unwrap();
        read_body(client().request(req).await.unwrap()).await
    };
    let shown = String::from_utf8_lossy(&body);
    assert!(shown.contains(&format!("127.0.0.1:{admin}")), "{shown}");
    assert!(!shown.contains(&format!("127.0.0.1:{admin2}")), "{shown}");
    // Nothing of that file was applied: it moved nothing else either.
    assert!(get_on(admin2).await.is_none());

    // So is max_connections; shutdown_timeout is read when weir stops.
    let limited = config(&up.url(), listen2, admin, side2, "max_connections = 7");
    std::fs::write(&path, limited).unwrap();
    let (status, text) = reload(admin).await;
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("server.max_connections"), "{text}");
    let grace = config(
        &up.url(),
        listen2,
        admin,
        side2,
        "shutdown_timeout = \"3s\"",
    );
    std::fs::write(&path, grace).unwrap();
    let (status, text) = reload(admin).await;
    assert_eq!(status, 200, "{text}");
    let snap = rt.proxy.snapshot();
    assert_eq!(snap.config.server.shutdown_timeout.as_secs(), 3);
    rt.shutdown(std::time::Duration::from_secs(1)).await;
}
