//! `weir chaos slow-readers` (docs/reference/admission.md#adaptive-limit):
//! clients that hold weir's slots by being slow, not by asking much. The
//! upstream serves 20 at once for 20 ms each (400 a second), and answers a
//! `/big` request with 8 MB. A well-behaved app sends 20 `GET`s a second
//! for the whole run. From `attack_at` on, `readers` clients each ask for
//! `/big` and read the answer a byte a second (a 4 KiB receive buffer, so
//! the kernel does not read ahead for them), and `uploaders` clients each
//! send a `POST` whose 4-byte body comes a byte a second, one after
//! another; each kind's clients start spread over a second. Two columns, each on a fresh upstream and a fresh weir: weir's
//! default fixed limit (`max_in_flight = 1024`) and `limit = "adaptive"`.
//! Rows: the app's success before and during the attack, its p99 during
//! the attack, and the limit before the attack and at its end. The target
//! (bench/RESULTS.md): ≥ 99 % success during the attack, and the adaptive
//! limit at its end within 20 % of where it was before.

use super::driver::{drive, Load, Mode, Observed, Target};
use super::upstream::Profile;
use super::ScenarioOptions;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The adaptive column's setting over weir's defaults.
pub const ADAPTIVE: &str = "[upstreams.chaos.concurrency]\nlimit = \"adaptive\"\n";

/// The two columns.
pub const FIXED: &str = "weir, fixed limit (default)";
pub const ADAPTIVE_COLUMN: &str = "weir, adaptive";

/// What the scenario runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowShape {
    /// Requests the upstream serves at once, for `service` each.
    pub slots: u32,
    pub service: Duration,
    /// The `/big` answer's size.
    pub big: usize,
    /// The app's requests a second, and its timeout for each.
    pub rate: f64,
    pub client_timeout: Duration,
    /// How long the run lasts, and when the attack starts.
    pub length: Duration,
    pub attack_at: Duration,
    /// Attackers of each kind.
    pub readers: usize,
    pub uploaders: usize,
}

impl Default for SlowShape {
    fn default() -> Self {
        SlowShape {
            slots: 20,
            service: Duration::from_millis(20),
            big: 8 << 20,
            rate: 20.0,
            client_timeout: Duration::from_secs(1),
            length: Duration::from_secs(20),
            attack_at: Duration::from_secs(5),
            readers: 12,
            uploaders: 12,
        }
    }
}

/// One column's figures.
#[derive(Debug, Clone)]
pub struct SlowCell {
    pub column: String,
    pub observed: Observed,
    pub attack_at: Duration,
    /// The limit, sampled every 50 ms from the start.
    pub limits: Vec<(Duration, u32)>,
    /// Bytes the readers got, and uploads the uploaders finished.
    pub read: u64,
    pub uploads: u64,
}

impl SlowCell {
    fn split(&self, during: bool) -> impl Iterator<Item = &super::driver::RequestRecord> {
        let at = self.attack_at;
        self.observed
            .records
            .iter()
            .filter(move |r| (r.start >= at) == during)
    }

    /// The app's successes and requests, before (`false`) or during the attack.
    pub fn success(&self, during: bool) -> (u64, u64) {
        let (mut ok, mut n) = (0, 0);
        for r in self.split(during) {
            n += 1;
            ok += u64::from(r.ok);
        }
        (ok, n)
    }

    /// The app's answered requests' p99 during the attack.
    pub fn p99_during(&self) -> Option<Duration> {
        let mut v: Vec<Duration> = self
            .split(true)
            .filter(|r| r.ok)
            .map(|r| r.latency)
            .collect();
        v.sort();
        let i = ((v.len() as f64 * 0.99).ceil() as usize).max(1) - 1;
        v.get(i).copied()
    }

    fn median_limit(&self, from: Duration, to: Duration) -> Option<u32> {
        let mut l: Vec<u32> = self
            .limits
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, l)| *l)
            .collect();
        l.sort_unstable();
        l.get(l.len() / 2).copied()
    }

    /// The limit's median in the second before the attack.
    pub fn limit_before(&self) -> Option<u32> {
        self.median_limit(
            self.attack_at.saturating_sub(Duration::from_secs(1)),
            self.attack_at,
        )
    }

    /// The limit's median in the last second of the run.
    pub fn limit_at_end(&self) -> Option<u32> {
        let end = self.limits.last()?.0;
        self.median_limit(
            end.saturating_sub(Duration::from_secs(1)),
            end + Duration::from_millis(1),
        )
    }
}

/// What `weir chaos slow-readers` measured.
#[derive(Debug, Clone)]
pub struct SlowReport {
    pub shape: SlowShape,
    pub cells: Vec<SlowCell>,
}

/// The upstream.
pub fn profile(shape: &SlowShape) -> Profile {
    Profile {
        big_body: Some(shape.big),
        ..super::levels::capacity_profile(shape.slots, shape.service, None, None)
    }
}

/// A client that asks for `/big` and reads its answer a byte a second
/// until `stop`; counts what it read.
async fn slow_reader(addr: SocketAddr, stop: Arc<AtomicBool>, read: Arc<AtomicU64>) {
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return;
    };
    let _ = socket.set_recv_buffer_size(4096);
    let Ok(mut s) = socket.connect(addr).await else {
        return;
    };
    if s.write_all(b"GET /big HTTP/1.1\r\nhost: chaos\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut byte).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                read.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A client that sends `POST`s whose 4-byte body comes a byte a second,
/// one after another on its connection, until `stop`; counts the uploads
/// answered.
async fn slow_uploader(addr: SocketAddr, stop: Arc<AtomicBool>, uploads: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            return;
        };
        let head =
            b"POST /up HTTP/1.1\r\nhost: chaos\r\ncontent-length: 4\r\nconnection: close\r\n\r\n";
        if s.write_all(head).await.is_err() {
            return;
        }
        for _ in 0..4 {
            if stop.load(Ordering::Relaxed) || s.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
        if matches!(read, Ok(Ok(_))) && answer.starts_with(b"HTTP/1.1 2") {
            uploads.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One column, on a fresh upstream and weir.
async fn measure(
    shape: &SlowShape,
    opts: &ScenarioOptions,
    column: &'static str,
) -> Result<SlowCell, String> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let up = super::levels::start_upstream(any, profile(shape), opts.seed).await?;
    let extra = if column == ADAPTIVE_COLUMN {
        ADAPTIVE
    } else {
        ""
    };
    let (proxy, state) = super::levels::start_weir(&up, opts, extra).await?;
    let addr = proxy.listen_addr();
    let limits = Arc::new(Mutex::new(Vec::new()));
    let t0 = tokio::time::Instant::now();
    let (s, out) = (state.clone(), limits.clone());
    let sampler = tokio::spawn(async move {
        loop {
            let limit = s.gate.view().limit;
            if let Ok(mut v) = out.lock() {
                v.push((t0.elapsed(), limit));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (read, uploads) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let attack = {
        let (shape, stop, read, uploads) =
            (shape.clone(), stop.clone(), read.clone(), uploads.clone());
        tokio::spawn(async move {
            tokio::time::sleep(shape.attack_at).await;
            // Each kind's clients start spread over a second, as clients
            // that arrive on their own do (not all in the same millisecond).
            let mut clients = Vec::new();
            let spread = |i: usize, n: usize| Duration::from_secs(1) * i as u32 / n.max(1) as u32;
            for i in 0..shape.readers {
                let (stop, read) = (stop.clone(), read.clone());
                let after = spread(i, shape.readers);
                clients.push(tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    slow_reader(addr, stop, read).await
                }));
            }
            for i in 0..shape.uploaders {
                let (stop, uploads) = (stop.clone(), uploads.clone());
                let after = spread(i, shape.uploaders);
                clients.push(tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    slow_uploader(addr, stop, uploads).await
                }));
            }
            clients
        })
    };
    let load = Load {
        requests: (shape.rate * shape.length.as_secs_f64()).round() as usize,
        mode: Mode::Open(shape.rate),
        max_time: shape.length + shape.client_timeout,
        method: http::Method::GET,
        client_timeout: shape.client_timeout,
        keys: None,
    };
    let target = Target::Weir {
        addr,
        host: "chaos".into(),
    };
    let observed = drive(target, load).await;
    stop.store(true, Ordering::Relaxed);
    sampler.abort();
    let _ = sampler.await;
    if let Ok(clients) = attack.await {
        for c in clients {
            c.abort();
        }
    }
    proxy.shutdown(Duration::from_secs(1)).await;
    drop(up);
    let limits = limits.lock().map(|v| v.clone()).unwrap_or_default();
    Ok(SlowCell {
        column: column.into(),
        observed,
        attack_at: shape.attack_at,
        limits,
        read: read.load(Ordering::Relaxed),
        uploads: uploads.load(Ordering::Relaxed),
    })
}

/// Both columns, one after the other.
pub async fn measure_all(shape: &SlowShape, opts: &ScenarioOptions) -> Result<SlowReport, String> {
    let mut cells = Vec::new();
    for column in [FIXED, ADAPTIVE_COLUMN] {
        cells.push(measure(shape, opts, column).await?);
    }
    Ok(SlowReport {
        shape: shape.clone(),
        cells,
    })
}

/// `weir chaos slow-readers`, as a scenario report.
pub async fn run(opts: &ScenarioOptions) -> Result<super::ScenarioReport, String> {
    let report = measure_all(&SlowShape::default(), opts).await?;
    Ok(super::ScenarioReport {
        slow: Some(report),
        ..super::levels::scenario_report(super::Scenario::SlowReaders, opts, ADAPTIVE)?
    })
}

fn percent((ok, n): (u64, u64)) -> String {
    match n {
        0 => "—".into(),
        _ => format!("{ok}/{n} ({:.1} %)", ok as f64 * 100.0 / n as f64),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("—".into(), |v| v.to_string())
}

/// One row of the table: its label and how a cell shows it.
type Row<'a> = (&'a str, &'a dyn Fn(&SlowCell) -> String);

/// The table, in Markdown.
pub fn table(r: &SlowReport) -> String {
    let s = &r.shape;
    let mut out = format!(
        "scenario: slow-readers — an upstream serving {} at once for {} ms each; an app at {} requests/s (timeout {} s) for {} s; from {} s on, {} clients read an {} MB answer a byte a second and {} send a 4-byte body a byte a second\n\n",
        s.slots,
        s.service.as_millis(),
        s.rate,
        s.client_timeout.as_secs_f64(),
        s.length.as_secs(),
        s.attack_at.as_secs(),
        s.readers,
        s.big >> 20,
        s.uploaders,
    );
    let names: Vec<&str> = r.cells.iter().map(|c| c.column.as_str()).collect();
    let _ = writeln!(out, "| | {} |", names.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(names.len()));
    let rows: [Row<'_>; 6] = [
        ("app's success before the attack", &|c| {
            percent(c.success(false))
        }),
        ("app's success during the attack", &|c| {
            percent(c.success(true))
        }),
        ("app's p99 during the attack", &|c| {
            opt(c
                .p99_during()
                .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0)))
        }),
        ("limit before the attack", &|c| opt(c.limit_before())),
        ("limit at the end", &|c| opt(c.limit_at_end())),
        ("attackers' bytes read / uploads answered", &|c| {
            format!("{} / {}", c.read, c.uploads)
        }),
    ];
    for (name, f) in rows {
        let cells: Vec<String> = r.cells.iter().map(f).collect();
        let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
    }
    out
}

/// The same as JSON.
pub fn json(r: &SlowReport) -> serde_json::Value {
    let cells: Vec<serde_json::Value> = r
        .cells
        .iter()
        .map(|c| {
            let (ok_before, n_before) = c.success(false);
            let (ok_during, n_during) = c.success(true);
            serde_json::json!({
                "column": c.column,
                "ok_before": ok_before,
                "requests_before": n_before,
                "ok_during": ok_during,
                "requests_during": n_during,
                "p99_during_ms": c.p99_during().map(|d| d.as_secs_f64() * 1000.0),
                "limit_before": c.limit_before(),
                "limit_at_end": c.limit_at_end(),
                "readers_bytes": c.read,
                "uploads_answered": c.uploads,
            })
        })
        .collect();
    serde_json::json!({
        "scenario": "slow-readers",
        "readers": r.shape.readers,
        "uploaders": r.shape.uploaders,
        "rate": r.shape.rate,
        "cells": cells,
    })
}
