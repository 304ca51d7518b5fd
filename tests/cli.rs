//! The operator commands: schedule, decide, help.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

fn weir(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn schedule_prints_envelopes_and_warns_when_attempts_cannot_fit() {
    let (code, out, _) = weir(&["schedule", "--config", "config/weir.toml"], None);
    assert_eq!(code, 0);
    assert!(out.contains("upstream app"), "{out}");
    assert!(out.contains("retry 1: 0ms – 25ms"), "{out}");
    assert!(out.contains("worst-case total wait: 75ms"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.toml");
    std::fs::write(
        &p,
        "[upstreams.slow]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"s\"]\ntimeout = \"1s\"\n[upstreams.slow.retry]\nmax_attempts = 6\n[upstreams.slow.retry.backoff]\nbase = \"500ms\"\njitter = \"none\"\n",
    )
    .unwrap();
    let (code, out, _) = weir(
        &[
            "schedule",
            "--config",
            p.to_str().unwrap(),
            "--upstream",
            "slow",
        ],
        None,
    );
    assert_eq!(code, 0);
    assert!(out.to_lowercase().contains("warning"), "{out}");
    let (code, _, err) = weir(
        &[
            "schedule",
            "--config",
            p.to_str().unwrap(),
            "--upstream",
            "nope",
        ],
        None,
    );
    assert_eq!(code, 1);
    assert!(err.contains("no upstream named \"nope\""), "{err}");
}

#[test]
fn decide_reads_json_and_prints_the_verdict() {
    let input = r#"{"contract_version":1,"request":{"method":"GET"},"attempts_made":1,"outcome":{"kind":"response","status":503,"retry_after":"3"},"time_left_ms":15000}"#;
    let (code, out, _) = weir(&["decide"], Some(input));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decision"], "retry");
    assert_eq!(v["delay_ms"], 3000);

    let (code, _, err) = weir(&["decide"], Some(r#"{"contract_version":2}"#));
    assert_eq!(code, 1);
    assert!(err.contains("invalid decision input"), "{err}");
}

#[test]
fn the_decision_contract_defaults_are_the_config_defaults() {
    // The JSON contract spells its defaults out; they must be the ones a config gets.
    let c = weir::config::Config::parse(
        std::path::Path::new("t.toml"),
        "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n",
    )
    .unwrap();
    let from_config = &c.upstreams[0].retry;
    let from_contract = weir::policy::contract::PolicyJson::default()
        .to_policy()
        .unwrap();
    assert_eq!(from_contract.max_attempts, from_config.max_attempts);
    assert_eq!(from_contract.retry_on, from_config.retry_on);
    assert_eq!(from_contract.max_retry_after, from_config.max_retry_after);
    assert_eq!(
        from_contract.max_replay_body_bytes,
        from_config.max_replay_body_bytes
    );
    assert_eq!(from_contract.min_attempt_time, from_config.min_attempt_time);
    assert_eq!(from_contract.backoff, from_config.backoff);
    assert_eq!(
        from_contract.budget.timeout_cost,
        from_config.budget.timeout_cost
    );
}

#[test]
fn help_is_written_for_operators() {
    let (code, out, _) = weir(&["--help"], None);
    assert_eq!(code, 0);
    for cmd in ["run", "check", "schedule", "decide"] {
        assert!(out.contains(cmd), "{out}");
    }
    let (code, out, _) = weir(&["run", "--help"], None);
    assert_eq!(code, 0);
    assert!(
        out.contains("WEIR_CONFIG") && out.contains("shutdown_timeout"),
        "{out}"
    );
}

/// `weir run` refuses what `weir check` refuses, with the same errors: a CA
/// file that is not there is a config error at its field, before anything is
/// bound (issue 17, item 2).
#[test]
fn run_refuses_a_missing_ca_file_like_check_does() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.toml");
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &p,
        format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"https://127.0.0.1:1\"\nhosts = [\"api\"]\n[upstreams.api.tls]\nca_file = {ca:?}\n"),
    )
    .unwrap();
    let path = p.to_str().unwrap();
    let (code, _, check_err) = weir(&["check", "--config", path], None);
    assert_eq!(code, 1);
    let want = format!(
        "error: {path}:8:11: `upstreams.api.tls.ca_file`: cannot read {ca:?}: No such file or directory"
    );
    assert_eq!(check_err.trim_end(), want);

    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "--config", path])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Up to 20 s (1000 tries of 20 ms) to exit.
    for _ in 0..1000 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        child.kill().unwrap();
        panic!("weir run started on a config with a missing ca_file");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&want), "{err}");
}

/// weir run as a child process on `toml`; its admin address, read off the
/// "weir is serving" line. Killed when dropped.
struct Running {
    child: std::process::Child,
    admin: std::net::SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_weir(dir: &std::path::Path, toml: &str) -> Running {
    use std::io::BufRead;
    let p = dir.join("run.toml");
    std::fs::write(&p, toml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--log-format", "json", "run", "--workers", "1", "--config"])
        .arg(&p)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let admin = loop {
        let line = lines.next().expect("weir exited before serving").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["message"] == "weir is serving" {
            break v["admin"].as_str().unwrap().parse().unwrap();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Running { child, admin }
}

/// `weir health` against a real running weir: 0 with the answer when it is
/// ready, 1 otherwise, the address given or read from the config file's
/// `[server] admin` alone (issue 32, item 8: the image's HEALTHCHECK).
#[test]
fn health_asks_a_running_weir_and_exits_by_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let weir_ = run_weir(
        dir.path(),
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
         [upstreams.app]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"app\"]\n",
    );
    let admin = weir_.admin.to_string();

    let (code, out, err) = weir(&["health", "--admin", &admin], None);
    assert_eq!(
        (code, out.as_str()),
        (0, &*format!("{admin}/readyz: 200\nready\n")),
        "{err}"
    );
    let (code, out, _) = weir(&["health", "--admin", &admin, "--path", "/healthz"], None);
    assert_eq!(
        (code, out.as_str()),
        (0, &*format!("{admin}/healthz: 200\nok\n"))
    );

    // From a config file: only `[server] admin` is read (the rest may be an
    // edit that does not validate yet), and 0.0.0.0 is asked on loopback.
    let cfg = dir.path().join("edited.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nadmin = \"0.0.0.0:{}\"\nlisten = 7\n[upstreams.app]\nurl = \"nope\"\n",
            weir_.admin.port()
        ),
    )
    .unwrap();
    let (code, out, err) = weir(&["health", "--config", cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("{admin}/readyz: 200\nready\n"));

    // Any other status is a failure, and says what came back.
    let (code, out, err) = weir(&["health", "--admin", &admin, "--path", "/nope"], None);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.starts_with(&format!("weir health: {admin}/nope: 404\n")),
        "{err}"
    );

    // Nothing listening: exit 1, saying so.
    drop(weir_);
    let (code, _, err) = weir(&["health", "--admin", &admin], None);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("cannot connect to {admin}")), "{err}");

    // A listener that never answers: exit 1 within --timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = silent.local_addr().unwrap().to_string();
    let (code, _, err) = weir(&["health", "--admin", &at, "--timeout", "300ms"], None);
    assert_eq!(code, 1);
    assert_eq!(err, format!("weir health: {at}: no answer within 300ms\n"));

    // A config that cannot be read is a failure too, not a default address.
    let (code, _, err) = weir(&["health", "--config", "/nonexistent/weir.toml"], None);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("weir health: cannot read /nonexistent/weir.toml"),
        "{err}"
    );
}

/// `weir check` on a config written to a temporary file: (exit code,
/// stdout, stderr).
fn check(toml: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.toml");
    std::fs::write(&p, toml).unwrap();
    weir(&["check", "--config", p.to_str().unwrap()], None)
}

/// Issue 41, item 1: an idempotency store whose scope names no credential
/// lets any caller replay another's write (or squat its key): `weir check`
/// warns. And it says that the default scope now includes `cookie`, since
/// that changes what a config that never set `scope` does.
#[test]
fn check_warns_when_an_idempotency_scope_names_no_credential() {
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n";
    let up = |name: &str, scope: &str| {
        format!("[upstreams.{name}]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"{name}\"]\n{scope}\n")
    };
    let shared = up(
        "shared",
        "[upstreams.shared.idempotency]\nscope = [\"none\"]",
    );
    let by_host = up(
        "byhost",
        "[upstreams.byhost.idempotency]\nscope = [\"host\"]",
    );
    let by_key = up(
        "bykey",
        "[upstreams.bykey.idempotency]\nscope = [\"host\", \"header:x-api-key\"]",
    );
    let plain = up("plain", "");
    let (code, _, err) = check(&format!("{head}{shared}{by_host}{by_key}{plain}"));
    assert_eq!(code, 0, "{err}");
    for name in ["shared", "byhost"] {
        assert!(
            err.contains(&format!(
                "warning: upstream `{name}`: its idempotency `scope` names no credential"
            )),
            "{err}"
        );
    }
    assert!(!err.contains("upstream `bykey`"), "{err}");
    assert!(!err.contains("upstream `plain`"), "{err}");
    assert!(
        err.contains(
            "note: idempotency `scope` defaults to [\"authorization\", \"cookie\", \"host\"]"
        ),
        "{err}"
    );
    assert!(err.contains("on `plain`"), "{err}");
    // Without a store nothing is said.
    let off = up(
        "off",
        "[upstreams.off.idempotency]\nenabled = false\nscope = [\"none\"]",
    );
    let (code, _, err) = check(&format!("{head}{off}"));
    assert_eq!(code, 0);
    assert!(!err.contains("warning") && !err.contains("note"), "{err}");
}

/// Issue 41, item 4: an invalid `state.url`, upstream `url` or
/// `tracing.endpoint` carrying a password (or a token as the user part, or
/// a query) is reported by `weir check` with the credential as `***`, as
/// `/config` shows it, never echoed.
#[test]
fn check_never_echoes_a_credential_from_a_url() {
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n";
    let up = |url: &str| format!("[upstreams.a]\nurl = \"{url}\"\nhosts = [\"a\"]\n");
    let ok = up("http://127.0.0.1:1");
    for toml in [
        format!("{head}[state]\nbackend = \"redis\"\nurl = \"redis://weir:hunter2@cache:6379/x\"\n{ok}"),
        format!("{head}[state]\nbackend = \"redis\"\nurl = \"redis://:hunter2@cache:6379/0?tls=no\"\n{ok}"),
        format!("{head}{}", up("https://admin:hunter2@api.example")),
        format!("{head}{}", up("https://hunter2@api.example")),
        format!("{head}{}", up("http://api.example/v1?api_key=hunter2")),
        format!("{head}[tracing]\nendpoint = \"http://otel:hunter2@collector:4317\"\n{ok}"),
        format!("{head}[tracing]\nendpoint = \"http://collector:4318/v1/traces?token=hunter2\"\nprotocol = \"http/protobuf\"\n{ok}"),
    ] {
        let (code, _, err) = check(&toml);
        assert_eq!(code, 1, "{toml}\n{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("***"), "{err}");
    }
}

/// Issue 41, item 7: `[tracing] headers` values are visible ASCII (and
/// spaces), as the docs say; a non-ASCII one used to be accepted.
#[test]
fn check_refuses_a_tracing_header_value_that_is_not_visible_ascii() {
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n";
    let tracing = |v: &str| {
        format!("{head}[tracing]\nendpoint = \"http://127.0.0.1:4317\"\nheaders = {{ \"x-api-key\" = \"{v}\" }}\n")
    };
    let (code, _, err) = check(&tracing("caf\u{e9}"));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`tracing.headers.x-api-key`: the value must be visible ASCII text"),
        "{err}"
    );
    assert!(!err.contains("caf"), "{err}");
    let (code, _, err) = check(&tracing("Bearer abc-123"));
    assert_eq!(code, 0, "{err}");
}
