//! `weir chaos double-submit`: an impatient app against a slow upstream.
//!
//! The upstream takes [`UPSTREAM_TAKES`] over every request. The app sends
//! keyed POSTs (`Idempotency-Key`, one key per POST) and gives each send
//! [`CLIENT_TIMEOUT`]; when no answer has arrived by then it abandons the
//! send — drops the connection — and re-sends the same POST with the same
//! key at once. A 409 `idempotency_in_flight` means "wait and re-send": it
//! waits the `Retry-After` (else [`CLIENT_TIMEOUT`]). A transport error, a
//! 5xx or a 429 waits [`CLIENT_TIMEOUT`] before the re-send. A 2xx ends the
//! POST, and so does any other status (a final answer). No send starts
//! [`GIVE_UP`] or later after the POST's first, so a POST makes at most
//! ⌈[`GIVE_UP`] / [`CLIENT_TIMEOUT`]⌉ = 10 sends.
//!
//! The three columns put the same app straight at the upstream, behind the
//! hand-rolled retry loop of the other scenarios (inside each send), and
//! behind weir on its default policy. The upstream counts deliveries per
//! key: every one beyond the first is a duplicate.

use super::driver::{offer, Load, Observed, RequestRecord, Target};
use super::upstream::{ChaosUpstream, REQUEST_ID};
use super::{
    config::weir_config, start_upstream, start_weir, weir_rows, BreakerTrace, Column, Scenario,
    ScenarioOptions, ScenarioReport,
};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// How long the upstream takes over every request (the scenario's profile).
pub const UPSTREAM_TAKES: Duration = Duration::from_secs(1);
/// How long the app waits for the answer to one send before it abandons it
/// and re-sends (the scenario's `Load::client_timeout`).
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);
/// No send starts this long or longer after a POST's first.
pub const GIVE_UP: Duration = Duration::from_secs(3);

/// The header the app puts its key in (weir's default `idempotency_header`).
const KEY_HEADER: &str = "idempotency-key";
const BODY: &[u8] = b"{\"amount\":100}";

/// What the re-sending app saw, summed over its POSTs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resends {
    /// POSTs, each with its own key.
    pub posts: u64,
    /// POSTs that got a 2xx in the end.
    pub answered: u64,
    /// Sends: the first of each POST and every re-send.
    pub sends: u64,
    /// Sends abandoned at the app's timeout (their connection dropped).
    pub abandoned: u64,
    /// 409 `idempotency_in_flight` answers.
    pub in_flight: u64,
    /// 2xx answers with `Idempotent-Replayed: true`.
    pub replays: u64,
    /// Sends that failed otherwise: a transport error, a 5xx, a 429.
    pub failed: u64,
    /// POSTs ended by another status (a final answer that is not a 2xx).
    pub finals: u64,
}

impl std::ops::AddAssign for Resends {
    fn add_assign(&mut self, o: Resends) {
        self.posts += o.posts;
        self.answered += o.answered;
        self.sends += o.sends;
        self.abandoned += o.abandoned;
        self.in_flight += o.in_flight;
        self.replays += o.replays;
        self.failed += o.failed;
        self.finals += o.finals;
    }
}

/// How one send ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// A 2xx, in full.
    Ok { replayed: bool },
    /// weir's 409 `idempotency_in_flight`, with its `Retry-After`.
    InFlight(Option<Duration>),
    /// A 5xx or a 429.
    Retry,
    /// Any other status.
    Final,
    /// No response: refused, reset, broken off.
    Failed,
}

/// Runs the scenario: three columns, one after the other.
pub(super) async fn run(opts: &ScenarioOptions) -> Result<ScenarioReport, String> {
    let scenario = Scenario::DoubleSubmit;
    let load = scenario.load(opts.requests, opts.rate);
    let probe = weir_config(
        scenario,
        "127.0.0.1:9".parse().map_err(|_| "addr")?,
        opts.config.as_deref(),
    )?;
    let up_cfg = probe.upstreams.first().ok_or("no upstream")?.clone();
    let mut columns = Vec::new();
    if !opts.weir_only {
        let up = start_upstream(scenario, opts.seed).await?;
        let target = Target::Direct(up.addr);
        columns.push(measure("no weir", target, &load, opts.seed, &up).await);
        drop(up);

        // The naive loop of the other scenarios, inside each send.
        let up = start_upstream(scenario, opts.seed).await?;
        let naive = Target::Naive {
            addr: up.addr,
            attempts: 3,
            backoff: Duration::from_millis(100),
            per_try: up_cfg.per_try_timeout.unwrap_or(Duration::from_secs(1)),
        };
        columns.push(measure("naive retries", naive, &load, opts.seed, &up).await);
        drop(up);
    }
    let (up, proxy, metrics, target) = start_weir(scenario, opts).await?;
    let mut col = measure("weir", target, &load, opts.seed, &up).await;
    weir_rows(&mut col, &metrics, &proxy);
    columns.push(col);
    proxy.shutdown(Duration::from_secs(1)).await;
    Ok(ScenarioReport {
        scenario,
        seed: opts.seed,
        deadline: up_cfg.timeout,
        settings: scenario.settings(),
        merged: opts.config.clone(),
        half_open_probes: up_cfg.breaker.half_open_probes,
        columns,
        breaker: BreakerTrace::default(),
        overload: None,
        shed: None,
        slow: None,
    })
}

/// Runs the app's POSTs against `target` and reads the upstream's counts.
async fn measure(
    name: &'static str,
    target: Target,
    load: &Load,
    seed: u64,
    up: &ChaosUpstream,
) -> Column {
    let started = Instant::now();
    let timeout = load.client_timeout;
    let one = |id: u64| submit(target.clone(), format!("ds-{seed}-{id}"), timeout, started);
    let ran = offer(load, started, one).await;
    // Let the last deliveries of abandoned sends land before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut resends = Resends::default();
    let mut records = Vec::with_capacity(ran.len());
    for (record, r) in ran {
        records.push(record);
        resends += r;
    }
    Column {
        name,
        observed: Observed::of(records, started, 0),
        upstream_attempts: up.counters.received(),
        upstream_before_outage: None,
        refused: 0,
        back: None,
        duplicates: up.counters.duplicates(),
        transitions: None,
        stops: None,
        resends: Some(resends),
        cache: None,
        hedges: None,
        replicas: None,
    }
}

/// One POST, sent and re-sent with `key` as the app does.
async fn submit(
    target: Target,
    key: String,
    timeout: Duration,
    started: Instant,
) -> (RequestRecord, Resends) {
    let t0 = Instant::now();
    let mut r = Resends {
        posts: 1,
        ..Resends::default()
    };
    loop {
        r.sends += 1;
        let wait = match tokio::time::timeout(timeout, send(&target, &key)).await {
            Err(_) => {
                r.abandoned += 1;
                Duration::ZERO
            }
            Ok(Reply::Ok { replayed }) => {
                r.answered = 1;
                r.replays += u64::from(replayed);
                break;
            }
            Ok(Reply::Final) => {
                r.finals = 1;
                break;
            }
            Ok(Reply::InFlight(after)) => {
                r.in_flight += 1;
                after.unwrap_or(timeout)
            }
            Ok(Reply::Retry | Reply::Failed) => {
                r.failed += 1;
                timeout
            }
        };
        if t0.elapsed() + wait >= GIVE_UP {
            break;
        }
        tokio::time::sleep(wait).await;
    }
    let record = RequestRecord {
        start: t0.duration_since(started),
        latency: t0.elapsed(),
        ok: r.answered == 1,
        key: None,
    };
    (record, r)
}

/// One send: straight, through the naive loop, or through weir.
async fn send(target: &Target, key: &str) -> Reply {
    match target {
        Target::Direct(addr) => exchange(*addr, None, key).await,
        Target::Weir { addr, host } => exchange(*addr, Some(host), key).await,
        // Not used by this scenario: its keyed POSTs go to one upstream.
        Target::Spread(addrs) => match addrs.first() {
            Some(a) => exchange(*a, None, key).await,
            None => Reply::Failed,
        },
        Target::Naive {
            addr,
            attempts,
            backoff,
            per_try,
        } => {
            let mut last = Reply::Failed;
            for i in 0..*attempts {
                match tokio::time::timeout(*per_try, exchange(*addr, None, key)).await {
                    Ok(r @ (Reply::Ok { .. } | Reply::Final | Reply::InFlight(_))) => return r,
                    Ok(r) => last = r,
                    Err(_) => last = Reply::Failed,
                }
                if i + 1 < *attempts {
                    tokio::time::sleep(*backoff).await;
                }
            }
            last
        }
    }
}

/// One POST on a connection of its own; dropping this future drops the
/// connection, as an app that gives up on a request does.
async fn exchange(addr: SocketAddr, host: Option<&str>, key: &str) -> Reply {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return Reply::Failed;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut tx, conn)) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
    else {
        return Reply::Failed;
    };
    let req = Request::builder()
        .method(Method::POST)
        .uri("/chaos")
        .header(
            http::header::HOST,
            host.map_or_else(|| addr.to_string(), str::to_owned),
        )
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(KEY_HEADER, key)
        // The upstream counts deliveries per key.
        .header(REQUEST_ID, key)
        .body(Full::new(Bytes::from_static(BODY)));
    let Ok(req) = req else {
        return Reply::Failed;
    };
    let exchange = async move {
        let resp = tx.send_request(req).await.ok()?;
        let (parts, body) = resp.into_parts();
        // A response counts when it has fully arrived.
        body.collect().await.ok()?;
        Some(parts)
    };
    tokio::pin!(conn, exchange);
    let parts = tokio::select! {
        biased;
        p = &mut exchange => p,
        // The connection ended first: the exchange has its result or error.
        _ = &mut conn => exchange.await,
    };
    let Some(parts) = parts else {
        return Reply::Failed;
    };
    let field = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    match parts.status.as_u16() {
        200..=299 => Reply::Ok {
            replayed: field("idempotent-replayed").eq_ignore_ascii_case("true"),
        },
        409 if field("x-weir-error") == "idempotency_in_flight" => Reply::InFlight(
            field("retry-after")
                .trim()
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs),
        ),
        429 | 500.. => Reply::Retry,
        _ => Reply::Final,
    }
}

/// The report's rows for this scenario, as (label, one cell per column);
/// `None` for the others.
pub fn rows(r: &ScenarioReport) -> Option<Vec<(String, Vec<String>)>> {
    if r.scenario != Scenario::DoubleSubmit {
        return None;
    }
    let cell = |f: &dyn Fn(&Column, &Resends) -> String| {
        r.columns
            .iter()
            .map(|c| f(c, &c.resends.unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    // The time to the 2xx of the POSTs that got one.
    let to_2xx = |c: &Column, p: f64| {
        let mut v: Vec<Duration> = c
            .observed
            .records
            .iter()
            .filter(|x| x.ok)
            .map(|x| x.latency)
            .collect();
        if v.is_empty() {
            return "—".to_string();
        }
        v.sort();
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        ms(v[i])
    };
    let pct = |n: u64, of: u64| {
        if of == 0 {
            0.0
        } else {
            n as f64 * 100.0 / of as f64
        }
    };
    Some(vec![
        (
            "POSTs (one key each)".into(),
            cell(&|_, s| s.posts.to_string()),
        ),
        (
            "client sends (re-sends included)".into(),
            cell(&|_, s| s.sends.to_string()),
        ),
        (
            format!("sends abandoned at {}", ms(CLIENT_TIMEOUT)),
            cell(&|_, s| s.abandoned.to_string()),
        ),
        (
            "409 idempotency_in_flight seen".into(),
            cell(&|_, s| s.in_flight.to_string()),
        ),
        (
            "POSTs answered 2xx in the end".into(),
            cell(&|_, s| format!("{} ({:.2} %)", s.answered, pct(s.answered, s.posts))),
        ),
        (
            "replays served (Idempotent-Replayed: true)".into(),
            cell(&|_, s| s.replays.to_string()),
        ),
        ("time to the 2xx, p50".into(), cell(&|c, _| to_2xx(c, 0.5))),
        ("time to the 2xx, max".into(), cell(&|c, _| to_2xx(c, 1.0))),
        (
            "upstream deliveries".into(),
            cell(&|c, _| c.upstream_attempts.to_string()),
        ),
        (
            "duplicate deliveries".into(),
            cell(&|c, _| c.duplicates.to_string()),
        ),
    ])
}

/// What the upstream and the app do in this scenario, for under the table;
/// `None` for the other scenarios.
pub fn story(r: &ScenarioReport) -> Option<String> {
    if r.scenario != Scenario::DoubleSubmit {
        return None;
    }
    let takes = match r.scenario.profile().latency {
        super::upstream::Latency::Fixed(d) => d,
        _ => UPSTREAM_TAKES,
    };
    let ms = |d: Duration| d.as_millis();
    Some(format!(
        "the upstream takes {} ms over every request. The app sends each POST with a key of its own \
         and abandons a send (dropping its connection) when no answer has come within {} ms, then \
         re-sends the same POST with the same key at once; after a 409 idempotency_in_flight it \
         waits the Retry-After, after a transport error, 5xx or 429 {} ms; a 2xx or any other \
         status ends the POST, and no send starts {} ms or more after the first. The naive loop \
         (3 attempts, 100 ms apart) runs inside each send.",
        ms(takes),
        ms(CLIENT_TIMEOUT),
        ms(CLIENT_TIMEOUT),
        ms(GIVE_UP),
    ))
}
