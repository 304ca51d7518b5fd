//! A fleet of weirs as one (docs/reference/fleet.md#fleet-state), end to end:
//! three weir instances, each a whole in-process `Runtime` with its own
//! proxy and admin listeners, sharing one real `redis-server`, in front of a
//! real test upstream that counts what reaches it. The acceptance list of
//! issue 20: a fleet rate limit held within ± 5 % at ≤ 0.1 Redis commands
//! per request, a trip seen by the whole fleet within `refresh` + 100 ms and
//! one probe per open interval, a keyed POST replayed through another
//! instance and 30 simultaneous duplicates delivered once, Redis killed
//! mid-run without a failed request, and closed breakers that cost Redis
//! nothing. Besides: a keyed POST decided while Redis stalled is replayed,
//! not wedged; and a burst under a generous fleet limit is admitted.
//!
//! Each test starts its own redis-server (tests/common/redis_server.rs) and
//! skips, saying so, without one (a failure with WEIR_REQUIRE_REDIS set).
//! The tests take a lock and run one at a time: they measure rates and
//! latencies against the clock on machines with two cores, and two load
//! drivers would measure each other.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::redis_server::RedisServer;
use common::{body, client, Client, TestUpstream};
use http_body_util::BodyExt;
use hyper::{Method, Request, Response};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    crate::common::one_heavy_at_a_time().await
}

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// `[state] refresh` in the tests that watch the breaker: short, so the
/// fleet is seen to open within a fraction of a second.
const REFRESH: Duration = Duration::from_millis(200);

/// `[state] timeout` for the functional tests: generous, so that a loaded
/// two-core machine never turns a slow answer into a fallback to local
/// state, which would test the outage path instead (each of them asserts
/// that no call failed). The Redis-killed test keeps the default, 5 ms.
const FUNCTIONAL_TIMEOUT: &str = "50ms";

/// One weir instance of the fleet: a whole `Runtime` (proxy and admin
/// listeners, no file watch), named for the messages.
struct Instance {
    name: &'static str,
    rt: Runtime,
}

const NAMES: [&str; 3] = ["A", "B", "C"];

/// Three instances sharing `redis` under `prefix` (test-unique), each with
/// `state` added to its `[state]` table and `upstreams` as its upstreams;
/// returns once each one's backend is up.
async fn fleet(redis: &RedisServer, prefix: &str, state: &str, upstreams: &str) -> Vec<Instance> {
    let mut out = Vec::new();
    for name in NAMES {
        let src = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
             [state]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n{state}\n\n\
             {upstreams}\n",
            redis.url()
        );
        let config = match Config::parse(Path::new("fleet-test.toml"), &src) {
            Ok(c) => c,
            Err(e) => panic!("test config invalid:\n{e}\n---\n{src}"),
        };
        let opts = Options {
            watch: false,
            sighup: false,
            workers: 0,
        };
        let rt = Runtime::start(config, opts).await.unwrap();
        let f = rt.proxy.fleet().expect("[state] backend = \"redis\"");
        assert!(
            f.wait_up(Duration::from_secs(5)).await,
            "{name}: {}",
            f.status_line()
        );
        out.push(Instance { name, rt });
    }
    out
}

/// `[upstreams.svc]` at `url`, reached with `Host: svc`, plus `extra`.
fn svc(url: &str, extra: &str) -> String {
    format!("[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n{extra}\n")
}

impl Instance {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.rt.proxy.listen_addr())
    }

    async fn admin(&self, path: &str) -> String {
        let req = Request::get(format!("http://{}{path}", self.rt.admin_addr))
            .body(body(""))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{}: GET {path}", self.name);
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&b).into_owned()
    }

    /// Its `/metrics`, read over its admin listener.
    async fn metrics(&self) -> Metrics {
        Metrics(self.admin("/metrics").await)
    }
}

/// A `/metrics` page.
struct Metrics(String);

impl Metrics {
    /// The sum of the samples of `name` carrying every one of `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut sum = 0.0;
        for line in self.0.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (n, l) = series.split_once('{').unwrap_or((series, ""));
            if n != name {
                continue;
            }
            if labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            {
                sum += value.parse::<f64>().unwrap();
            }
        }
        sum
    }

    /// `weir_state_commands_total` of `op` (every op: `None`).
    fn commands(&self, op: Option<&str>) -> f64 {
        match op {
            Some(op) => self.get("weir_state_commands_total", &[("op", op)]),
            None => self.get("weir_state_commands_total", &[]),
        }
    }

    fn errors(&self) -> f64 {
        self.get("weir_state_errors_total", &[])
    }

    /// (calls that answered, those of them that took over 5 ms — the
    /// default `[state] timeout`), every op.
    fn round_trips(&self) -> (f64, f64) {
        let all = self.get("weir_state_roundtrip_seconds_count", &[]);
        let fast = self.get("weir_state_roundtrip_seconds_bucket", &[("le", "0.005")]);
        (all, all - fast)
    }

    /// Whether `weir_breaker_state` of `svc` reads `state`.
    fn breaker_is(&self, state: &str) -> bool {
        self.get(
            "weir_breaker_state",
            &[("upstream", "svc"), ("state", state)],
        ) == 1.0
    }

    fn transitions(&self, to: &str) -> f64 {
        self.get(
            "weir_breaker_transitions_total",
            &[("upstream", "svc"), ("to", to)],
        )
    }
}

/// What a client got for one request.
#[derive(Debug, Clone)]
struct Answer {
    /// 0: the request failed below HTTP.
    status: u16,
    /// `x-weir-error`, or the transport error.
    error: String,
    replayed: bool,
    body: Bytes,
    took: Duration,
}

/// Sends one request to `inst` for `svc`, saying it comes `from` the
/// instance's client (the upstream sees `x-from`), with an idempotency
/// `key` when given.
async fn send(
    c: &Client,
    inst: &Instance,
    method: Method,
    key: Option<&str>,
    payload: &'static str,
) -> Answer {
    let mut b = Request::builder()
        .method(method)
        .uri(inst.url("/orders"))
        .header("host", "svc")
        .header("x-from", inst.name);
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    let start = Instant::now();
    let got = async {
        let resp = c.request(b.body(body(payload)).unwrap()).await?;
        let (parts, b) = resp.into_parts();
        let b = b.collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, b))
    }
    .await;
    let took = start.elapsed();
    match got {
        Ok((parts, b)) => {
            let h = |n: &str| common::header(&parts, n);
            Answer {
                status: parts.status.as_u16(),
                error: h("x-weir-error"),
                replayed: h("idempotent-replayed") == "true",
                body: b,
                took,
            }
        }
        Err(e) => Answer {
            status: 0,
            error: e.to_string(),
            replayed: false,
            body: Bytes::new(),
            took,
        },
    }
}

async fn get(c: &Client, inst: &Instance) -> Answer {
    send(c, inst, Method::GET, None, "").await
}

/// One command to `redis` over a fresh connection (RESP); the reply's text
/// (a status, an integer or a bulk string).
async fn redis_command(redis: &RedisServer, args: &[&str]) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", redis.port))
        .await
        .unwrap();
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "redis closed before its reply to {args:?}");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        match head.as_bytes()[0] {
            b'+' | b':' => return head[1..].to_string(),
            b'-' => panic!("redis answered {args:?} with {head}"),
            b'$' => {
                let len: usize = head[1..].parse().unwrap();
                let start = end + 2;
                if buf.len() >= start + len + 2 {
                    return String::from_utf8_lossy(&buf[start..start + len]).into_owned();
                }
            }
            _ => panic!("unexpected reply to {args:?}: {head}"),
        }
    }
}

/// `INFO commandstats`: calls by command (lower case), since the last
/// `CONFIG RESETSTAT`, without this test's own INFO and CONFIG.
async fn commandstats(redis: &RedisServer) -> BTreeMap<String, u64> {
    let text = redis_command(redis, &["INFO", "commandstats"]).await;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((cmd, rest)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(cmd) = cmd.strip_prefix("cmdstat_") else {
            continue;
        };
        if cmd == "info" || cmd.starts_with("config") {
            continue;
        }
        let calls = rest
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .unwrap()
            .parse()
            .unwrap();
        out.insert(cmd.to_string(), calls);
    }
    out
}

async fn reset_stats(redis: &RedisServer) {
    assert_eq!(redis_command(redis, &["CONFIG", "RESETSTAT"]).await, "OK");
}

/// The `q` quantile (nearest rank) of `xs`.
fn quantile(xs: &[Duration], q: f64) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// An upstream that answers every request with `ok` (GET 200, anything
/// else 201 `order N`, N counting those), after `delay_ms`.
struct Orders {
    up: TestUpstream,
    delay_ms: Arc<AtomicU64>,
}

async fn orders() -> Orders {
    let delay_ms = Arc::new(AtomicU64::new(0));
    let n = Arc::new(AtomicUsize::new(0));
    let d = delay_ms.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (d, n) = (d.clone(), n.clone());
        async move {
            let get = req.method() == Method::GET;
            let _ = req.into_body().collect().await;
            let delay = d.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(ms(delay)).await;
            }
            if get {
                return Response::new(body("ok"));
            }
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            Response::builder()
                .status(201)
                .body(body(format!("order {i}")))
                .unwrap()
        }
    })
    .await;
    Orders { up, delay_ms }
}

// ---------------------------------------------------------------------------
// 1. A fleet-wide rate limit.

/// Each of three instances offered 100 rps (open loop: a request every
/// 10 ms, not waiting for answers) for 10 s against a fleet limit of
/// 100 rps, burst 20: the upstream receives the fleet's allowance ± 5 %,
/// and Redis sees at most 0.1 commands per client request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_rate_limit_holds_within_five_percent() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    const RPS: f64 = 100.0;
    // Small, so that the allowance is the rate's, not the burst's (with
    // burst = 100 it holds as well: 1,090 admitted of 1,099).
    const BURST: u32 = 20;
    const TICKS: u32 = 1000;
    let up = TestUpstream::text("ok").await;
    let extra = format!(
        "[upstreams.svc.retry]\nmax_attempts = 1\n\
         [upstreams.svc.rate_limit]\nrps = {RPS:.1}\nburst = {BURST}\nscope = \"fleet\"\n"
    );
    let f = fleet(
        &redis,
        "fleet-rate:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\""),
        &svc(&up.url(), &extra),
    )
    .await;
    let f: Vec<Arc<Instance>> = f.into_iter().map(Arc::new).collect();
    reset_stats(&redis).await;
    let before: Vec<f64> = {
        let mut v = Vec::new();
        for i in &f {
            v.push(i.metrics().await.commands(None));
        }
        v
    };

    let start = Instant::now() + ms(50);
    let last_tick = Arc::new(Mutex::new(start));
    let drivers: Vec<_> = f
        .iter()
        .map(|inst| {
            let inst = inst.clone();
            let last_tick = last_tick.clone();
            tokio::spawn(async move {
                let c = client();
                let mut tick = tokio::time::interval_at(start, ms(10));
                let mut sent = Vec::new();
                for _ in 0..TICKS {
                    let t = tick.tick().await;
                    let (c, inst) = (c.clone(), inst.clone());
                    sent.push(tokio::spawn(async move { get(&c, &inst).await }));
                    let mut l = last_tick.lock().unwrap();
                    *l = (*l).max(t);
                }
                let mut answers = Vec::new();
                for s in sent {
                    answers.push(s.await.unwrap());
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for d in drivers {
        answers.extend(d.await.unwrap());
    }
    let span = last_tick
        .lock()
        .unwrap()
        .duration_since(start)
        .as_secs_f64();

    let offered = answers.len();
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let limited = answers
        .iter()
        .filter(|a| a.status == 429 && a.error == "rate_limited")
        .count();
    assert_eq!(offered, 3 * TICKS as usize);
    let odd: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status != 200 && a.status != 429)
        .take(5)
        .collect();
    assert_eq!(ok + limited, offered, "unexpected answers: {odd:?}");
    let delivered = up.requests();
    assert_eq!(delivered, ok, "every admitted request reached the upstream");

    // What an exact token bucket of the fleet's limit admits when offered
    // more than its rate throughout: `burst` at once, then `rps` per second
    // over the span the requests were offered in (first to last tick,
    // 9.99 s). The leased bucket's own bound (docs/reference/fleet.md#leased-tokens)
    // is 1.5 batches of 10 per instance, 45 here: inside the 5 %.
    let allowance = f64::from(BURST) + RPS * span;
    let got = delivered as f64;
    let off = (got - allowance) / allowance;
    let mut commands = 0.0;
    let mut leases = 0.0;
    let mut errors = 0.0;
    let mut slow = (0.0, 0.0);
    for (i, b) in f.iter().zip(&before) {
        let m = i.metrics().await;
        commands += m.commands(None) - b;
        leases += m.commands(Some("lease"));
        errors += m.errors();
        let (all, over) = m.round_trips();
        slow = (slow.0 + all, slow.1 + over);
    }
    let stats = commandstats(&redis).await;
    // Redis counts the commands a script runs as well: the lease script's
    // TIME, HMGET, HSET and PEXPIRE are not round trips of weir's.
    let in_scripts = ["time", "hmget", "hset", "pexpire"];
    let redis_top: u64 = stats
        .iter()
        .filter(|(k, _)| !in_scripts.contains(&k.as_str()))
        .map(|(_, v)| v)
        .sum();
    let scripts =
        stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0);
    eprintln!(
        "offered {offered} over {span:.3} s; admitted {delivered} (429: {limited}); \
         allowance {allowance:.0}: {:+.2} %; weir's Redis commands {commands} \
         ({:.4}/request; lease {leases}); Redis saw {redis_top} commands \
         ({:.4}/request; {scripts} script calls): {stats:?}; round trips over 5 ms: \
         {} of {}",
        off * 100.0,
        commands / offered as f64,
        redis_top as f64 / offered as f64,
        slow.1,
        slow.0,
    );
    assert_eq!(errors, 0.0, "a Redis call failed: the fallback decided");
    assert!(
        off.abs() <= 0.05,
        "{delivered} admitted, allowance {allowance:.0} ({:+.2} %)",
        off * 100.0
    );
    assert!(
        commands / offered as f64 <= 0.1,
        "{commands} Redis commands for {offered} requests"
    );
    assert!(
        redis_top as f64 / offered as f64 <= 0.1,
        "Redis saw {redis_top} commands for {offered} requests: {stats:?}"
    );
}

// ---------------------------------------------------------------------------
// 2. The shared breaker.

/// One upstream arrival: when, and from which instance's client.
type Arrivals = Arc<Mutex<Vec<(Instant, String)>>>;

/// An outage seen by A alone opens B and C within `refresh` + 100 ms;
/// with all three under traffic, exactly one probe per open interval
/// reaches the upstream across the fleet; once the upstream is back one
/// probe succeeds and all three close, the others without probing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_seen_by_one_opens_all_and_one_probe_goes_per_interval() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // The upstream fails its first FAILING requests: A's three that trip
    // it and the first three probes; from the fourth probe on it is back.
    const TRIP: usize = 3;
    const FAILED_PROBES: usize = 3;
    const FAILING: usize = TRIP + FAILED_PROBES;
    const OPEN: Duration = Duration::from_secs(1);
    let arrivals: Arrivals = Arc::default();
    let a = arrivals.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let a = a.clone();
        async move {
            let from = req
                .headers()
                .get("x-from")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let n = {
                let mut a = a.lock().unwrap();
                a.push((Instant::now(), from));
                a.len()
            };
            let status = if n <= FAILING { 503 } else { 200 };
            Response::builder().status(status).body(body("")).unwrap()
        }
    })
    .await;
    let extra = format!(
        "[upstreams.svc.retry]\nmax_attempts = 1\n\
         [upstreams.svc.breaker]\nconsecutive_failures = {TRIP}\nfailing_for = \"0s\"\nopen = \"1s\"\n\
         max_open = \"1s\"\nopen_jitter = 0.0\n"
    );
    let f = fleet(
        &redis,
        "fleet-breaker:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\"\nrefresh = \"200ms\""),
        &svc(&up.url(), &extra),
    )
    .await;
    let f: Vec<Arc<Instance>> = f.into_iter().map(Arc::new).collect();
    let c = client();

    // A alone sees the outage; the third failure trips it.
    let mut tripped_by = Instant::now();
    for i in 0..TRIP {
        if i == TRIP - 1 {
            tripped_by = Instant::now();
        }
        let r = get(&c, &f[0]).await;
        assert_eq!(r.status, 503, "{r:?}");
        assert_eq!(r.error, "", "the upstream's own 503: {r:?}");
    }
    assert!(f[0].metrics().await.breaker_is("open"));
    // B and C, with no traffic, open within refresh + 100 ms of the trip.
    let limit = REFRESH + ms(100);
    for inst in &f[1..] {
        loop {
            if inst.metrics().await.breaker_is("open") {
                break;
            }
            assert!(
                tripped_by.elapsed() <= limit,
                "{} not open {:?} after the trip",
                inst.name,
                tripped_by.elapsed()
            );
            tokio::time::sleep(ms(5)).await;
        }
    }
    let seen_open = tripped_by.elapsed();
    assert_eq!(up.requests(), TRIP, "B and C sent nothing");
    let r = get(&c, &f[1]).await;
    assert_eq!((r.status, r.error.as_str()), (503, "circuit_open"));

    // All three under traffic (a request every 20 ms each, not waiting for
    // answers) through three failing probes and the successful one, until
    // all three are closed again.
    let stop = Arc::new(AtomicBool::new(false));
    let drivers: Vec<_> = f
        .iter()
        .map(|inst| {
            let (inst, stop) = (inst.clone(), stop.clone());
            tokio::spawn(async move {
                let c = client();
                let mut tick = tokio::time::interval(ms(20));
                let mut sent = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let (c, inst) = (c.clone(), inst.clone());
                    sent.push(tokio::spawn(async move { get(&c, &inst).await }));
                }
                let mut answers = Vec::new();
                for s in sent {
                    answers.push(s.await.unwrap());
                }
                answers
            })
        })
        .collect();
    // The successful probe: the first arrival past FAILING.
    let deadline = Instant::now() + OPEN * (FAILED_PROBES as u32 + 3);
    while up.requests() <= FAILING {
        assert!(
            Instant::now() < deadline,
            "no successful probe: {} arrivals",
            up.requests()
        );
        tokio::time::sleep(ms(10)).await;
    }
    let recovered = Instant::now();
    // Everyone closes: the winner by its probe, the others as told.
    let closed_within = REFRESH * 2 + ms(300);
    for inst in &f {
        loop {
            if inst.metrics().await.breaker_is("closed") {
                break;
            }
            assert!(
                recovered.elapsed() <= closed_within,
                "{} not closed {:?} after the successful probe",
                inst.name,
                recovered.elapsed()
            );
            tokio::time::sleep(ms(10)).await;
        }
    }
    let all_closed = recovered.elapsed();
    tokio::time::sleep(ms(100)).await;
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for d in drivers {
        answers.extend(d.await.unwrap());
    }
    assert!(
        answers.iter().all(|a| a.status != 0),
        "transport failures: {:?}",
        answers.iter().find(|a| a.status == 0)
    );

    // The probes: arrivals TRIP+1 ..= FAILING+1, each one open interval
    // after the one before it (the trip itself for the first). Two probes
    // in one interval would come within milliseconds of each other; an
    // interval without its probe would leave a gap of two.
    let arr = arrivals.lock().unwrap().clone();
    let probes = &arr[TRIP..=FAILING];
    let mut gaps = Vec::new();
    for w in arr[TRIP - 1..=FAILING].windows(2) {
        gaps.push(w[1].0.duration_since(w[0].0));
    }
    let senders: Vec<&str> = probes.iter().map(|(_, s)| s.as_str()).collect();
    let mut per_instance = Vec::new();
    let mut half_opens = BTreeMap::new();
    for inst in &f {
        let m = inst.metrics().await;
        half_opens.insert(inst.name, m.transitions("half_open"));
        per_instance.push((
            inst.name,
            m.transitions("open"),
            m.transitions("half_open"),
            m.transitions("closed"),
            m.errors(),
        ));
    }
    eprintln!(
        "B and C open {seen_open:?} after the trip; probes from {senders:?}, \
         {gaps:?} apart; all closed {all_closed:?} after the successful probe; \
         (instance, opens, half-opens, closes, state errors): {per_instance:?}"
    );
    for (name, _, _, closes, errors) in &per_instance {
        assert_eq!(*errors, 0.0, "{name}: a Redis call failed");
        assert_eq!(*closes, 1.0, "{name} closed once");
    }
    for g in &gaps {
        assert!(
            *g >= OPEN - ms(20) && *g <= OPEN + ms(300),
            "one probe per open interval of {OPEN:?}: probes {gaps:?} apart"
        );
    }
    // Every probe was a half-open breaker's, of the instance that sent it:
    // no instance probed but the winners, and the successful probe's
    // winner alone went half-open for it (the others closed as told).
    for inst in &f {
        let sent = senders.iter().filter(|s| **s == inst.name).count();
        assert_eq!(
            half_opens[inst.name], sent as f64,
            "{}: half-open transitions and probes sent ({senders:?})",
            inst.name
        );
    }
    // Past the probes, only traffic through closed breakers arrived.
    let later = arr.len() - (FAILING + 1);
    let refused = answers.iter().filter(|a| a.error == "circuit_open").count();
    let passed = answers.iter().filter(|a| a.error.is_empty()).count();
    eprintln!("{refused} refused circuit_open, {passed} passed ({later} after the probes)");
    assert_eq!(passed, FAILED_PROBES + 1 + later);
}

// ---------------------------------------------------------------------------
// 3. The idempotency store across instances.

/// A POST with `key` and `payload` through `inst`.
async fn post(c: &Client, inst: &Instance, key: &str, payload: &'static str) -> Answer {
    send(c, inst, Method::POST, Some(key), payload).await
}

/// A keyed POST through A, then through B, is replayed by B; 30
/// simultaneous duplicates spread over the three instances are delivered
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_is_replayed_across_instances_and_delivered_once() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let o = orders().await;
    let f = fleet(
        &redis,
        "fleet-idem:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\""),
        &svc(&o.up.url(), ""),
    )
    .await;
    let f: Vec<Arc<Instance>> = f.into_iter().map(Arc::new).collect();
    let c = client();

    let first = post(&c, &f[0], "pay-1", "amount=5").await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.body, "order 1");
    // The record is finished in the background: B may see it in flight
    // for a moment.
    let start = Instant::now();
    let mut in_flight = 0;
    let replay = loop {
        let r = post(&c, &f[1], "pay-1", "amount=5").await;
        match (r.status, r.error.as_str()) {
            (201, "") if r.replayed => break r,
            (409, "idempotency_in_flight") if start.elapsed() < Duration::from_secs(1) => {
                in_flight += 1;
                tokio::time::sleep(ms(10)).await;
            }
            _ => panic!("a replay expected, got {r:?}"),
        }
    };
    assert_eq!(replay.body, "order 1");
    assert_eq!(o.up.requests(), 1);
    // Another body with the key, through C: the key was reused.
    let r = post(&c, &f[2], "pay-1", "amount=6").await;
    assert_eq!(
        (r.status, r.error.as_str()),
        (422, "idempotency_key_reused")
    );

    // 30 simultaneous duplicates over three instances while the upstream
    // holds its answer 300 ms.
    o.delay_ms.store(300, Ordering::SeqCst);
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let (c, inst) = (c.clone(), f[i % 3].clone());
            tokio::spawn(async move { post(&c, &inst, "pay-2", "amount=7").await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    o.delay_ms.store(0, Ordering::SeqCst);
    let forwarded: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed)
        .collect();
    let refused = answers
        .iter()
        .filter(|a| a.status == 409 && a.error == "idempotency_in_flight")
        .count();
    let replayed = answers
        .iter()
        .filter(|a| a.status == 201 && a.replayed)
        .count();
    eprintln!(
        "B saw pay-1 in flight {in_flight} times before its replay; 30 duplicates: \
         {} forwarded, {refused} in flight, {replayed} replayed",
        forwarded.len()
    );
    assert_eq!(forwarded.len(), 1, "{answers:?}");
    assert_eq!(refused + replayed, 29, "{answers:?}");
    assert!(answers
        .iter()
        .filter(|a| a.replayed)
        .all(|a| a.body == "order 2"));
    assert_eq!(o.up.requests(), 2, "one delivery per key");

    // Done: every instance replays it (after the background write).
    for inst in &f {
        let start = Instant::now();
        loop {
            let r = post(&c, inst, "pay-2", "amount=7").await;
            if r.status == 201 && r.replayed {
                assert_eq!(r.body, "order 2");
                break;
            }
            assert!(
                r.error == "idempotency_in_flight" && start.elapsed() < Duration::from_secs(1),
                "{}: {r:?}",
                inst.name
            );
            tokio::time::sleep(ms(10)).await;
        }
    }
    assert_eq!(o.up.requests(), 2);
    for inst in &f {
        let m = inst.metrics().await;
        eprintln!(
            "{}: round trips (all, over 5 ms): {:?}",
            inst.name,
            m.round_trips()
        );
        assert_eq!(m.errors(), 0.0, "{}", inst.name);
    }
}

// ---------------------------------------------------------------------------
// 4. Redis killed mid-run.

/// Idempotency calls that failed on `inst` (begin and finish).
async fn idempotency_errors(inst: &Instance) -> f64 {
    let m = inst.metrics().await;
    ["idempotency_begin", "idempotency_finish"]
        .iter()
        .map(|op| m.get("weir_state_errors_total", &[("op", op)]))
        .sum()
}

/// A keyed POST through `from`, then through `to`, replayed (a 409 in
/// flight accepted for up to a second while the record's finishing write
/// lands): the record was Redis's. Returns how long after the first
/// answer the replay came.
///
/// With the default 5 ms `[state] timeout`, a call may time out on a
/// loaded two-core machine, and that request is then decided by its
/// instance's own store, as documented. Such an attempt (and only such a
/// one: its instance counts the failed call) is made again with a new key,
/// up to three times.
async fn replayed_across(c: &Client, from: &Instance, to: &Instance, key: &str) -> Duration {
    for attempt in 0..3 {
        let key: &'static str = format!("{key}-{attempt}").leak();
        let errors = idempotency_errors(from).await + idempotency_errors(to).await;
        let r = post(c, from, key, "x").await;
        assert_eq!((r.status, r.replayed), (201, false), "{r:?}");
        let first = r.body;
        let start = Instant::now();
        let unexpected = loop {
            let r = post(c, to, key, "x").await;
            if r.status == 201 && r.replayed {
                assert_eq!(r.body, first, "the first answer, replayed");
                return start.elapsed();
            }
            if r.error != "idempotency_in_flight" || start.elapsed() >= Duration::from_secs(1) {
                break r;
            }
            tokio::time::sleep(ms(10)).await;
        };
        let now = idempotency_errors(from).await + idempotency_errors(to).await;
        assert!(
            now > errors,
            "{}: a replay of {key} from {} expected, got {unexpected:?}",
            to.name,
            from.name
        );
        eprintln!("{key}: decided locally after a failed Redis call; again with another key");
    }
    panic!("three keyed POSTs in a row decided without Redis");
}

/// One request of the steady load: when it was sent, what it got.
#[derive(Debug, Clone)]
struct Sample {
    sent: Instant,
    kind: &'static str,
    answer: Answer,
}

/// Steady load on the three instances (GETs through a fleet-wide limit and
/// a shared breaker, keyed POSTs) while Redis is killed and restarted: not
/// one request fails, the added latency's p99 stays within `[state]
/// timeout`, and the shared state is back within `refresh` of Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_fails_nothing_and_comes_back() {
    let _serial = serial().await;
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    // The default [state] timeout: what a request may wait on Redis.
    const TIMEOUT: Duration = Duration::from_millis(5);
    let o = orders().await;
    let extra = "[upstreams.svc.rate_limit]\nrps = 10000.0\nburst = 10000\n\
                 scope = \"fleet\"\nexpected_instances = 3\n";
    let f = fleet(
        &redis,
        "fleet-outage:",
        "refresh = \"200ms\"",
        &svc(&o.up.url(), extra),
    )
    .await;
    let f: Vec<Arc<Instance>> = f.into_iter().map(Arc::new).collect();

    // A keyed POST replayed across instances: the store is Redis's.
    let c = client();
    replayed_across(&c, &f[0], &f[1], "before").await;

    // The load: per instance a GET every 10 ms and a keyed POST (a new
    // key each) every 50 ms, each sent without waiting for the others.
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let drivers: Vec<_> = f
        .iter()
        .map(|inst| {
            let (inst, stop, samples) = (inst.clone(), stop.clone(), samples.clone());
            tokio::spawn(async move {
                let c = client();
                // After a scheduling stall the ticker does not catch up
                // with a burst: a burst is
                // `a_burst_under_a_generous_fleet_limit_is_admitted`'s matter.
                let mut tick = tokio::time::interval(ms(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut sent = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let at = tick.tick().await;
                    let (c, inst, samples) = (c.clone(), inst.clone(), samples.clone());
                    let keyed = i % 5 == 0;
                    sent.push(tokio::spawn(async move {
                        let (kind, answer) = if keyed {
                            let key = format!("load-{}-{i}", inst.name);
                            let r = send(&c, &inst, Method::POST, Some(&key), "x").await;
                            ("post", r)
                        } else {
                            ("get", get(&c, &inst).await)
                        };
                        samples.lock().unwrap().push(Sample {
                            sent: at,
                            kind,
                            answer,
                        });
                    }));
                    i += 1;
                }
                for s in sent {
                    s.await.unwrap();
                }
            })
        })
        .collect();

    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let killed = Instant::now();
    tokio::task::block_in_place(|| redis.kill());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let restarting = Instant::now();
    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    // Shared state back: every instance's backend up again.
    let mut back = Vec::new();
    for inst in &f {
        loop {
            let m = inst.metrics().await;
            if m.get("weir_state_backend_up", &[]) == 1.0 {
                back.push((inst.name, restarted.elapsed()));
                break;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(5),
                "{} still down",
                inst.name
            );
            tokio::time::sleep(ms(5)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    for d in drivers {
        d.await.unwrap();
    }

    // After the restart: a keyed POST through A replayed through C.
    let took = replayed_across(&c, &f[0], &f[2], "after").await;

    let samples = samples.lock().unwrap().clone();
    let failed: Vec<&Sample> = samples
        .iter()
        .filter(|s| !(200..300).contains(&s.answer.status))
        .collect();
    // Latency before (from 0.5 s in, past the warm-up) and while Redis was
    // killed (until its restart began).
    let lat = |from: Instant, to: Instant| -> Vec<Duration> {
        samples
            .iter()
            .filter(|s| s.sent >= from && s.sent < to)
            .map(|s| s.answer.took)
            .collect()
    };
    let before = lat(t0 + ms(500), killed);
    let during = lat(killed, restarting);
    let keyed_during: Vec<Duration> = samples
        .iter()
        .filter(|s| s.kind == "post" && s.sent >= killed && s.sent < restarting)
        .map(|s| s.answer.took)
        .collect();
    let (p99_before, p99_during) = (quantile(&before, 0.99), quantile(&during, 0.99));
    let (p50_before, p50_during) = (quantile(&before, 0.5), quantile(&during, 0.5));
    let mut errors = Vec::new();
    for inst in &f {
        let m = inst.metrics().await;
        errors.push((inst.name, m.errors()));
    }
    eprintln!(
        "{} requests, {} failed; before the kill: {} requests, p50 {p50_before:?}, p99 \
         {p99_before:?}; Redis killed: {} requests, p50 {p50_during:?}, p99 {p99_during:?} \
         (keyed POSTs p99 {:?}, max {:?}); backend up again {back:?} after the restart; \
         replayed across instances {took:?} after; state errors {errors:?}",
        samples.len(),
        failed.len(),
        before.len(),
        during.len(),
        quantile(&keyed_during, 0.99),
        quantile(&keyed_during, 1.0),
    );
    assert!(
        failed.is_empty(),
        "failed: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert!(
        errors.iter().all(|(_, e)| *e > 0.0),
        "the outage was seen: {errors:?}"
    );
    // About 600 each; a loaded machine loses ticks (they are not caught up).
    assert!(before.len() > 300 && during.len() > 300);
    // The added p99 within `timeout`. Tolerance: on a two-core machine
    // running three weirs, their clients and the upstream in one test
    // process, p99 moves by a few milliseconds between any two 2-second
    // stretches with nothing changed (quiet: 3 to 9 ms before, 1.6 to 3 ms
    // with Redis killed, which spares the keyed POSTs their round trip);
    // 10 ms of it is allowed on top, so a request that waited on the dead
    // Redis for longer than a couple of timeouts (a reconnect, the 1 s
    // connect timeout, any unbounded wait) still fails the test. Another
    // process keeping both cores busy (a release build, callgrind) stalls
    // the whole test process for tens of milliseconds at a time and can
    // fail it: run it on a quiet machine.
    let tolerance = ms(10);
    assert!(
        p99_during <= p99_before + TIMEOUT + tolerance,
        "p99 {p99_before:?} before, {p99_during:?} with Redis killed"
    );
    // Back within `refresh` (+ slack for the checks' own polling) of Redis
    // answering again.
    for (name, t) in &back {
        assert!(
            *t <= REFRESH + ms(100),
            "{name} up again {t:?} after the restart"
        );
    }
}

/// Redis stalls (`CLIENT PAUSE`, 300 ms) while a keyed POST goes through
/// A: A's `begin` times out and A's own store decides — forwarded, 201 —
/// while the begin, already sent, lands on Redis once the stall is over
/// and records the key in flight, owned by A. The retries of that POST,
/// through any instance, are then replayed — not refused with 409
/// `idempotency_in_flight` until the record's lease (the request's
/// `timeout` plus up to 30 s) runs out, to be delivered a second time
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_decided_while_redis_stalled_is_replayed_not_wedged() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let o = orders().await;
    let f = fleet(
        &redis,
        "fleet-stall:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\""),
        &svc(&o.up.url(), ""),
    )
    .await;
    let c = client();
    // The scripts loaded (a script Redis does not know yet takes a second
    // round trip, which a call given up on never makes).
    replayed_across(&c, &f[0], &f[1], "warm").await;
    let delivered = o.up.requests();

    let stall = ms(300);
    let pause = stall.as_millis().to_string();
    assert_eq!(
        redis_command(&redis, &["CLIENT", "PAUSE", &pause, "ALL"]).await,
        "OK"
    );
    let paused = Instant::now();
    let r = post(&c, &f[0], "stalled", "x").await;
    assert_eq!((r.status, r.replayed), (201, false), "{r:?}");
    assert!(
        paused.elapsed() < stall,
        "A waited for Redis: answered {:?} into the stall",
        paused.elapsed()
    );
    assert_eq!(o.up.requests(), delivered + 1);
    let m = f[0].metrics().await;
    let begin_errors = m.get("weir_state_errors_total", &[("op", "idempotency_begin")]);
    assert_eq!(begin_errors, 1.0, "A's begin timed out");
    tokio::time::sleep_until(paused + stall + ms(100)).await;

    // Every instance, A too, replays it within a second (a 409 while the
    // writes queued behind the stall land).
    for inst in [&f[1], &f[2], &f[0]] {
        let start = Instant::now();
        loop {
            let r = post(&c, inst, "stalled", "x").await;
            if r.status == 201 && r.replayed {
                break;
            }
            assert!(
                r.error == "idempotency_in_flight" && start.elapsed() < Duration::from_secs(1),
                "{}: a replay expected, got {r:?}",
                inst.name
            );
            tokio::time::sleep(ms(20)).await;
        }
    }
    assert_eq!(o.up.requests(), delivered + 1, "delivered once");
}

// ---------------------------------------------------------------------------
// 5. What a closed breaker costs.

/// With the breaker shared and no rate-limit or keyed traffic, Redis sees
/// the same commands whether the fleet serves no requests or thousands:
/// the heartbeat PINGs (one a second per instance) and the refresher's
/// PTTL (one per `refresh` per instance, for the one upstream), nothing
/// per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_breakers_make_no_redis_call() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let f = fleet(
        &redis,
        "fleet-cost:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\"\nrefresh = \"200ms\""),
        &svc(&up.url(), ""),
    )
    .await;
    let f: Vec<Arc<Instance>> = f.into_iter().map(Arc::new).collect();
    // Two seconds: a whole number of heartbeats (1 s) and refreshes
    // (200 ms), so that an idle and a busy window see as many.
    let window = Duration::from_secs(2);

    // Time-based commands the whole fleet may make in `dt`: per instance a
    // PING a second and a PTTL per refresh, each rounded up, plus one for
    // the window's edges.
    let pings_in = |dt: Duration| 3.0 * ((dt.as_secs_f64() / 1.0).ceil() + 1.0);
    let pttls_in = |dt: Duration| 3.0 * ((dt.as_secs_f64() / REFRESH.as_secs_f64()).ceil() + 1.0);

    let mut rounds = Vec::new();
    for busy in [false, true] {
        let mut weir_before = Vec::new();
        for i in &f {
            weir_before.push(i.metrics().await);
        }
        reset_stats(&redis).await;
        let start = Instant::now();
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        // Busy: eight requests at a time per instance, for the whole
        // window (and a little past it: Redis is read at its end sharp, so
        // both windows are as long).
        let tasks: Vec<_> = f
            .iter()
            .flat_map(|inst| (0..8).map(move |_| inst.clone()))
            .filter(|_| busy)
            .map(|inst| {
                let (served, stop) = (served.clone(), stop.clone());
                tokio::spawn(async move {
                    let c = client();
                    while !stop.load(Ordering::SeqCst) {
                        let r = get(&c, &inst).await;
                        assert_eq!(r.status, 200, "{r:?}");
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        tokio::time::sleep_until(start + window).await;
        let stats = commandstats(&redis).await;
        let n = served.load(Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        for t in tasks {
            t.await.unwrap();
        }
        let mut by_op: BTreeMap<String, f64> = BTreeMap::new();
        for (i, b) in f.iter().zip(&weir_before) {
            let m = i.metrics().await;
            for op in weir::metrics::state::OPS {
                *by_op.entry(op.to_string()).or_default() +=
                    m.commands(Some(op)) - b.commands(Some(op));
            }
            assert_eq!(m.errors(), 0.0, "{}: a Redis call failed", i.name);
        }
        // weir's counts were read after the load stopped: a little later.
        let dt = start.elapsed();
        eprintln!(
            "{n} requests in {window:?}: Redis saw {stats:?}; weir's commands by op in \
             {dt:?}: {by_op:?} (time-based allowance for {dt:?}: {} PING, {} PTTL)",
            pings_in(dt),
            pttls_in(dt)
        );
        // Redis's count, less the time-based commands, is zero.
        let ping = stats.get("ping").copied().unwrap_or(0);
        let pttl = stats.get("pttl").copied().unwrap_or(0);
        let other: Vec<_> = stats
            .iter()
            .filter(|(k, _)| *k != "ping" && *k != "pttl")
            .collect();
        assert!(other.is_empty(), "commands beyond PING and PTTL: {other:?}");
        assert!(
            ping as f64 <= pings_in(window),
            "{ping} PINGs in {window:?}"
        );
        assert!(
            pttl as f64 <= pttls_in(window),
            "{pttl} PTTLs in {window:?}"
        );
        // weir's own count agrees: heartbeats and refreshes only.
        for (op, v) in &by_op {
            match op.as_str() {
                "ping" => assert!(*v <= pings_in(dt), "{v} pings"),
                "breaker_refresh" => assert!(*v <= pttls_in(dt), "{v} refreshes"),
                _ => assert_eq!(*v, 0.0, "{op}: {v} commands"),
            }
        }
        rounds.push((n, ping + pttl));
    }
    let (idle, busy) = (rounds[0], rounds[1]);
    assert_eq!(idle.0, 0);
    assert!(busy.0 >= 500, "only {} requests served", busy.0);
    // The same count for none and for thousands of requests, within what
    // the windows' edges may hold: two windows of one length see, per
    // instance, at most one heartbeat and one refresh more or fewer.
    let edge = 3 + 3;
    assert!(
        busy.1 <= idle.1 + edge,
        "{} commands idle, {} with {} requests",
        idle.1,
        busy.1,
        busy.0
    );
    assert!(up.requests() >= busy.0);
}

// ---------------------------------------------------------------------------
// 6. A burst under a generous fleet limit.

/// 50 simultaneous requests to an idle instance under a fleet limit of
/// 10,000 rps, burst 10,000 are all admitted — as they are with the same
/// limit and `scope = "instance"`.
///
/// They once were not: an instance whose leased stock was spent admitted
/// ⌈b/4⌉ (3) requests on credit while its fetch was in flight and refused
/// the rest with 429 `rate_limited` (36 to 47 of the 50), though the
/// fleet's bucket was full. Now the rest is decided by the local fallback
/// limit until the lease is back (`policy::leased_tokens::LeasedBucket::take`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_burst_under_a_generous_fleet_limit_is_admitted() {
    let _serial = serial().await;
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let up = TestUpstream::text("ok").await;
    let extra = "[upstreams.svc.rate_limit]\nrps = 10000.0\nburst = 10000\nscope = \"fleet\"\n";
    let f = fleet(
        &redis,
        "fleet-burst:",
        &format!("timeout = \"{FUNCTIONAL_TIMEOUT}\""),
        &svc(&up.url(), extra),
    )
    .await;
    let a = Arc::new(f.into_iter().next().unwrap());
    for round in 0..3 {
        // Idle for longer than a lease lasts (1 s): no stock left.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { get(&client(), &a).await })
            })
            .collect();
        let mut refused = 0;
        for t in tasks {
            let r = t.await.unwrap();
            if r.status != 200 {
                assert_eq!((r.status, r.error.as_str()), (429, "rate_limited"));
                refused += 1;
            }
        }
        assert_eq!(refused, 0, "round {round}: {refused} of 50 refused");
    }
}
