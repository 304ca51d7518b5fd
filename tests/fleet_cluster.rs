//! The fleet on a Redis Cluster (docs/reference/fleet.md#topologies): three
//! `redis-server` processes in cluster mode, joined by `redis-cli --cluster
//! create`, each on a free loopback port and killed by its PID. Two weir
//! instances list the nodes in `[state] cluster`. Each upstream's keys
//! carry its name as a hash tag, so every script touches one slot; the test
//! picks two upstream names whose slots are served by different nodes and
//! checks that their keys landed there, that a keyed write is replayed
//! through the other instance, that a fleet bucket is one bucket, and that
//! the breaker is shared.
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
    let nodes: Vec<RedisServer> = (0..3)
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
        .args(["--cluster-replicas", "0", "--cluster-yes"])
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

/// The node (index into `nodes`) serving the slot of hash tag `tag`.
fn node_of(nodes: &[RedisServer], tag: &str) -> usize {
    let key = format!("x:{{{tag}}}");
    let slot: u16 = {
        let r = nodes[0].command(&["CLUSTER", "KEYSLOT", &key]);
        r.trim().trim_start_matches(':').parse().unwrap()
    };
    let map = nodes[0].command(&["CLUSTER", "NODES"]);
    for line in map.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(addr) = fields.get(1) else { continue };
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
                return nodes.iter().position(|n| n.port == port).unwrap();
            }
        }
    }
    panic!("no node serves slot {slot}: {map}");
}

async fn weir(nodes: &[RedisServer], svc: &str, up: &TestUpstream) -> Runtime {
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("\"redis://127.0.0.1:{}\"", n.port))
        .collect();
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
         [state]\nbackend = \"redis\"\ncluster = [{}]\nkey_prefix = \"c:\"\ntimeout = \"200ms\"\n\n\
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
