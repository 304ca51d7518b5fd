//! The fleet on a Redis Cluster (docs/reference/fleet.md#topologies): three
//! `redis-server` processes in cluster mode, joined by `redis-cli --cluster
//! create`, each on a free loopback port and killed by its PID. Two weir
//! instances list the nodes in `[state] cluster`. Each upstream's keys
//! carry its name as a hash tag, so every script touches one slot; the test
//! picks two upstream names whose slots are served by different nodes and
//! checks that their keys landed there, that a keyed write is replayed
//! through the other instance, that a fleet bucket is one bucket, and that
//! the breaker is shared. Then the Cluster changes under it: one
//! upstream's slot is moved to another node while keyed writes go through
//! (ASK during the move, MOVED after), and a shard's primary is killed and
//! its replica promoted.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::redis_server::RedisServer;
use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

#[allow(clippy::disallowed_methods)] // real time: other processes are waited for
fn real_now() -> std::time::Instant {
    std::time::Instant::now()
}

/// Three masters, no replicas, slots spread by `redis-cli --cluster create`.
fn cluster() -> Option<Vec<RedisServer>> {
    cluster_of(3, 0)
}

/// `n` nodes, `replicas` per master, joined by `redis-cli --cluster create`.
fn cluster_of(n: usize, replicas: usize) -> Option<Vec<RedisServer>> {
    let nodes: Vec<RedisServer> = (0..n)
        .map(|_| {
            RedisServer::start_args(
                None,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ],
            )
        })
        .collect::<Option<_>>()?;
    let mut create = Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port));
    }
    let out = create
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli (Debian's redis-tools, with redis-server)");
    assert!(
        out.status.success(),
        "redis-cli --cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let end = real_now() + Duration::from_secs(20);
    while !nodes
        .iter()
        .all(|n| n.command(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
    {
        assert!(real_now() < end, "the cluster never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(nodes)
}

/// The slot of hash tag `tag`.
fn slot_of(via: &RedisServer, tag: &str) -> u16 {
    let key = format!("x:{{{tag}}}");
    let r = via.command(&["CLUSTER", "KEYSLOT", &key]);
    r.trim().trim_start_matches(':').parse().unwrap()
}

/// The node (index into `nodes`) serving the slot of hash tag `tag`.
fn node_of(nodes: &[RedisServer], tag: &str) -> usize {
    match node_of_via(nodes, 0, tag) {
        Some(n) => n,
        None => panic!("no node serves {tag}'s slot"),
    }
}

/// The node serving `tag`'s slot as `nodes[via]` (a live node) sees it:
/// none while its primary has failed and no replica was promoted yet.
fn node_of_via(nodes: &[RedisServer], via: usize, tag: &str) -> Option<usize> {
    let slot = slot_of(&nodes[via], tag);
    let map = nodes[via].command(&["CLUSTER", "NODES"]);
    for line in map.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(addr) = fields.get(1) else { continue };
        if fields
            .get(2)
            .is_some_and(|f| f.split(',').any(|f| f == "fail"))
        {
            continue;
        }
        let port: u16 = addr
            .split(['@', ':'])
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        for range in fields.iter().skip(8) {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) else {
                continue;
            };
            if (lo..=hi).contains(&slot) {
                return nodes.iter().position(|n| n.port == port);
            }
        }
    }
    None
}

async fn weir(nodes: &[RedisServer], svc: &str, up: &TestUpstream) -> Runtime {
    weir_with(nodes, svc, up, "").await
}

/// [`weir`] with more `[state]` lines.
async fn weir_with(nodes: &[RedisServer], svc: &str, up: &TestUpstream, state: &str) -> Runtime {
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("\"redis://127.0.0.1:{}\"", n.port))
        .collect();
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
         [state]\nbackend = \"redis\"\ncluster = [{}]\nkey_prefix = \"c:\"\ntimeout = \"200ms\"\n{state}\n\
         [upstreams.{svc}]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
        urls.join(", "),
        up.url()
    );
    let config = match Config::parse(Path::new("cluster-test.toml"), &src) {
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

async fn post(rt: &Runtime, key: &str) -> (u16, bool, String) {
    let req = Request::post(format!("http://{}/orders", rt.proxy.listen_addr()))
        .header("host", "svc")
        .header("idempotency-key", key)
        .body(body("amount=5"))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let (parts, b) = resp.into_parts();
    let b = b.collect().await.unwrap().to_bytes();
    (
        parts.status.as_u16(),
        header(&parts, "idempotent-replayed") == "true",
        String::from_utf8_lossy(&b).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shares_its_state_on_a_cluster_with_upstreams_on_different_shards() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(nodes) = tokio::task::spawn_blocking(cluster).await.unwrap() else {
        return;
    };
    // Two upstream names whose slots different nodes serve.
    let svc = "svc";
    let home = node_of(&nodes, svc);
    let other = (0..100)
        .map(|i| format!("up{i}"))
        .find(|n| node_of(&nodes, n) != home)
        .unwrap();

    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let up = TestUpstream::start(move |_req| {
        let n = h.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::builder()
                .status(201)
                .body(body(format!("order {n}")))
                .unwrap()
        }
    })
    .await;
    let a = weir(&nodes, svc, &up).await;
    let b = weir(&nodes, svc, &up).await;
    let (fa, fb) = (a.proxy.fleet().unwrap(), b.proxy.fleet().unwrap());
    assert!(
        fa.status_line().contains("cluster at"),
        "{}",
        fa.status_line()
    );

    // A keyed write through A is replayed through B.
    assert_eq!(post(&a, "pay-1").await, (201, false, "order 1".into()));
    let end = real_now() + Duration::from_secs(2);
    loop {
        let r = post(&b, "pay-1").await;
        if r == (201, true, "order 1".into()) {
            break;
        }
        assert!(
            r.0 == 409 && real_now() < end,
            "a replay expected, got {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // The breaker: A's trip is B's, for both upstreams.
    for name in [svc, other.as_str()] {
        assert!(fa
            .publish_open(name, Duration::from_secs(60))
            .await
            .unwrap());
        assert!(fb.open_remaining(name).await.unwrap().is_some(), "{name}");
    }

    // The refresher reads every upstream's trip in one call, across slots.
    let seen = fb.refresh(&[svc, other.as_str()]).await.unwrap();
    assert!(seen.iter().all(Option::is_some), "{seen:?}");

    // A fleet bucket is one bucket: what A leased, B cannot.
    for name in [svc, other.as_str()] {
        let g = fa.lease(name, None, 0.01, 5, 5).await.unwrap();
        assert_eq!(g.granted, 5, "{name}");
        let g = fb.lease(name, None, 0.01, 5, 5).await.unwrap();
        assert_eq!(g.granted, 0, "{name}");
    }

    // Every key of an upstream lives on the node its tag hashes to: the
    // scripts never crossed a slot.
    for (name, node) in [(svc, home), (other.as_str(), node_of(&nodes, &other))] {
        let tag = format!("{{{name}}}");
        let local = nodes[node].command(&["KEYS", "c:*"]);
        for kind in ["breaker", "rl"] {
            assert!(
                local.contains(&format!("c:{kind}:{tag}")),
                "{kind} of {name} not on node {node}: {local}"
            );
        }
        for (i, n) in nodes.iter().enumerate().filter(|(i, _)| *i != node) {
            let there = n.command(&["KEYS", "c:*"]);
            assert!(
                !there.contains(&tag),
                "{name}'s keys on node {i} too: {there}"
            );
        }
    }
    assert!(nodes[home]
        .command(&["KEYS", "c:*"])
        .contains("c:idem:{svc}:pay-1"));
}

/// An upstream answering each request 201 `order N`, N counting from 1.
async fn counting() -> (TestUpstream, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let up = TestUpstream::start(move |_req| {
        let n = h.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::builder()
                .status(201)
                .body(body(format!("order {n}")))
                .unwrap()
        }
    })
    .await;
    (up, hits)
}

/// Posts `key` through `rt` until the answer is neither 409 (in flight)
/// nor 503 (the state cannot guard it now), for at most `within`.
async fn post_settled(rt: &Runtime, key: &str, within: Duration) -> (u16, bool, String) {
    let end = real_now() + within;
    loop {
        let r = post(rt, key).await;
        if !matches!(r.0, 409 | 503) || real_now() >= end {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new key through `a`, delivered once, then replayed through `b`:
/// returns the body recorded.
async fn write_then_replay(a: &Runtime, b: &Runtime, key: &str) -> String {
    let (status, replayed, first) = post_settled(a, key, Duration::from_secs(20)).await;
    assert_eq!((status, replayed), (201, false), "{key} through A: {first}");
    let again = post_settled(b, key, Duration::from_secs(5)).await;
    assert_eq!(again, (201, true, first.clone()), "{key} through B");
    first
}

/// The bulk strings of a RESP reply, in order.
fn bulk_strings(resp: &str) -> Vec<String> {
    resp.split("\r\n")
        .filter(|l| !l.is_empty() && !l.starts_with(['*', '$']))
        .map(str::to_string)
        .collect()
}

fn node_id(n: &RedisServer) -> String {
    bulk_strings(&n.command(&["CLUSTER", "MYID"]))
        .pop()
        .unwrap()
}

fn assert_ok(reply: String, what: &str) {
    assert!(reply.starts_with("+OK"), "{what}: {reply}");
}

/// Moves up to `limit` of `slot`'s keys from `from` to `to` (`MIGRATE`).
fn migrate(from: &RedisServer, to: &RedisServer, slot: &str, limit: usize) -> usize {
    let keys = bulk_strings(&from.command(&["CLUSTER", "GETKEYSINSLOT", slot, "1000"]));
    let keys: Vec<&str> = keys.iter().take(limit).map(String::as_str).collect();
    if keys.is_empty() {
        return 0;
    }
    let port = to.port.to_string();
    let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    args.extend(keys.iter().copied());
    assert_ok(from.command(&args), "MIGRATE");
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_slot_moved_under_keyed_writes_keeps_every_record() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(nodes) = tokio::task::spawn_blocking(cluster).await.unwrap() else {
        return;
    };
    let svc = "svc";
    let from = node_of(&nodes, svc);
    let to = (from + 1) % nodes.len();
    let slot = slot_of(&nodes[0], svc).to_string();
    let (up, hits) = counting().await;
    let a = weir(&nodes, svc, &up).await;
    let b = weir(&nodes, svc, &up).await;
    let (fa, fb) = (a.proxy.fleet().unwrap(), b.proxy.fleet().unwrap());
    let mut bodies = Vec::new();

    // Before the move.
    for i in 0..5 {
        bodies.push(write_then_replay(&a, &b, &format!("k{i}")).await);
    }
    // The move begins (`redis-cli --cluster reshard` does the same, one
    // slot at a time): while the slot is migrating, a key already moved is
    // answered with ASK, and a new key is made on the target.
    let (from_id, to_id) = (node_id(&nodes[from]), node_id(&nodes[to]));
    assert_ok(
        nodes[to].command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
        "IMPORTING",
    );
    assert_ok(
        nodes[from].command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
        "MIGRATING",
    );
    assert_eq!(migrate(&nodes[from], &nodes[to], &slot, 3), 3);
    for i in 5..10 {
        bodies.push(write_then_replay(&a, &b, &format!("k{i}")).await);
    }
    // Every record so far, wherever it is now, answers a repeat.
    for (i, first) in bodies.iter().enumerate() {
        let r = post_settled(&a, &format!("k{i}"), Duration::from_secs(5)).await;
        assert_eq!(r, (201, true, first.clone()), "k{i} during the move");
    }
    // The rest moves, and every node is told the slot's new owner: MOVED.
    while migrate(&nodes[from], &nodes[to], &slot, 100) > 0 {}
    for n in &nodes {
        assert_ok(
            n.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
            "NODE",
        );
    }
    assert_eq!(node_of(&nodes, svc), to);
    for i in 10..15 {
        bodies.push(write_then_replay(&a, &b, &format!("k{i}")).await);
    }
    for (i, first) in bodies.iter().enumerate() {
        let r = post_settled(&b, &format!("k{i}"), Duration::from_secs(5)).await;
        assert_eq!(r, (201, true, first.clone()), "k{i} after the move");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 15, "each key delivered once");

    // The breaker and the fleet bucket are still one, on the new node.
    assert!(fa.publish_open(svc, Duration::from_secs(60)).await.unwrap());
    assert!(fb.open_remaining(svc).await.unwrap().is_some());
    assert_eq!(fa.lease(svc, None, 0.01, 5, 5).await.unwrap().granted, 5);
    assert_eq!(fb.lease(svc, None, 0.01, 5, 5).await.unwrap().granted, 0);
    let tag = "{svc}";
    let there = nodes[to].command(&["KEYS", "c:*"]);
    for kind in ["breaker", "rl", "idem"] {
        assert!(
            there.contains(&format!("c:{kind}:{tag}")),
            "{kind}: {there}"
        );
    }
    let left = nodes[from].command(&["KEYS", "c:*"]);
    assert!(!left.contains(tag), "left behind: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_primary_dies_keeps_its_records_and_the_fleet_follows() {
    let _heavy = common::one_heavy_at_a_time().await;
    let Some(mut nodes) = tokio::task::spawn_blocking(|| cluster_of(6, 1))
        .await
        .unwrap()
    else {
        return;
    };
    // Every primary's replica is in sync before the writes.
    let end = real_now() + Duration::from_secs(20);
    loop {
        let synced = nodes
            .iter()
            .filter(|n| {
                n.command(&["INFO", "replication"])
                    .contains("connected_slaves:1")
            })
            .count();
        if synced == 3 {
            break;
        }
        assert!(real_now() < end, "replicas never connected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let svc = "svc";
    let home = node_of(&nodes, svc);
    let (up, hits) = counting().await;
    // Records are acknowledged by a replica (WAIT, on every primary) before
    // they are relied on, and a write the store cannot guard is refused.
    let state = "wait_replicas = 1\nwait_timeout = \"500ms\"\non_unavailable = \"refuse\"\n";
    let a = weir_with(&nodes, svc, &up, state).await;
    let b = weir_with(&nodes, svc, &up, state).await;
    let (fa, fb) = (a.proxy.fleet().unwrap(), b.proxy.fleet().unwrap());
    let mut bodies = Vec::new();
    for i in 0..5 {
        bodies.push(write_then_replay(&a, &b, &format!("k{i}")).await);
    }
    // A breaker trip on the same shard (an upstream name of its own, so
    // that svc's requests stay admitted).
    let tripped = (0..200)
        .map(|i| format!("up{i}"))
        .find(|n| node_of(&nodes, n) == home)
        .unwrap();
    assert!(fa
        .publish_open(&tripped, Duration::from_secs(60))
        .await
        .unwrap());

    // svc's primary dies; the Cluster promotes its replica
    // (cluster-node-timeout 2 s).
    nodes[home].kill();
    let via = (home + 1) % nodes.len();
    let end = real_now() + Duration::from_secs(30);
    let promoted = loop {
        let up = nodes[via]
            .command(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok");
        match node_of_via(&nodes, via, svc) {
            Some(n) if n != home && up => break n,
            _ => {}
        }
        assert!(real_now() < end, "the replica was never promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Every record written before the death is replayed, through both
    // instances: none delivered again.
    for (i, first) in bodies.iter().enumerate() {
        for rt in [&b, &a] {
            let r = post_settled(rt, &format!("k{i}"), Duration::from_secs(20)).await;
            assert_eq!(r, (201, true, first.clone()), "k{i} after the failover");
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 5);
    // The breaker trip published before is there on the promoted node.
    assert!(fb.open_remaining(&tripped).await.unwrap().is_some());
    assert!(nodes[promoted]
        .command(&["KEYS", "c:*"])
        .contains(&format!("c:breaker:{{{tripped}}}:open")));

    // The dead node comes back as the new primary's replica: new keyed
    // writes are acknowledged again (refused, not guessed, until then).
    nodes[home].restart();
    write_then_replay(&a, &b, "k5").await;
    assert_eq!(hits.load(Ordering::SeqCst), 6);
}
