//! The fleet through a Redis failover (docs/reference/fleet.md#when-redis-fails),
//! with real processes: a primary, a replica and three Sentinels, each a
//! `redis-server` started on a free loopback port and killed by its PID.
//! Two weir instances find the primary through the Sentinels. Keyed POSTs
//! go through A while the replica lags (`DEBUG SLEEP`); the primary is
//! then killed (SIGKILL); Sentinel promotes the replica, both instances
//! follow it, and every key re-sent through B is replayed: delivered once.
//! The shared breaker is shared before and after.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::redis_server::RedisServer;
use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

#[allow(clippy::disallowed_methods)] // real time: other processes are waited for
fn real_now() -> std::time::Instant {
    std::time::Instant::now()
}

/// Polls `f` every 100 ms until it holds; false after `limit`.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = real_now() + limit;
    while real_now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// A primary, its replica (which takes `DEBUG`), and three Sentinels that
/// watch it as `m` and know the replica.
struct Replicated {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl Replicated {
    fn start() -> Option<Replicated> {
        let primary = RedisServer::start()?;
        let p = primary.port.to_string();
        let replica = RedisServer::start_args(
            None,
            &[
                "--replicaof",
                "127.0.0.1",
                &p,
                "--enable-debug-command",
                "yes",
            ],
        )?;
        assert!(
            eventually(Duration::from_secs(10), || replica
                .command(&["INFO", "replication"])
                .contains("master_link_status:up")),
            "the replica did not sync: {}",
            replica.command(&["INFO", "replication"])
        );
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::sentinel("m", primary.port).unwrap())
            .collect();
        // A Sentinel learns the replicas from the primary's INFO: until it
        // has, it has nothing to promote.
        let r = replica.port.to_string();
        for s in &sentinels {
            assert!(
                eventually(Duration::from_secs(20), || s
                    .command(&["SENTINEL", "REPLICAS", "m"])
                    .contains(&r)),
                "sentinel {} never saw the replica",
                s.port
            );
        }
        Some(Replicated {
            primary,
            replica,
            sentinels,
        })
    }

    fn urls(&self) -> String {
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("\"redis://127.0.0.1:{}\"", s.port))
            .collect();
        urls.join(", ")
    }

    /// The primary's port as the first Sentinel names it now.
    fn named_primary(&self) -> String {
        self.sentinels[0].command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])
    }
}

/// An upstream that counts the POSTs of each idempotency key.
async fn counting() -> (TestUpstream, Arc<Mutex<BTreeMap<String, usize>>>) {
    let seen = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            let key = req
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let n = {
                let mut m = s.lock().unwrap();
                let n = m.entry(key.clone()).or_default();
                *n += 1;
                *n
            };
            Response::builder()
                .status(201)
                .body(body(format!("order {key} #{n}")))
                .unwrap()
        }
    })
    .await;
    (up, seen)
}

async fn weir(cluster: &Replicated, up: &TestUpstream) -> Runtime {
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
         [state]\nbackend = \"redis\"\nsentinels = [{}]\nmaster_name = \"m\"\n\
         key_prefix = \"failover:\"\ntimeout = \"200ms\"\nwait_replicas = 1\n\
         wait_timeout = \"1s\"\non_unavailable = \"refuse\"\n\n\
         [upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        cluster.urls(),
        up.url()
    );
    let config = match Config::parse(Path::new("failover-test.toml"), &src) {
        Ok(c) => c,
        Err(e) => panic!("test config invalid:\n{e}\n---\n{src}"),
    };
    let opts = Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    let rt = Runtime::start(config, opts).await.unwrap();
    let f = rt.proxy.fleet().unwrap();
    assert!(
        f.wait_up(Duration::from_secs(10)).await,
        "{}",
        f.status_line()
    );
    rt
}

/// (status, `x-weir-error`, replayed) of a keyed POST.
async fn post(rt: &Runtime, key: &str) -> (u16, String, bool) {
    let req = Request::post(format!("http://{}/orders", rt.proxy.listen_addr()))
        .header("host", "svc")
        .header("idempotency-key", key)
        .body(body("amount=5"))
        .unwrap();
    let Ok(resp) = client().request(req).await else {
        return (0, "transport".into(), false);
    };
    let (parts, b) = resp.into_parts();
    let _ = b.collect().await;
    let h = |n: &str| header(&parts, n);
    (
        parts.status.as_u16(),
        h("x-weir-error"),
        h("idempotent-replayed") == "true",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_writes_survive_a_sentinel_failover_while_the_replica_lags() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(mut cluster) = tokio::task::spawn_blocking(Replicated::start)
        .await
        .unwrap()
    else {
        return;
    };
    let (up, seen) = counting().await;
    let a = weir(&cluster, &up).await;
    let b = weir(&cluster, &up).await;
    let (fa, fb) = (a.proxy.fleet().unwrap(), b.proxy.fleet().unwrap());
    assert!(
        fa.status_line().contains("sentinel m at"),
        "{}",
        fa.status_line()
    );

    // The shared breaker before: A's trip is B's.
    assert!(fa
        .publish_open("before", Duration::from_secs(60))
        .await
        .unwrap());
    assert!(fb.open_remaining("before").await.unwrap().is_some());

    // The replica stops for 600 ms while 12 keyed writes go through A:
    // each waits for the replica's acknowledgement (wait_timeout 1 s).
    let replica_port = cluster.replica.port;
    let lag = std::thread::spawn(move || {
        let r = RedisServer::command_port(replica_port, &["DEBUG", "SLEEP", "0.6"]);
        assert!(r.starts_with("+OK"), "DEBUG SLEEP: {r:?}");
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let keys: Vec<String> = (0..12).map(|i| format!("pay-{i}")).collect();
    let sent = futures_util::future::join_all(keys.iter().map(|k| post(&a, k))).await;
    lag.join().unwrap();
    for (k, r) in keys.iter().zip(&sent) {
        assert_eq!(r, &(201, String::new(), false), "{k}");
    }
    assert_eq!(seen.lock().unwrap().len(), 12);

    // The primary dies. Sentinel promotes the replica.
    let old = cluster.primary.port.to_string();
    cluster.primary.kill();
    let promoted = tokio::task::spawn_blocking({
        let replica = cluster.replica.port.to_string();
        let sentinel = cluster.sentinels[0].port;
        move || {
            eventually(Duration::from_secs(20), || {
                RedisServer::command_port(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])
                    .contains(&replica)
            })
        }
    })
    .await
    .unwrap();
    assert!(
        promoted,
        "no failover: {} (was {old})",
        cluster.named_primary()
    );

    // Both instances follow the new primary by themselves.
    for (name, f) in [("A", &fa), ("B", &fb)] {
        assert!(
            f.wait_up(Duration::from_secs(10)).await
                && f.publish_open("probe", Duration::from_millis(1))
                    .await
                    .is_ok(),
            "{name} did not follow the failover: {}",
            f.status_line()
        );
    }

    // Every key re-sent through B is replayed from its record: the
    // upstream saw each once.
    for k in &keys {
        let r = post(&b, k).await;
        assert_eq!(
            r,
            (201, String::new(), true),
            "{k} through B after the failover"
        );
    }
    let counts = seen.lock().unwrap().clone();
    assert!(
        counts.values().all(|&n| n == 1),
        "delivered twice: {counts:?}"
    );
    assert_eq!(counts.len(), 12);

    // The shared breaker after: the trip from before survived, and a new
    // one is shared too.
    assert!(fb.open_remaining("before").await.unwrap().is_some());
    assert!(fb
        .publish_open("after", Duration::from_secs(60))
        .await
        .unwrap());
    assert!(fa.open_remaining("after").await.unwrap().is_some());
    assert_eq!(fa.metrics().unreplicated_count("idempotency_begin"), 0);
}

/// With no primary at all (every Redis process gone), a keyed write with
/// `on_unavailable = "refuse"` is refused with 503 `state_unavailable` and
/// `Retry-After`, and never reaches the upstream; an unkeyed one goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_primary_a_keyed_write_is_refused_not_guessed() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(mut cluster) = tokio::task::spawn_blocking(Replicated::start)
        .await
        .unwrap()
    else {
        return;
    };
    let (up, seen) = counting().await;
    let a = weir(&cluster, &up).await;
    cluster.primary.kill();
    cluster.replica.kill();
    let fa = a.proxy.fleet().unwrap();
    let down = tokio::time::timeout(Duration::from_secs(5), async {
        while fa.is_up() {
            let _ = fa.open_remaining("x").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(down.is_ok(), "{}", fa.status_line());
    let r = post(&a, "no-primary").await;
    assert_eq!((r.0, r.1.as_str()), (503, "state_unavailable"));
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(fa.metrics().fallbacks("refused"), 1);
    let req = Request::get(format!("http://{}/orders", a.proxy.listen_addr()))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 201);
}

/// What `wait_replicas = 1` adds to a keyed write on loopback: the median
/// and 99th percentile of `begin` (the call a keyed write waits for before
/// it is forwarded) and of the completed record's write, 2,000 of each,
/// against a primary with one replica, with `wait_replicas` 0 and 1. A
/// measurement, not a check: `cargo test --locked --test it
/// fleet_failover::what_waiting_for_a_replica_costs -- --ignored --nocapture`
/// (figures in bench/RESULTS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn what_waiting_for_a_replica_costs() {
    use weir::config::{StateBackend, StateConfig};
    use weir::metrics::state::StateMetrics;
    use weir::policy::idempotency::{Fingerprint, StoredResponse};
    use weir::state::fleet::Fleet;
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let p = primary.port.to_string();
    let replica = RedisServer::start_args(None, &["--replicaof", "127.0.0.1", &p]).unwrap();
    assert!(eventually(Duration::from_secs(10), || replica
        .command(&["INFO", "replication"])
        .contains("master_link_status:up")));
    let response = StoredResponse::from_buffer(201, b"content-type: text/plain\r\nok".to_vec(), 26);
    for wait in [0u8, 1, 0, 1] {
        let cfg = StateConfig {
            backend: StateBackend::Redis,
            url: Some(primary.url()),
            key_prefix: format!("cost{wait}:"),
            timeout: Duration::from_millis(500),
            refresh: Duration::from_secs(1),
            wait_replicas: wait,
            wait_timeout: Duration::from_millis(500),
            ..StateConfig::default()
        };
        let f = Fleet::start(&cfg, StateMetrics::unregistered()).unwrap();
        assert!(f.wait_up(Duration::from_secs(5)).await);
        let (mut begins, mut completes) = (Vec::new(), Vec::new());
        let lease = Duration::from_secs(30);
        for i in 0..2000 {
            let key = format!("k{i}-{}", weir::clock::fresh_seed());
            let fp = Fingerprint::new("POST", "/orders", key.as_bytes());
            #[allow(clippy::disallowed_methods)]
            let t = std::time::Instant::now();
            f.idempotency_begin("svc", &key, &fp, lease).await.unwrap();
            begins.push(t.elapsed());
            #[allow(clippy::disallowed_methods)]
            let t = std::time::Instant::now();
            f.idempotency_complete("svc", &key, &fp, &response, lease)
                .await
                .unwrap();
            completes.push(t.elapsed());
        }
        let q = |v: &mut Vec<Duration>, q: f64| {
            v.sort();
            v[((v.len() as f64 - 1.0) * q) as usize]
        };
        println!(
            "wait_replicas = {wait}: begin p50 {:?} p99 {:?}; complete p50 {:?} p99 {:?}",
            q(&mut begins, 0.5),
            q(&mut begins, 0.99),
            q(&mut completes, 0.5),
            q(&mut completes, 0.99)
        );
    }
}

/// `weir chaos redis-failover` from the outside: it starts its own Redis
/// processes, kills the primary, and with `wait_replicas = 1` and
/// `on_unavailable = "refuse"` reports no key delivered twice, some writes
/// refused during the failover, the state back, and the breaker shared
/// before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_failover_command_reports_no_duplicates_when_refusing() {
    let _heavy = common::one_heavy_at_a_time().await;
    if !common::redis_server::available() {
        // RedisServer::start says SKIPPED, or fails with WEIR_REQUIRE_REDIS.
        assert!(RedisServer::start().is_none());
        return;
    }
    let out = tokio::task::spawn_blocking(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "chaos",
                "redis-failover",
                "--duration",
                "3s",
                "--rate",
                "40",
            ])
            .args([
                "--wait-replicas",
                "1",
                "--on-unavailable",
                "refuse",
                "--json",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    let row = &rows[0];
    assert_eq!(row["keys"], 120, "{row}");
    assert_eq!(row["delivered_twice"], 0, "{row}");
    assert!(row["refused"].as_u64().unwrap() > 0, "{row}");
    assert!(row["state_back_ms"].as_u64().is_some(), "{row}");
    assert_eq!(row["breaker_shared_before"], true, "{row}");
    assert_eq!(row["breaker_shared_after"], true, "{row}");
}

/// `weir chaos fleet` from the outside, small: every instance connects,
/// requests flow, unkeyed ones make almost no round trip, and keyed
/// writes' `begin` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_fleet_command_measures_a_small_fleet() {
    let _heavy = common::one_heavy_at_a_time().await;
    if !common::redis_server::available() {
        assert!(RedisServer::start().is_none());
        return;
    }
    let out = tokio::task::spawn_blocking(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["chaos", "fleet", "--instances", "10", "--warmup", "1s"])
            .args(["--measure", "2s", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    // 10 instances x 200 requests/s for about 2 s.
    let requests = r["requests"].as_u64().unwrap();
    assert!((3000..=5000).contains(&requests), "{r}");
    assert!(r["keyed"].as_u64().unwrap() > 0, "{r}");
    assert!(r["keyed_round_trips"].as_u64().unwrap() > 0, "{r}");
    assert!(r["per_request"].as_f64().unwrap() < 0.2, "{r}");
    assert!(r["begin_p99_ms"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
}

/// While the only replica is stopped, 20 keyed writes at once are told
/// that their claims are not replicated, and each caller then forgets what
/// its claim may have left (as `on_unavailable` does). No claim may land
/// after that: once the replica is back, every key is free. (Before, each
/// claim had been sent and queued behind the others' `WAIT`s in Redis; it
/// ran there after its caller had given up and after its forget, which
/// went on the other connection, and held the key in flight for its lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_given_up_on_never_lands_later() {
    use weir::config::{StateBackend, StateConfig};
    use weir::metrics::state::StateMetrics;
    use weir::policy::idempotency::{Action, Fingerprint};
    use weir::state::fleet::{Fleet, StateError};
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let p = primary.port.to_string();
    let replica = RedisServer::start_args(None, &["--replicaof", "127.0.0.1", &p]).unwrap();
    assert!(eventually(Duration::from_secs(10), || replica
        .command(&["INFO", "replication"])
        .contains("master_link_status:up")));
    let cfg = StateConfig {
        backend: StateBackend::Redis,
        url: Some(primary.url()),
        key_prefix: "late:".into(),
        timeout: Duration::from_millis(20),
        refresh: Duration::from_secs(1),
        wait_replicas: 1,
        wait_timeout: Duration::from_millis(50),
        ..StateConfig::default()
    };
    let f = Fleet::start(&cfg, StateMetrics::unregistered()).unwrap();
    assert!(f.wait_up(Duration::from_secs(5)).await);
    let lease = Duration::from_secs(30);
    let fp = |k: &str| Fingerprint::new("POST", "/orders", k.as_bytes());
    replica.pause(true);
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let f = f.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                let r = f.idempotency_begin("svc", &key, &fp(&key), lease).await;
                assert!(
                    matches!(r, Err(StateError::Unreplicated | StateError::Timeout(_))),
                    "{r:?}"
                );
                let _ = f.idempotency_forget("svc", &key, &fp(&key)).await;
            })
        })
        .collect();
    for c in calls {
        c.await.unwrap();
    }
    // Long enough for 20 queued 50 ms WAITs to have run out one by one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    replica.pause(false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..20 {
        let key = format!("k{i}");
        let r = f.idempotency_begin("svc", &key, &fp(&key), lease).await;
        assert!(matches!(r, Ok(Action::Forward)), "{key}: {r:?}");
    }
}

/// The first Sentinel listed stops answering (SIGSTOP: its connections
/// stay open, nothing comes back) before weir starts, and stays so through
/// a failover the other two carry out: weir finds the primary and then
/// follows the promoted one through the two that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_is_passed_over() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(mut cluster) = tokio::task::spawn_blocking(Replicated::start)
        .await
        .unwrap()
    else {
        return;
    };
    cluster.sentinels[0].pause(true);
    let (up, seen) = counting().await;
    let a = weir(&cluster, &up).await;
    let b = weir(&cluster, &up).await;
    let (fa, fb) = (a.proxy.fleet().unwrap(), b.proxy.fleet().unwrap());
    let keys: Vec<String> = (0..5).map(|i| format!("quiet-{i}")).collect();
    for k in &keys {
        assert_eq!(post(&a, k).await, (201, String::new(), false), "{k}");
    }

    cluster.primary.kill();
    let promoted = tokio::task::spawn_blocking({
        let replica = cluster.replica.port.to_string();
        let sentinel = cluster.sentinels[1].port;
        move || {
            eventually(Duration::from_secs(20), || {
                RedisServer::command_port(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])
                    .contains(&replica)
            })
        }
    })
    .await
    .unwrap();
    assert!(promoted, "the two Sentinels that answer did not fail over");
    for (name, f) in [("A", &fa), ("B", &fb)] {
        let end = real_now() + Duration::from_secs(15);
        loop {
            let up = f.wait_up(Duration::from_secs(1)).await
                && f.publish_open("probe", Duration::from_millis(1))
                    .await
                    .is_ok();
            if up {
                break;
            }
            assert!(
                real_now() < end,
                "{name} did not follow the failover: {}",
                f.status_line()
            );
        }
    }
    for k in &keys {
        assert_eq!(post(&b, k).await, (201, String::new(), true), "{k}");
    }
    assert!(seen.lock().unwrap().values().all(|&n| n == 1));
    cluster.sentinels[0].pause(false);
}
