//! `weir chaos soak`: the weir binary, as deployed, run as a child process
//! between an open-loop load and the fault-injecting upstream for a long
//! while, its resident memory and open file descriptors sampled every
//! interval. It fails when either has grown by more than 10 % after the
//! warm-up — the lowest value of the last third of the samples above the
//! highest of the first third: a leak that a minute-long benchmark cannot
//! see.
//!
//! The upstream answers 20 % of requests 503 and resets 5 % (half before
//! reading them, half after), after 1–10 ms; a tenth of the load is POSTs
//! of 1 KiB with an idempotency key, so retries, replayed bodies, the
//! budget and connection churn all run the whole time.

use super::driver::HttpClient;
use super::upstream::{ChaosUpstream, Latency, Profile};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Growth beyond this share of the post-warm-up baseline fails the soak.
pub const MAX_GROWTH: f64 = 0.10;

#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The weir binary to run.
    pub weir: PathBuf,
    pub duration: Duration,
    pub interval: Duration,
    /// Samples before this are shown but not judged.
    pub warmup: Duration,
    /// Requests offered per second.
    pub rate: f64,
    pub seed: u64,
}

/// One sample of the weir process and the load so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoakSample {
    pub at: Duration,
    pub rss_kib: u64,
    pub fds: u64,
    /// Requests answered in the interval, and how many with a 2xx.
    pub requests: u64,
    pub ok: u64,
}

/// The verdict on the samples after warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakVerdict {
    /// The highest value in the first third of the judged samples, and the
    /// lowest in the last third.
    pub rss_kib: (f64, f64),
    pub fds: (f64, f64),
    pub rss_growth: f64,
    pub fds_growth: f64,
    pub pass: bool,
}

/// Judges samples taken after the warm-up: the lowest value of the last
/// third against the highest of the first third. A leak raises even the
/// floor of the end above the peak of the start; a burst of connections
/// (more buffers for a moment, more descriptors) raises one sample, not the
/// floor, and does not decide it. `None` with fewer than two samples.
pub fn judge(samples: &[SoakSample]) -> Option<SoakVerdict> {
    if samples.len() < 2 {
        return None;
    }
    let third = (samples.len() / 3).max(1);
    let (first, last) = (&samples[..third], &samples[samples.len() - third..]);
    let peak =
        |s: &[SoakSample], f: fn(&SoakSample) -> u64| s.iter().map(f).max().unwrap_or(0) as f64;
    let floor =
        |s: &[SoakSample], f: fn(&SoakSample) -> u64| s.iter().map(f).min().unwrap_or(0) as f64;
    let rss_kib = (peak(first, |s| s.rss_kib), floor(last, |s| s.rss_kib));
    let fds = (peak(first, |s| s.fds), floor(last, |s| s.fds));
    let growth = |(a, b): (f64, f64)| if a > 0.0 { (b - a) / a } else { 0.0 };
    let (rss_growth, fds_growth) = (growth(rss_kib), growth(fds));
    Some(SoakVerdict {
        rss_kib,
        fds,
        rss_growth,
        fds_growth,
        pass: rss_growth <= MAX_GROWTH && fds_growth <= MAX_GROWTH,
    })
}

/// What a soak saw.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub samples: Vec<SoakSample>,
    pub verdict: Option<SoakVerdict>,
    pub requests: u64,
    pub ok: u64,
    /// Requests the load could not offer (too many still in flight).
    pub shed: u64,
    pub weir_pid: u32,
}

/// The weir child: killed when dropped, whatever happened.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` and the number of open descriptors of process `pid`.
fn measure(pid: u32) -> Result<(u64, u64), String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading /proc/{pid}/status (soak needs Linux): {e}"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS in /proc/PID/status")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| format!("reading /proc/{pid}/fd: {e}"))?
        .count() as u64;
    Ok((rss, fds))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

async fn ready(client: &HttpClient, admin: u16, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let uri = format!("http://127.0.0.1:{admin}/readyz");
        if let Ok(Ok(r)) = tokio::time::timeout(
            Duration::from_secs(1),
            client.get(uri.parse().unwrap_or_default()),
        )
        .await
        {
            if r.status().is_success() {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    ok: AtomicU64,
    shed: AtomicU64,
}

fn request(listen: u16, n: u64) -> http::Request<Full<Bytes>> {
    let builder = http::Request::builder().header("host", "chaos");
    let built = if n % 10 == 0 {
        builder
            .method("POST")
            .uri(format!("http://127.0.0.1:{listen}/soak/{n}"))
            .header("idempotency-key", format!("soak-{n}"))
            .header(super::upstream::REQUEST_ID, n.to_string())
            .body(Full::new(Bytes::from(vec![b'x'; 1024])))
    } else {
        builder
            .uri(format!("http://127.0.0.1:{listen}/soak/{n}"))
            .body(Full::new(Bytes::new()))
    };
    built.unwrap_or_default()
}

/// Offers `rate` requests a second until `until`, at most 2,000 in flight.
async fn load(client: HttpClient, listen: u16, rate: f64, until: Instant, counts: Arc<Counts>) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(2000));
    let tick = Duration::from_millis(10);
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut owed, mut n) = (0.0f64, 0u64);
    while Instant::now() < until {
        ticker.tick().await;
        owed += rate * tick.as_secs_f64();
        while owed >= 1.0 {
            owed -= 1.0;
            n += 1;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                counts.shed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let (client, counts, req) = (client.clone(), counts.clone(), request(listen, n));
            tokio::spawn(async move {
                let sent = tokio::time::timeout(Duration::from_secs(10), async {
                    let resp = client.request(req).await.ok()?;
                    let ok = resp.status().is_success();
                    resp.into_body().collect().await.ok()?;
                    Some(ok)
                })
                .await;
                counts.requests.fetch_add(1, Ordering::Relaxed);
                if matches!(sent, Ok(Some(true))) {
                    counts.ok.fetch_add(1, Ordering::Relaxed);
                }
                drop(permit);
            });
        }
    }
}

/// Runs a soak; `each` sees every sample as it is taken.
pub async fn run(
    opts: &SoakOptions,
    mut each: impl FnMut(&SoakSample),
) -> Result<SoakReport, String> {
    let profile = Profile {
        fail_rate: 0.2,
        reset_before: 0.025,
        reset_after: 0.025,
        latency: Latency::Uniform(Duration::from_millis(1), Duration::from_millis(10)),
        ..Profile::default()
    };
    let any = "127.0.0.1:0".parse().map_err(|_| "address")?;
    let up = ChaosUpstream::start(any, profile, opts.seed)
        .await
        .map_err(|e| format!("the chaos upstream: {e}"))?;
    let (listen, admin) = (free_port()?, free_port()?);
    let config = std::env::temp_dir().join(format!("weir-soak-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin = \"127.0.0.1:{admin}\"\n\n\
             [upstreams.chaos]\nurl = \"http://{}\"\nhosts = [\"chaos\"]\n",
            up.addr
        ),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let child = spawn(&opts.weir, &config)?;
    let pid = child.0.id();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(http);
    let started = ready(&client, admin, Duration::from_secs(10)).await;
    let _ = std::fs::remove_file(&config);
    if !started {
        return Err(format!(
            "weir ({}) did not become ready within 10 s",
            opts.weir.display()
        ));
    }

    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let until = start + opts.duration;
    let driver = tokio::spawn(load(client, listen, opts.rate, until, counts.clone()));
    let mut samples = Vec::new();
    let mut ticker = tokio::time::interval_at(start + opts.interval, opts.interval);
    let (mut seen, mut seen_ok) = (0, 0);
    while Instant::now() + Duration::from_millis(1) < until {
        ticker.tick().await;
        let (rss_kib, fds) = measure(pid)?;
        let (requests, ok) = (
            counts.requests.load(Ordering::Relaxed),
            counts.ok.load(Ordering::Relaxed),
        );
        let s = SoakSample {
            at: start.elapsed(),
            rss_kib,
            fds,
            requests: requests - seen,
            ok: ok - seen_ok,
        };
        (seen, seen_ok) = (requests, ok);
        each(&s);
        samples.push(s);
    }
    let _ = driver.await;
    drop(child);
    let judged: Vec<SoakSample> = samples
        .iter()
        .copied()
        .filter(|s| s.at > opts.warmup)
        .collect();
    Ok(SoakReport {
        verdict: judge(&judged),
        samples,
        requests: counts.requests.load(Ordering::Relaxed),
        ok: counts.ok.load(Ordering::Relaxed),
        shed: counts.shed.load(Ordering::Relaxed),
        weir_pid: pid,
    })
}

fn spawn(weir: &Path, config: &Path) -> Result<Child, String> {
    std::process::Command::new(weir)
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(Child)
        .map_err(|e| format!("cannot start {}: {e}", weir.display()))
}

/// Prints a soak as it runs and its verdict; `Ok(true)` when it passed.
pub async fn print(opts: &SoakOptions) -> Result<bool, String> {
    println!(
        "weir chaos soak: {} at {} requests/s; 20 % 503, 5 % resets, 1–10 ms; samples every {}, judged after {}",
        crate::config::duration::format(opts.duration),
        opts.rate,
        crate::config::duration::format(opts.interval),
        crate::config::duration::format(opts.warmup),
    );
    println!(
        "{:>8}  {:>8}  {:>5}  {:>10}  {:>6}",
        "time", "RSS MiB", "fds", "requests/s", "2xx %"
    );
    let secs = opts.interval.as_secs_f64();
    let report = run(opts, |s| {
        println!(
            "{:>7.0}s  {:>8.1}  {:>5}  {:>10.0}  {:>6.1}",
            s.at.as_secs_f64(),
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.requests as f64 / secs,
            if s.requests == 0 {
                0.0
            } else {
                100.0 * s.ok as f64 / s.requests as f64
            },
        );
    })
    .await?;
    println!(
        "{} requests, {} with a 2xx ({:.2} %), {} not offered (2,000 in flight)",
        report.requests,
        report.ok,
        100.0 * report.ok as f64 / report.requests.max(1) as f64,
        report.shed
    );
    let Some(v) = report.verdict else {
        println!("too few samples after the warm-up to judge: run longer");
        return Ok(false);
    };
    println!(
        "after the warm-up, highest of the first third → lowest of the last: RSS {:.1} → {:.1} MiB ({:+.1} %), fds {:.0} → {:.0} ({:+.1} %): {}",
        v.rss_kib.0 / 1024.0,
        v.rss_kib.1 / 1024.0,
        100.0 * v.rss_growth,
        v.fds.0,
        v.fds.1,
        100.0 * v.fds_growth,
        if v.pass { "pass" } else { "FAIL (more than 10 % growth)" }
    );
    Ok(v.pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(i: u64, rss_kib: u64, fds: u64) -> SoakSample {
        SoakSample {
            at: Duration::from_secs(i * 10),
            rss_kib,
            fds,
            requests: 1,
            ok: 1,
        }
    }

    #[test]
    fn growth_is_the_last_third_against_the_first() {
        let flat: Vec<SoakSample> = (0..9).map(|i| at(i, 8000 + (i % 2) * 300, 40)).collect();
        let v = judge(&flat).unwrap_or_else(|| panic!("judged"));
        assert!(v.pass, "{v:?}");
        let leaking: Vec<SoakSample> = (0..9).map(|i| at(i, 8000 + i * 400, 40)).collect();
        let v = judge(&leaking).unwrap_or_else(|| panic!("judged"));
        assert!(!v.pass && v.rss_growth > 0.10, "{v:?}");
        // A burst of connections raises one sample's fds; the floor of the
        // end stays where the start was.
        let mut burst = flat.clone();
        burst[7].fds = 300;
        assert!(judge(&burst).unwrap_or_else(|| panic!("judged")).pass);
        let fds: Vec<SoakSample> = (0..6).map(|i| at(i, 8000, 40 + i * 8)).collect();
        let v = judge(&fds).unwrap_or_else(|| panic!("judged"));
        assert!(!v.pass && v.fds_growth > 0.10, "{v:?}");
        assert_eq!(judge(&flat[..1]), None);
    }
}
