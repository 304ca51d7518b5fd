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
