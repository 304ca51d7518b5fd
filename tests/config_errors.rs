//! Every class of config error names the file, line, column and field; every
//! shipped config passes `weir check`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use weir::config::{Config, ConfigError};

fn errors(src: &str) -> Vec<ConfigError> {
    match Config::parse(Path::new("weir.toml"), src) {
        Ok(_) => panic!("config unexpectedly valid:\n{src}"),
        Err(e) => e.0,
    }
}

/// Asserts exactly one error at `line` for `field`, whose message contains `needle`.
fn expect_one(src: &str, line: usize, field: &str, needle: &str) -> ConfigError {
    let errs = errors(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().unwrap();
    assert_eq!(e.file, Path::new("weir.toml"));
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(e.column > 0, "{e}");
    assert!(e.message.contains(needle), "{e}");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("weir.toml:{line}:{}: `{field}`", e.column)),
        "{shown}"
    );
    e
}

const UP: &str = "[upstreams.api]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"api\"]\n";

#[test]
fn unknown_field() {
    let src = format!("{UP}[upstreams.api.retry]\nmax_atempts = 3\n");
    expect_one(
        &src,
        5,
        "upstreams.api.retry.max_atempts",
        "unknown field `max_atempts`",
    );
}

#[test]
fn bare_number_duration() {
    let src = format!("{UP}timeout = 10\n");
    let e = expect_one(&src, 4, "upstreams.api.timeout", "bare number");
    assert!(e.message.contains("\"10s\""), "{e}");
    assert_eq!(e.column, 11);
}

#[test]
fn negative_values() {
    let src = format!("{UP}[upstreams.api.retry]\nmax_attempts = -1\n");
    expect_one(&src, 5, "upstreams.api.retry.max_attempts", "-1");
    let src = format!("[defaults.retry.budget]\nratio = -0.5\n{UP}");
    expect_one(&src, 2, "defaults.retry.budget.ratio", "≥ 0");
}

#[test]
fn bad_url() {
    let src = "[upstreams.api]\nurl = \"ftp://files\"\nhosts = [\"api\"]\n";
    expect_one(src, 2, "upstreams.api.url", "not http or https");
    let src = "[upstreams.api]\nurl = \"not a url\"\nhosts = [\"api\"]\n";
    expect_one(src, 2, "upstreams.api.url", "invalid url");
}

#[test]
fn duplicate_listen_address() {
    let src = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nlisten = \"127.0.0.1:9001\"\n\n[upstreams.b]\nurl = \"http://127.0.0.1:2\"\nlisten = \"127.0.0.1:9001\"\n";
    expect_one(
        src,
        7,
        "upstreams.b.listen",
        "already used by upstream \"a\"",
    );
    let src = "[server]\nlisten = \"127.0.0.1:9001\"\n[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nlisten = \"127.0.0.1:9001\"\n";
    expect_one(src, 5, "upstreams.a.listen", "[server] listen");
}

#[test]
fn two_upstreams_on_the_same_host_and_prefix() {
    let src = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"api\"]\n\n[upstreams.b]\nurl = \"http://127.0.0.1:2\"\nhosts = [\"other\", \"API\"]\n";
    expect_one(
        src,
        7,
        "upstreams.b.hosts[1]",
        "already routed to upstream \"a\"",
    );
    // Different prefixes on one host are fine.
    let ok = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"api\"]\n\n[upstreams.b]\nurl = \"http://127.0.0.1:2\"\nhosts = [\"api\"]\npath_prefix = \"/v2\"\n";
    assert!(Config::parse(Path::new("weir.toml"), ok).is_ok());
}

#[test]
fn upstream_with_neither_hosts_nor_listen() {
    let src =
        "[server]\nlisten = \"127.0.0.1:1\"\n\n[upstreams.lost]\nurl = \"http://127.0.0.1:1\"\n";
    expect_one(src, 4, "upstreams.lost", "unreachable");
}

#[test]
fn policy_values_are_validated_where_they_are_written() {
    let src = format!("[defaults.retry.backoff]\njitter = {{ proportional = 20 }}\n{UP}");
    expect_one(
        &src,
        2,
        "defaults.retry.backoff.jitter.proportional",
        "a fraction, not a percent",
    );
    let src = format!("{UP}[upstreams.api.retry]\nmax_attempts = 25\n");
    expect_one(&src, 5, "upstreams.api.retry.max_attempts", "retry budget");
    let src = format!("{UP}[upstreams.api.retry]\nretry_on = [\"503\", \"sometimes\"]\n");
    expect_one(
        &src,
        5,
        "upstreams.api.retry.retry_on",
        "unknown condition \"sometimes\"",
    );
    let src = format!("{UP}[upstreams.api.breaker]\nfailure_rate = 1.5\n");
    expect_one(&src, 5, "upstreams.api.breaker.failure_rate", "(0, 1]");
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let src = "[upstreams.a]\nurl = \"gopher://x\"\nhosts = [\"a\"]\ntimeout = \"0s\"\n\n[upstreams.b]\nurl = \"http://127.0.0.1:1\"\n";
    let errs = errors(src);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["upstreams.a.url", "upstreams.a.timeout", "upstreams.b"],
        "{errs:#?}"
    );
}

#[test]
fn defaults_merge_field_by_field() {
    let src = "[defaults]\ntimeout = \"7s\"\n[defaults.retry]\nmax_attempts = 4\nmax_retry_after = \"9s\"\n[defaults.retry.backoff]\nbase = \"50ms\"\n\n[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n[upstreams.a.retry]\nmax_attempts = 2\n[upstreams.a.retry.backoff]\nmax = \"1s\"\n";
    let c = Config::parse(Path::new("weir.toml"), src).unwrap();
    let a = &c.upstreams[0];
    assert_eq!(a.timeout.as_secs(), 7);
    assert_eq!(a.retry.max_attempts, 2);
    assert_eq!(a.retry.max_retry_after.as_secs(), 9);
    assert_eq!(a.retry.backoff.base.as_millis(), 50);
    assert_eq!(a.retry.backoff.max.as_millis(), 1000);
    assert_eq!(a.retry.backoff.multiplier, 2.0);
    assert_eq!(a.retry.budget.ratio, 0.1);
    assert_eq!(a.breaker.consecutive_failures, 20);
    assert_eq!(a.breaker.window, 100);
    assert_eq!(a.breaker.min_samples, 50);
    assert_eq!(a.breaker.failure_rate, 0.8);
    assert_eq!(a.breaker.open.as_secs(), 1);
    assert_eq!(a.breaker.max_open.as_secs(), 30);
    assert_eq!(a.concurrency.max_in_flight, 1024);
    assert!(a.rate_limit.is_none());
}

#[test]
fn every_shipped_config_passes_weir_check() {
    let mut files = vec!["config/weir.toml".to_string()];
    for e in std::fs::read_dir("config/examples").unwrap() {
        files.push(e.unwrap().path().display().to_string());
    }
    assert!(files.len() >= 3);
    for f in files {
        let out = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["check", "--config", &f])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The printed effective config is itself a valid config.
        let printed = String::from_utf8(out.stdout).unwrap();
        Config::parse(Path::new(&f), &printed)
            .unwrap_or_else(|e| panic!("{f} effective config:\n{e}"));
    }
}

#[test]
fn weir_check_exits_1_and_names_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, format!("{UP}connect_timeout = 2\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:4:19: `upstreams.api.connect_timeout`",
            p.display()
        )),
        "{err}"
    );
}

/// Regression: with the 30 s default `max_open`, a config written for the
/// earlier defaults (`open = "1m"`, no `max_open`) must still load.
#[test]
fn breaker_open_above_the_default_max_open_raises_it() {
    let src = format!("{UP}[upstreams.api.breaker]\nopen = \"1m\"\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert_eq!(c.upstreams[0].breaker.open.as_secs(), 60);
    assert_eq!(c.upstreams[0].breaker.max_open.as_secs(), 60);
    // Set in [defaults] too.
    let src = format!("[defaults.breaker]\nopen = \"2m\"\n{UP}");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert_eq!(c.upstreams[0].breaker.max_open.as_secs(), 120);
    // A max_open the user wrote below open is still an error.
    let src = format!("{UP}[upstreams.api.breaker]\nopen = \"1m\"\nmax_open = \"30s\"\n");
    expect_one(&src, 6, "upstreams.api.breaker.max_open", "must be ≥ open");
}
