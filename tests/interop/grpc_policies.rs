//! The interop matrix's gRPC policy rows (issue 54): grpcio on both ends
//! of weir, the server failing on demand (`Flaky` in
//! tests/servers/interop_grpc.py), each row checking what a gRPC user
//! expects of the status as the outcome:
//! - a keyed call that failed UNAVAILABLE is not kept: its repeat reaches
//!   the server and succeeds;
//! - a keyed call that succeeded is replayed whole: message and trailing
//!   metadata, the server seeing it once;
//! - a method declared in `idempotent_methods`, at 30 % UNAVAILABLE and
//!   without a key, succeeds ≥ 95 % of 300 calls (with the retry budget's
//!   defaults; bench/grpc-retry.sh puts it beside Envoy);
//! - the breaker opens on UNAVAILABLE (5 in a row, then weir's own
//!   `circuit_open`, the server seeing 5);
//! - `/metrics` carries `grpc_code`.

use super::{run_bounded, server_script, start_weir, Proc};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The rows' weirs, started beside the matrix's.
pub(super) struct Weirs {
    policy: Proc,
    breaker: Proc,
    /// `policy`'s admin port, for `/metrics`.
    admin: u16,
}

pub(super) fn start(bin: &Path, dir: &Path, grpc_port: u16) -> Weirs {
    let policy = start_weir(
        bin,
        dir,
        "grpc-policy",
        &format!(
            "[upstreams.grpcp]\nurl = \"http://127.0.0.1:{grpc_port}\"\nprotocol = \"grpc\"\n\
             [upstreams.grpcp.retry]\nretry_on = [\"connect-failure\", \"unavailable\"]\n\
             [upstreams.grpcp.grpc]\nidempotent_methods = [\"/weir.interop.Matrix/Flaky\"]\n"
        ),
    );
    let breaker = start_weir(
        bin,
        dir,
        "grpc-breaker",
        &format!(
            "[upstreams.grpcb]\nurl = \"http://127.0.0.1:{grpc_port}\"\nprotocol = \"grpc\"\n\
             [upstreams.grpcb.breaker]\nconsecutive_failures = 5\nfailing_for = \"0s\"\n\
             open = \"30s\"\nmax_open = \"30s\"\n"
        ),
    );
    let config = std::fs::read_to_string(dir.join("weir-grpc-policy.toml")).unwrap();
    let admin = config
        .lines()
        .find_map(|l| l.strip_prefix("admin = \"127.0.0.1:"))
        .and_then(|p| p.trim_end_matches('"').parse().ok())
        .unwrap();
    Weirs {
        policy,
        breaker,
        admin,
    }
}

impl Weirs {
    pub(super) fn procs(&self) -> [&Proc; 2] {
        [&self.policy, &self.breaker]
    }
}

/// `interop_grpc.py calls`: `n` calls of `request`, with `key` as the
/// idempotency key when given.
fn calls(py: &Path, port: u16, request: &str, n: u32, key: Option<&str>) -> Result<Value, String> {
    let mut cmd = Command::new(py);
    cmd.arg(server_script("interop_grpc.py"))
        .args(["calls", "--target", &format!("127.0.0.1:{port}")])
        .args(["--request", request, "--n", &n.to_string()]);
    if let Some(k) = key {
        cmd.args(["--key", k]);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    serde_json::from_slice(&out.stdout).map_err(|_| {
        format!(
            "the grpcio client printed no result: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// The calls the server saw with `key` (asked directly).
fn seen(py: &Path, grpc_port: u16, key: &str) -> Result<u64, String> {
    let v = calls(py, grpc_port, &format!("count {key}"), 1, None)?;
    v["calls"][0]["response"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no count: {v}"))
}

/// `GET /metrics` on `admin`.
fn metrics(admin: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", admin)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Runs the rows: `default` is the matrix's weir with a default policy
/// before the same server. Each failure is (row, what went wrong).
pub(super) fn rows(py: &Path, w: &Weirs, default: u16, grpc_port: u16) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    let mut check = |name: &str, r: Result<Option<String>, String>| match r {
        Ok(None) => {}
        Ok(Some(p)) | Err(p) => failures.push((format!("{name} · grpcio · grpc"), p)),
    };
    let code = |v: &Value, i: usize| v["calls"][i]["code"].as_str().unwrap_or("").to_string();

    check(
        "gRPC keyed call answered UNAVAILABLE, then repeated",
        (|| {
            let v = calls(py, default, "kf1 1 UNAVAILABLE", 2, Some("kf1"))?;
            let second = &v["calls"][1];
            Ok((code(&v, 0) != "UNAVAILABLE"
                || code(&v, 1) != "OK"
                || second["replayed"] != Value::Null
                || second["response"] != "ok 2"
                || seen(py, grpc_port, "kf1")? != 2)
                .then(|| format!("expected UNAVAILABLE, then OK from the server's 2nd call: {v}")))
        })(),
    );

    check(
        "gRPC keyed call answered OK, then repeated",
        (|| {
            let v = calls(py, default, "ks1 0 UNAVAILABLE", 2, Some("ks1"))?;
            let (first, second) = (&v["calls"][0], &v["calls"][1]);
            Ok((code(&v, 0) != "OK"
            || code(&v, 1) != "OK"
            || second["replayed"] != "true"
            || second["response"] != first["response"]
            || second["trailing"]["x-calls"] != "1"
            || seen(py, grpc_port, "ks1")? != 1)
            .then(|| format!("expected the repeat replayed whole (trailing x-calls: 1), the server called once: {v}")))
        })(),
    );

    check(
        "gRPC declared method at 30 % UNAVAILABLE, 300 calls, no key",
        (|| {
            let v = calls(py, w.policy.port, "rand kr1 UNAVAILABLE", 300, None)?;
            let ok = v["codes"]["OK"].as_u64().unwrap_or(0);
            eprintln!("gRPC declared method at 30 % UNAVAILABLE: {ok} of 300 OK through weir");
            Ok((ok < 285).then(|| format!("expected ≥ 95 % OK: {}", v["codes"])))
        })(),
    );

    check(
        "gRPC breaker opens on UNAVAILABLE",
        (|| {
            let v = calls(py, w.breaker.port, "kb1 100 UNAVAILABLE", 8, None)?;
            let details = v["calls"][5]["details"].as_str().unwrap_or("");
            let n = seen(py, grpc_port, "kb1")?;
            Ok((v["codes"]["UNAVAILABLE"] != 8 || n != 5 || !details.contains("circuit_open"))
            .then(|| format!("expected 5 calls to reach the server ({n} did), then weir's circuit_open: {v}")))
        })(),
    );

    let m = metrics(w.admin);
    let has = |c: &str| {
        m.lines().any(|l| {
            l.starts_with("weir_requests_total{")
                && l.contains(&format!("grpc_code=\"{c}\""))
                && l.contains("upstream=\"grpcp\"")
        })
    };
    let problem = (!has("OK") || !has("Unavailable"))
        .then(|| format!("expected weir_requests_total with grpc_code OK and Unavailable: {m}"));
    check("gRPC metrics carry grpc_code", Ok(problem));
    failures
}
