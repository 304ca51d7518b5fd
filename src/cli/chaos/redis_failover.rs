//! `weir chaos redis-failover`: keyed writes through a fleet of two weirs
//! while its Redis primary dies (docs/reference/fleet.md#when-redis-fails).
//!
//! For each setting asked for (`wait_replicas` 0 and 1, `on_unavailable`
//! `local` and `refuse`: four rounds by default) the command starts real
//! `redis-server` processes of its own — a primary, a replica and three
//! Sentinels on free loopback ports, in a directory of their own, killed
//! and removed when the round ends — a counting upstream, and two weir
//! instances in this process that find the primary through the Sentinels.
//! Keyed POSTs go at `--rate` per second, alternately through each
//! instance, and each key is sent again through the other instance
//! [`REPEAT_AFTER`] later, as an app whose first answer was lost would.
//! Halfway through, the primary is killed (SIGKILL). The table says, per
//! round, how many keys were delivered twice, how many writes were refused
//! (503 `state_unavailable`), how long the fleet's state was gone, and
//! whether the breaker was shared before and after.

use crate::config::{Config, OnUnavailable};
use crate::runtime::{Options, Runtime};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// When a key is sent again, through the other instance.
pub const REPEAT_AFTER: Duration = Duration::from_millis(300);

/// What to run.
#[derive(Debug, Clone)]
pub struct FailoverOptions {
    /// Keyed POSTs offered per second (first sends; repeats come on top).
    pub rate: f64,
    /// How long the writes go on; the primary dies halfway.
    pub duration: Duration,
    /// The `wait_replicas` values to run (default 0 and 1).
    pub wait_replicas: Vec<u8>,
    /// The `on_unavailable` values to run (default both).
    pub on_unavailable: Vec<OnUnavailable>,
}

/// One round's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailoverRow {
    pub wait_replicas: u8,
    pub on_unavailable: &'static str,
    /// Keys written (each sent twice).
    pub keys: usize,
    /// Keys the upstream received more than once.
    pub delivered_twice: usize,
    /// Sends answered 503 `state_unavailable`.
    pub refused: usize,
    /// Sends answered with another of weir's errors, or not at all.
    pub other_errors: usize,
    /// From the kill until both instances had the shared state again.
    pub state_back_ms: Option<u64>,
    /// A trip published through one instance seen by the other, before
    /// the kill and after the failover.
    pub breaker_shared_before: bool,
    pub breaker_shared_after: bool,
}

/// Runs every round and prints the table (or JSON).
pub async fn print(opts: &FailoverOptions, json: bool) -> Result<(), String> {
    let mut rows = Vec::new();
    for &wait in &opts.wait_replicas {
        for &on in &opts.on_unavailable {
            rows.push(round(opts, wait, on).await?);
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "redis-failover: {} keyed POSTs/s for {:?}, each repeated through the other instance {} ms later; the primary SIGKILLed halfway",
        opts.rate,
        opts.duration,
        REPEAT_AFTER.as_millis()
    );
    println!(
        "{:>13} {:>14} {:>6} {:>15} {:>8} {:>7} {:>14} {:>15}",
        "wait_replicas",
        "on_unavailable",
        "keys",
        "delivered twice",
        "refused",
        "errors",
        "state back",
        "breaker shared"
    );
    for r in &rows {
        let back = r
            .state_back_ms
            .map_or("never".into(), |ms| format!("{ms} ms"));
        let shared = format!(
            "{} / {}",
            if r.breaker_shared_before { "yes" } else { "no" },
            if r.breaker_shared_after { "yes" } else { "no" }
        );
        println!(
            "{:>13} {:>14} {:>6} {:>15} {:>8} {:>7} {:>14} {:>15}",
            r.wait_replicas,
            r.on_unavailable,
            r.keys,
            r.delivered_twice,
            r.refused,
            r.other_errors,
            back,
            shared
        );
    }
    Ok(())
}

async fn round(opts: &FailoverOptions, wait: u8, on: OnUnavailable) -> Result<FailoverRow, String> {
    let redis = Replicated::start().await?;
    let (upstream, seen) = counting_upstream().await?;
    let prefix = format!("failover{:x}:", crate::clock::fresh_seed());
    let a = weir(&redis, upstream, &prefix, wait, on).await?;
    let b = weir(&redis, upstream, &prefix, wait, on).await?;
    let fleets = [fleet(&a)?, fleet(&b)?];
    let breaker_shared_before = shared(&fleets, "before").await;

    let total = (opts.rate * opts.duration.as_secs_f64()).round().max(2.0) as usize;
    let gap = Duration::from_secs_f64(1.0 / opts.rate.max(0.1));
    let start = Instant::now();
    let kill_at = start + opts.duration / 2;
    let addrs = [a.proxy.listen_addr(), b.proxy.listen_addr()];
    let mut sends = Vec::new();
    for i in 0..total {
        let at = start + gap * u32::try_from(i).unwrap_or(u32::MAX);
        let key = format!("{prefix}{i}");
        let (first, second) = (addrs[i % 2], addrs[(i + 1) % 2]);
        sends.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let one = post(first, &key).await;
            tokio::time::sleep_until(at + REPEAT_AFTER).await;
            let two = post(second, &key).await;
            [one, two]
        }));
    }
    // The primary dies halfway; the fleet's state is back when both
    // instances are up again, having been down.
    tokio::time::sleep_until(kill_at).await;
    let mut redis = redis;
    redis.primary.kill();
    let killed = Instant::now();
    let mut seen_down = [false, false];
    let mut state_back_ms = None;
    while killed.elapsed() < Duration::from_secs(30) {
        for (i, f) in fleets.iter().enumerate() {
            seen_down[i] |= !f.is_up();
        }
        if seen_down.iter().all(|d| *d) && fleets.iter().all(|f| f.is_up()) {
            state_back_ms = Some(killed.elapsed().as_millis() as u64);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (mut refused, mut other_errors) = (0, 0);
    for s in sends {
        for answer in s.await.map_err(|e| e.to_string())? {
            match answer.as_deref() {
                Some("") => {}
                Some("state_unavailable") => refused += 1,
                _ => other_errors += 1,
            }
        }
    }
    let breaker_shared_after = shared(&fleets, "after").await;
    let counts = seen
        .lock()
        .map_err(|_| "the upstream's count was poisoned")?
        .clone();
    let row = FailoverRow {
        wait_replicas: wait,
        on_unavailable: match on {
            OnUnavailable::Local => "local",
            OnUnavailable::Refuse => "refuse",
        },
        keys: total,
        delivered_twice: counts.values().filter(|&&n| n > 1).count(),
        refused,
        other_errors,
        state_back_ms,
        breaker_shared_before,
        breaker_shared_after,
    };
    a.shutdown(Duration::from_millis(200)).await;
    b.shutdown(Duration::from_millis(200)).await;
    Ok(row)
}

fn fleet(rt: &Runtime) -> Result<crate::state::fleet::Fleet, String> {
    rt.proxy
        .fleet()
        .ok_or_else(|| "the instance has no shared state".to_string())
}

/// Whether a trip published through the first instance is seen by the
/// second (a fresh upstream name, so that nothing earlier answers).
async fn shared(fleets: &[crate::state::fleet::Fleet; 2], when: &str) -> bool {
    let name = format!("breaker-{when}");
    for _ in 0..50 {
        if fleets.iter().all(|f| f.is_up())
            && fleets[0]
                .publish_open(&name, Duration::from_secs(60))
                .await
                .is_ok()
        {
            return matches!(fleets[1].open_remaining(&name).await, Ok(Some(_)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// One keyed POST: `Some("")` for a 2xx, `Some(code)` for weir's error,
/// `None` when it failed below HTTP.
async fn post(addr: SocketAddr, key: &str) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = http::Request::post("/orders")
        .header("host", "svc")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .ok()?
        .ok()?;
    let error = resp
        .headers()
        .get("x-weir-error")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let ok = resp.status().is_success();
    let _ = resp.into_body().collect().await;
    Some(if ok {
        String::new()
    } else if error.is_empty() {
        "status".into()
    } else {
        error
    })
}

/// An upstream that answers 201 and counts POSTs by idempotency key.
async fn counting_upstream() -> Result<(SocketAddr, Arc<Mutex<BTreeMap<String, usize>>>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let seen = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counts = counts.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let counts = counts.clone();
                        async move {
                            let key = req
                                .headers()
                                .get("idempotency-key")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            if let Ok(mut m) = counts.lock() {
                                *m.entry(key).or_default() += 1;
                            }
                            let _ = req.into_body().collect().await;
                            let resp = http::Response::builder()
                                .status(201)
                                .body(Full::new(Bytes::from_static(b"created")));
                            Ok::<_, http::Error>(resp.unwrap_or_default())
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, seen))
}

async fn weir(
    redis: &Replicated,
    upstream: SocketAddr,
    prefix: &str,
    wait: u8,
    on: OnUnavailable,
) -> Result<Runtime, String> {
    let on = match on {
        OnUnavailable::Local => "local",
        OnUnavailable::Refuse => "refuse",
    };
    let sentinels: Vec<String> = redis
        .sentinels
        .iter()
        .map(|s| format!("\"redis://127.0.0.1:{}\"", s.port))
        .collect();
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\naccess_log = \"off\"\n\n\
         [state]\nbackend = \"redis\"\nsentinels = [{}]\nmaster_name = \"{MASTER}\"\n\
         key_prefix = \"{prefix}\"\ntimeout = \"50ms\"\nwait_replicas = {wait}\n\
         wait_timeout = \"100ms\"\non_unavailable = \"{on}\"\n\n\
         [upstreams.svc]\nurl = \"http://{upstream}\"\nhosts = [\"svc\"]\n",
        sentinels.join(", ")
    );
    let config =
        Config::parse(Path::new("redis-failover.toml"), &src).map_err(|e| e.to_string())?;
    let opts = Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    let rt = Runtime::start(config, opts)
        .await
        .map_err(|e| e.to_string())?;
    let f = fleet(&rt)?;
    if !f.wait_up(Duration::from_secs(10)).await {
        return Err(format!("weir never reached Redis: {}", f.status_line()));
    }
    Ok(rt)
}

/// The Sentinels' name for the primary.
const MASTER: &str = "weir-chaos";

/// A primary, its replica and three Sentinels that know both.
struct Replicated {
    primary: RedisProcess,
    #[allow(dead_code)] // kept alive: it is what gets promoted
    replica: RedisProcess,
    sentinels: Vec<RedisProcess>,
}

impl Replicated {
    async fn start() -> Result<Replicated, String> {
        let primary = RedisProcess::start(None, &[])?;
        let p = primary.port.to_string();
        let replica = RedisProcess::start(None, &["--replicaof", "127.0.0.1", &p])?;
        until(
            Duration::from_secs(10),
            "the replica to sync",
            || replica.ask(&["INFO", "replication"]),
            |r| r.contains("master_link_status:up"),
        )
        .await?;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let conf = format!(
                "sentinel monitor {MASTER} 127.0.0.1 {p} 2\n\
                 sentinel down-after-milliseconds {MASTER} 500\n\
                 sentinel failover-timeout {MASTER} 3000\n"
            );
            sentinels.push(RedisProcess::start(Some(&conf), &["--sentinel"])?);
        }
        let r = replica.port.to_string();
        for s in &sentinels {
            until(
                Duration::from_secs(20),
                "the Sentinels to see the replica",
                || s.ask(&["SENTINEL", "REPLICAS", MASTER]),
                |a| a.contains(&r),
            )
            .await?;
        }
        Ok(Replicated {
            primary,
            replica,
            sentinels,
        })
    }
}

/// Polls `ask` every 100 ms until `ok` holds of its answer.
pub(super) async fn until(
    limit: Duration,
    what: &str,
    ask: impl Fn() -> String,
    ok: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let end = Instant::now() + limit;
    loop {
        let answer = ask();
        if ok(&answer) {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!("waited {limit:?} for {what}: {answer}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `redis-server` this command started: killed, reaped and its
/// directory removed when dropped.
pub(super) struct RedisProcess {
    pub(super) port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisProcess {
    pub(super) fn start(conf: Option<&str>, args: &[&str]) -> Result<RedisProcess, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "weir-chaos-redis-{port}-{:x}",
            crate::clock::fresh_seed()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("redis-server");
        if let Some(conf) = conf {
            let path = dir.join("redis.conf");
            std::fs::write(&path, conf).map_err(|e| e.to_string())?;
            cmd.arg(path);
        }
        let child = cmd
            .args(args)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server (Debian's redis-server package): {e}"))?;
        let p = RedisProcess {
            port,
            child: Some(child),
            dir,
        };
        for _ in 0..100 {
            if p.ask(&["PING"]).starts_with("+PONG") {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("redis-server on port {port} did not answer PING"))
    }

    /// One command, its raw reply as text ("" when it could not be asked).
    pub(super) fn ask(&self, args: &[&str]) -> String {
        use std::io::{Read, Write};
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        if s.write_all(req.as_bytes()).is_err() {
            return String::new();
        }
        let mut buf = vec![0u8; 16 * 1024];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// SIGKILL, and reaped.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
