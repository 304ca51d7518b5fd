//! The shared state's connection against a server that does not speak
//! Redis (docs/reference/fleet.md#fleet-state): whatever bytes come back, the
//! connection is dropped and made again with the supervisor's backoff, so
//! that a real `redis-server` started on the same port is in use within
//! `refresh` + 1 s; and a server that answers well-formed replies of the
//! wrong type costs one warning a minute per operation, not a line per
//! call. The fake servers are raw TCP listeners; the real one is Debian's
//! `redis-server` (tests/common/redis_server.rs), skipped without it.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::redis_server::{self, RedisServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use weir::config::{StateBackend, StateConfig};
use weir::metrics::state::StateMetrics;
use weir::state::fleet::Fleet;

const REFRESH: Duration = Duration::from_millis(200);

fn config(port: u16) -> StateConfig {
    StateConfig {
        backend: StateBackend::Redis,
        url: Some(format!("redis://127.0.0.1:{port}/0")),
        key_prefix: "garbage:".into(),
        timeout: Duration::from_millis(250),
        refresh: REFRESH,
        ..StateConfig::default()
    }
}

/// A listener on a free port that answers every read on every connection
/// with what `answer` makes of the bytes read; it and its connections end
/// when it is dropped.
struct Fake {
    port: u16,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

type Answer = Arc<dyn Fn(&[u8]) -> Vec<u8> + Send + Sync>;

impl Fake {
    async fn start(answer: fn(&[u8]) -> Vec<u8>) -> Fake {
        Fake::start_on(0, Arc::new(answer)).await
    }

    async fn start_on(port: u16, answer: Answer) -> Fake {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::Relaxed);
                conns.spawn(serve(s, Arc::clone(&answer)));
            }
        });
        Fake {
            port,
            connections,
            task,
        }
    }

    /// Stops listening and closes every connection it holds.
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn serve(mut s: TcpStream, answer: Answer) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if s.write_all(&answer(&buf[..n])).await.is_err() {
            return;
        }
    }
}

/// The garbage the probe sent: an HTTP answer, a bulk string without a
/// length, a type byte RESP does not have, an array nested 200,000 deep.
fn http(_: &[u8]) -> Vec<u8> {
    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_vec()
}
fn bad_length(_: &[u8]) -> Vec<u8> {
    b"$abc\r\n".to_vec()
}
fn unknown_type(_: &[u8]) -> Vec<u8> {
    b"?\r\n".to_vec()
}
fn nested(_: &[u8]) -> Vec<u8> {
    b"*1\r\n".repeat(200_000)
}

async fn garbage_then_redis(name: &str, answer: fn(&[u8]) -> Vec<u8>) {
    if !redis_server::available() {
        // Says SKIPPED, or fails with WEIR_REQUIRE_REDIS set.
        assert!(RedisServer::start().is_none());
        return;
    }
    let fake = Fake::start(answer).await;
    let port = fake.port;
    let f = Fleet::start(&config(port), StateMetrics::unregistered()).unwrap();
    // Until the fake has been dialled and answered a few times.
    let start = tokio::time::Instant::now();
    while fake.connections.load(Ordering::Relaxed) < 2 && start.elapsed() < Duration::from_secs(5) {
        let _ = f.refresh(&["api"]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!f.is_up(), "{name}: up on a server that speaks no RESP");
    assert!(
        f.refresh(&["api"]).await.is_err(),
        "{name}: a call answered"
    );
    fake.stop().await;
    let redis = RedisServer::start_on(port).unwrap();
    let limit = REFRESH + Duration::from_secs(1);
    assert!(
        f.wait_up(limit).await,
        "{name}: sharing not back within {limit:?} of redis-server: {}",
        f.status_line()
    );
    assert_eq!(f.refresh(&["api"]).await.unwrap(), [None], "{name}");
    assert!(f.publish_open("api", Duration::from_secs(1)).await.unwrap());
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_answer_then_redis_recovers() {
    garbage_then_redis("HTTP/1.1 400", http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_length_that_is_no_number_then_redis_recovers() {
    garbage_then_redis("$abc", bad_length).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_type_byte_then_redis_recovers() {
    garbage_then_redis("?", unknown_type).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_nested_200000_deep_then_redis_recovers() {
    garbage_then_redis("*1 x 200000", nested).await;
}

/// Answers `PING` with `+PONG` and every other command with a string:
/// well-formed RESP of a type no weir call expects.
fn wrong_types(read: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    // One reply per command: each starts with `*` (an array of bulk
    // strings), its name is the first bulk string.
    let text = String::from_utf8_lossy(read);
    for cmd in text.split('*').skip(1) {
        let name = cmd.split("\r\n").nth(2).unwrap_or("");
        if name.eq_ignore_ascii_case("PING") {
            out.extend_from_slice(b"+PONG\r\n");
        } else if !name.is_empty() {
            out.extend_from_slice(b"$3\r\nabc\r\n");
        }
    }
    out
}

/// Answers `PING` with `+PONG` and every other command with bytes that
/// are not RESP: each call takes the backend for down, each PING up again.
/// (The connection's handshake, `CLIENT SETINFO`, gets well-formed
/// replies: with garbage there the backend never comes up at all.)
fn garbage_but_pong(read: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(read).to_ascii_uppercase();
    match text.contains("PING") || text.contains("CLIENT") {
        true => wrong_types(read),
        false => b"?\r\n".to_vec(),
    }
}

// One thread, so that the subscriber set for this test sees the
// supervisor's lines too.
#[tokio::test(flavor = "current_thread")]
async fn wrong_types_cost_a_warning_a_minute_not_a_line_a_call() {
    few_lines(wrong_types).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_that_flaps_costs_a_warning_a_minute_not_a_line_a_call() {
    few_lines(garbage_but_pong).await;
}

async fn few_lines(answer: fn(&[u8]) -> Vec<u8>) {
    let logs = common::Captured::default();
    let _guard = logs.install();
    let fake = Fake::start(answer).await;
    let f = Fleet::start(&config(fake.port), StateMetrics::unregistered()).unwrap();
    assert!(
        f.wait_up(Duration::from_secs(5)).await,
        "{}",
        f.status_line()
    );
    let fp = weir::policy::idempotency::Fingerprint::new("POST", "/charges", b"{}");
    let mut failed = 0;
    for i in 0..200 {
        let key = format!("k-{i}");
        if f.idempotency_begin("api", &key, &fp, Duration::from_secs(10))
            .await
            .is_err()
        {
            failed += 1;
        }
        let _ = f.refresh(&["api"]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        failed, 200,
        "a reply no call asks for was taken for an answer"
    );
    let lines = logs.lines_of("weir::state::fleet");
    assert!(
        lines.len() <= 6,
        "{} lines from weir::state::fleet for 400 failed calls:\n{}",
        lines.len(),
        lines.join("\n")
    );
    fake.stop().await;
}

/// What a Redis with no keys answers to what weir sends: PONG, OK to the
/// handshake, -2 to each `PTTL`.
fn empty_redis(read: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(read);
    let mut out = Vec::new();
    for cmd in text.split('*').skip(1) {
        match cmd.split("\r\n").nth(2).unwrap_or("") {
            "" => {}
            n if n.eq_ignore_ascii_case("PING") => out.extend_from_slice(b"+PONG\r\n"),
            n if n.eq_ignore_ascii_case("PTTL") => out.extend_from_slice(b":-2\r\n"),
            _ => out.extend_from_slice(b"+OK\r\n"),
        }
    }
    out
}

use proptest::strategy::Strategy;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..Default::default()
    })]

    /// Whatever bytes a server answers with, once a server that speaks
    /// Redis is on that port the fleet is up within `refresh` + 1 s.
    #[test]
    fn any_reply_bytes_then_a_redis_recovers(
        garbage in proptest::prop_oneof![
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            // RESP-looking prefixes with arbitrary tails.
            (proptest::sample::select(vec![&b"*"[..], b"$", b":", b"+", b"-", b"%", b"~", b">", b"*1\r\n*"]),
             proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64))
                .prop_map(|(p, t)| [p, &t[..]].concat()),
        ]
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let bytes = garbage.clone();
            let fake = Fake::start_on(0, Arc::new(move |_: &[u8]| bytes.clone())).await;
            let port = fake.port;
            let f = Fleet::start(&config(port), StateMetrics::unregistered()).unwrap();
            let start = tokio::time::Instant::now();
            // Until the fake has answered, failed a connection and been
            // dialled again (bytes that are only incomplete RESP hold the
            // first connection until its timeout instead).
            while fake.connections.load(Ordering::Relaxed) < 2
                && start.elapsed() < Duration::from_millis(1200)
            {
                let _ = f.refresh(&["api"]).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            fake.stop().await;
            let good = Fake::start_on(port, Arc::new(empty_redis)).await;
            // It comes back in about 0.1 s; the margin is for a stalled
            // runner (`wait_up` returns as soon as it is up).
            let limit = REFRESH + Duration::from_secs(5);
            assert!(f.wait_up(limit).await, "{garbage:?}: {}", f.status_line());
            assert_eq!(f.refresh(&["api"]).await.unwrap(), [None], "{garbage:?}");
            good.stop().await;
        });
    }
}
