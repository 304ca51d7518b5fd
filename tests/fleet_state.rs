//! The shared state on a real redis-server (docs/reference/fleet.md#fleet-state):
//! several `Fleet` handles on one server stand for several weir instances.
//! Published trips and the one probe, the Lua token bucket, the idempotency
//! store across instances, and what a call does while Redis is killed,
//! stopped and restarted. Each test starts its own redis-server
//! (tests/common/redis_server.rs) and skips, saying so, without one.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::redis_server::RedisServer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir::config::{StateBackend, StateConfig};
use weir::metrics::state::StateMetrics;
use weir::policy::idempotency::{Action, Claim, Fingerprint, Record, StoredResponse};
use weir::policy::leased_tokens::Take;
use weir::state::fleet::{Fleet, FleetBucket, ProbeClaim, StateError};

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// A generous per-call timeout for the functional tests (a loaded CI
/// machine must not turn a slow answer into a failure); the outage tests
/// set their own.
const TIMEOUT: Duration = Duration::from_millis(250);

fn config(redis: &RedisServer, timeout: Duration) -> StateConfig {
    StateConfig {
        backend: StateBackend::Redis,
        url: Some(redis.url()),
        key_prefix: "test:".into(),
        timeout,
        refresh: ms(200),
        ..StateConfig::default()
    }
}

/// `n` instances on `redis`, each connected.
async fn fleet(redis: &RedisServer, n: usize, timeout: Duration) -> Vec<Fleet> {
    let mut out = Vec::new();
    for _ in 0..n {
        let f = Fleet::start(&config(redis, timeout), StateMetrics::unregistered()).unwrap();
        assert!(
            f.wait_up(Duration::from_secs(5)).await,
            "{f:?} never came up"
        );
        out.push(f);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trip_is_published_and_one_instance_wins_the_probe() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 3, TIMEOUT).await;
    let (a, b, c) = (&f[0], &f[1], &f[2]);
    assert_ne!(a.instance_id(), b.instance_id());
    assert_eq!(a.instance_id().len(), 16);

    assert!(a.publish_open("api", ms(400)).await.unwrap());
    // A shorter interval never shortens the published one.
    assert!(!b.publish_open("api", ms(100)).await.unwrap());
    let seen = c.refresh(&["api", "other"]).await.unwrap();
    assert!(
        seen[0].is_some_and(|d| d > ms(200) && d <= ms(400)),
        "{seen:?}"
    );
    assert_eq!(seen[1], None);
    assert!(b.open_remaining("api").await.unwrap().is_some());
    assert!(matches!(
        b.claim_probe("api", ms(500)).await.unwrap(),
        ProbeClaim::Open { .. }
    ));

    // Open interval over: every instance asks at once, one wins.
    tokio::time::sleep(ms(450)).await;
    assert_eq!(c.refresh(&["api"]).await.unwrap(), [None]);
    let claims = futures_util::future::join_all(
        f.iter()
            .cycle()
            .take(12)
            .map(|x| x.claim_probe("api", ms(500))),
    )
    .await;
    let claims: Vec<ProbeClaim> = claims.into_iter().map(Result::unwrap).collect();
    let won = claims.iter().filter(|c| **c == ProbeClaim::Won).count();
    assert_eq!(won, 1, "{claims:?}");
    assert!(claims
        .iter()
        .all(|c| matches!(c, ProbeClaim::Won | ProbeClaim::Held { .. })));
    // join_all keeps the order: claim i was made by instance i % 3.
    let winner = claims.iter().position(|c| *c == ProbeClaim::Won).unwrap() % 3;
    let loser = &f[(winner + 1) % 3];
    // Only the owner closes.
    assert!(!loser.publish_closed("api").await.unwrap());
    assert!(f[winner].publish_closed("api").await.unwrap());
    assert_eq!(
        loser.claim_probe("api", ms(500)).await.unwrap(),
        ProbeClaim::Closed
    );

    // A new trip starts a new interval with a new probe.
    assert!(loser.publish_open("api", ms(100)).await.unwrap());
    assert!(matches!(
        a.claim_probe("api", ms(500)).await.unwrap(),
        ProbeClaim::Open { .. }
    ));
    tokio::time::sleep(ms(150)).await;
    assert_eq!(
        a.claim_probe("api", ms(500)).await.unwrap(),
        ProbeClaim::Won
    );
    assert!(a.metrics().commands("breaker_probe") >= 3);
    assert_eq!(a.metrics().errors("breaker_probe"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_bucket_grants_what_the_bucket_holds() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 3, TIMEOUT).await;
    // Explicit asks on a bucket of 1 rps, burst 5.
    let g = f[0].lease("slow", None, 1.0, 5, 3).await.unwrap();
    assert_eq!((g.wanted, g.granted, g.retry_in), (3, 3, Duration::ZERO));
    let g = f[1].lease("slow", None, 1.0, 5, 3).await.unwrap();
    assert_eq!((g.wanted, g.granted), (3, 2));
    assert!(g.retry_in > ms(900) && g.retry_in <= ms(1000), "{g:?}");
    let g = f[2].lease("slow", None, 1.0, 5, 3).await.unwrap();
    assert_eq!(g.granted, 0);
    // A keyed bucket is another bucket; an ask above burst is cut to it.
    let g = f[2]
        .lease("slow", Some("tenant-a"), 1.0, 5, 9)
        .await
        .unwrap();
    assert_eq!((g.wanted, g.granted), (5, 5));
    assert_eq!(f[0].metrics().leased("slow").get(), 3);

    // Three instances asking 10 at a time, as fast as answers come, for
    // about a second from a bucket of 100 rps, burst 20: together they get
    // what it holds — 20 + 100 per second since the first grant.
    let granted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = f
        .iter()
        .cloned()
        .map(|x| {
            let granted = Arc::clone(&granted);
            tokio::spawn(async move {
                while start.elapsed() < ms(1000) {
                    let g = x.lease("fast", None, 100.0, 20, 10).await.unwrap();
                    granted.fetch_add(u64::from(g.granted), Ordering::Relaxed);
                    tokio::time::sleep(ms(5)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let got = granted.load(Ordering::Relaxed) as f64;
    let most = 20.0 + 100.0 * elapsed + 1.0;
    assert!(got <= most, "{got} > {most}");
    assert!(got >= 0.8 * most - 10.0, "{got} ≪ {most}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_buckets_hold_a_fleet_limit_cheaply() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 3, TIMEOUT).await;
    let clock = weir::clock::Clock::new();
    let buckets: Vec<FleetBucket> = f
        .iter()
        .map(|x| FleetBucket::new(x.clone(), "api", None, 100.0, 20, clock))
        .collect();
    // Each instance offered 100 rps for 1.5 s; the fleet limit is 100 rps.
    let (mut admitted, mut asked) = (0u64, 0u64);
    let start = Instant::now();
    let mut tick = tokio::time::interval(ms(10));
    while start.elapsed() < ms(1500) {
        tick.tick().await;
        for b in &buckets {
            asked += 1;
            if b.take(clock.now()) == Take::Admit {
                admitted += 1;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let exact = 20.0 + 100.0 * elapsed;
    // Within the stated bound: 1.5 batches (of 10) per instance.
    let bound = 3.0 * 15.0;
    let got = admitted as f64;
    assert!(
        got <= exact + bound,
        "{got} admitted, at most {exact} + {bound}"
    );
    assert!(got >= 0.8 * exact - bound, "{got} admitted of {exact}");
    let calls: u64 = f.iter().map(|x| x.metrics().commands("lease")).sum();
    eprintln!("{admitted} admitted of {exact:.0}; {calls} lease calls for {asked} requests");
    assert!(
        calls as f64 <= 0.12 * asked as f64,
        "{calls} lease calls for {asked} requests"
    );
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::new("POST", "/charge", body.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_is_replayed_through_another_instance() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 2, TIMEOUT).await;
    let (a, b) = (&f[0], &f[1]);
    let lease = Duration::from_secs(30);
    let day = Duration::from_secs(86_400);
    let name = |r: Result<weir::policy::idempotency::Begin, StateError>| r.unwrap().name();

    assert_eq!(
        name(a.idempotency_begin("api", "k1", &fp("x"), lease).await),
        "forward"
    );
    assert_eq!(
        name(b.idempotency_begin("api", "k1", &fp("x"), lease).await),
        "in_flight"
    );
    assert_eq!(
        name(b.idempotency_begin("api", "k1", &fp("y"), lease).await),
        "reused"
    );
    let response = StoredResponse::new(
        201,
        [
            (&b"content-type"[..], &b"application/octet-stream"[..]),
            (b"x-id", b"7"),
        ],
        b"\x00binary\r\nbody\xff",
    );
    // Only the owner, with the same fingerprint, finishes the record.
    assert!(!b
        .idempotency_complete("api", "k1", &fp("x"), &response, day)
        .await
        .unwrap());
    assert!(!a
        .idempotency_complete("api", "k1", &fp("y"), &response, day)
        .await
        .unwrap());
    assert!(a
        .idempotency_complete("api", "k1", &fp("x"), &response, day)
        .await
        .unwrap());
    match b
        .idempotency_begin("api", "k1", &fp("x"), lease)
        .await
        .unwrap()
    {
        Action::Replay(r) => assert_eq!(r, response),
        other => panic!("replay expected, got {other:?}"),
    }
    assert_eq!(
        name(b.idempotency_begin("api", "k1", &fp("y"), lease).await),
        "reused"
    );
    // Records are per upstream.
    assert_eq!(
        name(b.idempotency_begin("other", "k1", &fp("y"), lease).await),
        "forward"
    );

    // Uncertain: the same request is forwarded again, by whoever gets it.
    assert_eq!(
        name(a.idempotency_begin("api", "k2", &fp("x"), lease).await),
        "forward"
    );
    assert!(a
        .idempotency_uncertain("api", "k2", &fp("x"), day)
        .await
        .unwrap());
    assert_eq!(
        name(b.idempotency_begin("api", "k2", &fp("y"), lease).await),
        "reused"
    );
    assert_eq!(
        name(b.idempotency_begin("api", "k2", &fp("x"), lease).await),
        "forward"
    );
    assert!(!a.idempotency_forget("api", "k2", &fp("x")).await.unwrap());
    assert!(b.idempotency_forget("api", "k2", &fp("x")).await.unwrap());
    assert_eq!(
        name(a.idempotency_begin("api", "k2", &fp("z"), lease).await),
        "forward"
    );
    let what = Record::CompletedNotReplayable;
    assert!(a
        .idempotency_finish("api", "k2", &fp("z"), what, None, day)
        .await
        .unwrap());
    assert_eq!(
        name(b.idempotency_begin("api", "k2", &fp("z"), lease).await),
        "not_replayable"
    );

    // An in-flight record whose owner never finishes is free after its lease.
    assert_eq!(
        name(a.idempotency_begin("api", "k3", &fp("x"), ms(100)).await),
        "forward"
    );
    tokio::time::sleep(ms(150)).await;
    assert_eq!(
        name(b.idempotency_begin("api", "k3", &fp("y"), lease).await),
        "forward"
    );
}

/// A body too large to hold streams: the key is claimed before its
/// fingerprint is known, and the fingerprint filled in once it has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_keyed_write_is_claimed_then_fingerprinted() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 2, TIMEOUT).await;
    let (a, b) = (&f[0], &f[1]);
    let lease = Duration::from_secs(30);
    let day = Duration::from_secs(86_400);
    assert_eq!(
        a.idempotency_claim("api", "big", lease).await.unwrap(),
        Claim::Forward
    );
    assert_eq!(
        b.idempotency_claim("api", "big", lease).await.unwrap(),
        Claim::InFlight
    );
    // Pending, the record matches any request: in flight, not reused.
    let begin = b
        .idempotency_begin("api", "big", &fp("y"), lease)
        .await
        .unwrap();
    assert_eq!(begin.name(), "in_flight");
    // Only the owner fills the fingerprint in, once.
    assert!(!b
        .idempotency_fingerprinted("api", "big", &fp("x"))
        .await
        .unwrap());
    assert!(a
        .idempotency_fingerprinted("api", "big", &fp("x"))
        .await
        .unwrap());
    assert!(!a
        .idempotency_fingerprinted("api", "big", &fp("z"))
        .await
        .unwrap());
    let begin = b
        .idempotency_begin("api", "big", &fp("y"), lease)
        .await
        .unwrap();
    assert_eq!(begin.name(), "reused");
    let response = StoredResponse::new(200, [], b"done");
    assert!(a
        .idempotency_complete("api", "big", &fp("x"), &response, day)
        .await
        .unwrap());
    // Done: a repeat reads its body whole, then `begin` decides.
    assert_eq!(
        b.idempotency_claim("api", "big", lease).await.unwrap(),
        Claim::Decide
    );
    match b
        .idempotency_begin("api", "big", &fp("x"), lease)
        .await
        .unwrap()
    {
        Action::Replay(r) => assert_eq!(r, response),
        other => panic!("replay expected, got {other:?}"),
    }
    // A claimed request that ends before its body passed whole still
    // records its end (its fingerprint is the pending one).
    let pending = Fingerprint::PENDING;
    assert_eq!(
        a.idempotency_claim("api", "cut", lease).await.unwrap(),
        Claim::Forward
    );
    assert!(a
        .idempotency_uncertain("api", "cut", &pending, day)
        .await
        .unwrap());
    assert_eq!(
        b.idempotency_claim("api", "cut", lease).await.unwrap(),
        Claim::Forward
    );
    assert!(b.idempotency_forget("api", "cut", &pending).await.unwrap());
    let begin = a
        .idempotency_begin("api", "cut", &fp("x"), lease)
        .await
        .unwrap();
    assert_eq!(begin.name(), "forward");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_simultaneous_duplicates_over_three_instances_forward_one() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = fleet(&redis, 3, TIMEOUT).await;
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let x = f[i % 3].clone();
            tokio::spawn(async move {
                x.idempotency_begin("api", "pay-1", &fp("x"), Duration::from_secs(30))
                    .await
                    .unwrap()
                    .name()
            })
        })
        .collect();
    let mut names = Vec::new();
    for t in tasks {
        names.push(t.await.unwrap());
    }
    let forwarded = names.iter().filter(|n| **n == "forward").count();
    assert_eq!(forwarded, 1, "{names:?}");
    assert!(names.iter().all(|n| *n == "forward" || *n == "in_flight"));
}

/// Every call returns within `timeout` plus scheduling slack.
async fn bounded<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> T {
    let start = Instant::now();
    let out = f.await;
    assert!(
        start.elapsed() <= limit,
        "took {:?} > {limit:?}",
        start.elapsed()
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fails_fast_and_restarted_resumes() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let timeout = ms(50);
    let limit = timeout + ms(100);
    let f = fleet(&redis, 2, timeout).await;
    let a = &f[0];
    assert!(
        a.status_line().starts_with("state: redis up"),
        "{}",
        a.status_line()
    );
    assert!(a.metrics().up());

    redis.kill();
    for _ in 0..20 {
        let r = bounded(limit, a.refresh(&["api"])).await;
        assert!(r.is_err(), "{r:?}");
        let r = bounded(limit, a.idempotency_begin("api", "k", &fp("x"), ms(1000))).await;
        assert!(r.is_err(), "{r:?}");
    }
    assert!(!a.is_up());
    assert!(!a.metrics().up());
    assert_eq!(a.metrics().errors("breaker_refresh"), 20);
    assert_eq!(a.metrics().errors("idempotency_begin"), 20);
    assert_eq!(
        a.idempotency_begin("api", "k", &fp("x"), ms(1000)).await,
        Err(StateError::Unavailable)
    );
    let line = a.status_line();
    assert!(line.starts_with("state: redis unavailable"), "{line}");
    assert!(line.contains("errors in the last minute"), "{line}");

    // Restarted on the same port: back within a few seconds, by itself.
    redis.restart();
    assert!(
        a.wait_up(Duration::from_secs(5)).await,
        "{}",
        a.status_line()
    );
    assert!(a.metrics().up());
    assert!(a.publish_open("api", ms(1000)).await.unwrap());
    // The other instance, idle through all of it, sees the trip within a
    // few seconds too (a call on its old connection may fail once first).
    let start = Instant::now();
    loop {
        match f[1].open_remaining("api").await {
            Ok(left) => break assert!(left.is_some()),
            Err(e) if start.elapsed() < Duration::from_secs(5) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(ms(50)).await;
            }
            Err(e) => panic!("still failing after 5 s: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_that_stops_answering_costs_at_most_timeout_per_call() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let timeout = ms(50);
    let limit = timeout + ms(100);
    let f = fleet(&redis, 1, timeout).await;
    let a = &f[0];
    redis.pause(true);
    for _ in 0..10 {
        let r = bounded(limit, a.lease("api", None, 100.0, 100, 10)).await;
        assert!(r.is_err(), "{r:?}");
    }
    // Three timeouts in a row take it for down: the rest fail at once.
    assert!(!a.is_up());
    let r = bounded(ms(20), a.lease("api", None, 100.0, 100, 10)).await;
    assert_eq!(r, Err(StateError::Unavailable));
    assert_eq!(a.metrics().errors("lease"), 11);
    assert_eq!(a.metrics().commands("lease"), 3);
    redis.pause(false);
    assert!(
        a.wait_up(Duration::from_secs(5)).await,
        "{}",
        a.status_line()
    );
    let g = a.lease("api", None, 100.0, 100, 10).await.unwrap();
    assert_eq!(g.granted, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_started_with_redis_down_starts_and_comes_up_later() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    redis.kill();
    let f = Fleet::start(&config(&redis, ms(50)), StateMetrics::unregistered()).unwrap();
    let r = bounded(ms(20), f.refresh(&["api"])).await;
    assert_eq!(r, Err(StateError::Unavailable));
    assert!(!f.wait_up(ms(300)).await);
    redis.restart();
    assert!(
        f.wait_up(Duration::from_secs(5)).await,
        "{}",
        f.status_line()
    );
    assert_eq!(f.refresh(&["api"]).await.unwrap(), [None]);
}
