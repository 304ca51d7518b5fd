//! `rediss://`: the shared state over TLS through rustls, verifying the
//! server against the system's trust roots — here a private CA named by
//! `SSL_CERT_FILE`, which is why this test has a binary of its own (the
//! variable is process-wide). A server the roots do not vouch for is never
//! used. Skips, saying so, without redis-server.
#![allow(clippy::unwrap_used)]

mod common;

use common::redis_server::RedisServer;
use std::time::Duration;
use weir::config::{StateBackend, StateConfig};
use weir::metrics::state::StateMetrics;
use weir::state::fleet::Fleet;

fn config(redis: &RedisServer) -> StateConfig {
    StateConfig {
        backend: StateBackend::Redis,
        url: Some(redis.url()),
        key_prefix: "tls:".into(),
        timeout: Duration::from_millis(250),
        refresh: Duration::from_millis(200),
        ..StateConfig::default()
    }
}

#[test]
fn rediss_is_verified_against_the_trust_roots() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = common::third_party::nginx_tls_files(dir.path());
    let Some(redis) = RedisServer::start_tls(&cert, &key) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // An empty trust store: the server's certificate is not trusted.
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    std::env::set_var("SSL_CERT_FILE", &empty);
    rt.block_on(async {
        let f = Fleet::start(&config(&redis), StateMetrics::unregistered()).unwrap();
        assert!(!f.wait_up(Duration::from_millis(700)).await, "{f:?}");
        assert!(f.metrics().errors("ping") >= 1);
        let line = f.status_line();
        assert!(line.starts_with("state: redis unavailable"), "{line}");
        assert!(line.contains("certificate"), "{line}");
    });
    // Trusting the test CA, the same server is used.
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    std::env::set_var("SSL_CERT_FILE", &ca);
    rt.block_on(async {
        let f = Fleet::start(&config(&redis), StateMetrics::unregistered()).unwrap();
        assert!(
            f.wait_up(Duration::from_secs(5)).await,
            "{}",
            f.status_line()
        );
        assert!(f.publish_open("api", Duration::from_secs(5)).await.unwrap());
        assert!(f.refresh(&["api"]).await.unwrap()[0].is_some());
    });
}
