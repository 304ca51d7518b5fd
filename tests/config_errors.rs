//! Every class of config error names the file, line, column and field; every
//! shipped config passes `weir check`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
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

/// A slip in a field name or an enumerated value gets "did you mean".
#[test]
fn did_you_mean() {
    let src = format!(
        "{UP}[upstreams.api.retry]
max_atempts = 3
"
    );
    let e = expect_one(&src, 5, "upstreams.api.retry.max_atempts", "unknown field");
    assert!(e.message.contains("did you mean `max_attempts`?"), "{e}");
    let src = format!(
        "{UP}[upstreams.api.retry]
retry_on = [\"timout\"]
"
    );
    let e = expect_one(&src, 5, "upstreams.api.retry.retry_on", "unknown condition");
    assert!(e.message.contains("did you mean \"timeout\"?"), "{e}");
    let src = format!(
        "{UP}protocol = \"h2\"
"
    );
    let e = expect_one(&src, 4, "upstreams.api.protocol", "unknown protocol");
    assert!(e.message.contains("did you mean \"h2c\"?"), "{e}");
    let src = format!(
        "{UP}balance = \"roundrobin\"
"
    );
    let e = expect_one(&src, 4, "upstreams.api.balance", "unknown balance");
    assert!(e.message.contains("did you mean \"round_robin\"?"), "{e}");
    let src = format!(
        "[server]
access_log = \"error\"
{UP}"
    );
    let e = expect_one(&src, 2, "server.access_log", "unknown variant");
    assert!(e.message.contains("did you mean `errors`?"), "{e}");
    // Nothing close: no guess.
    let src = format!(
        "{UP}protocol = \"banana\"
"
    );
    let e = expect_one(&src, 4, "upstreams.api.protocol", "unknown protocol");
    assert!(!e.message.contains("did you mean"), "{e}");
}

/// `none` is the `upstream` label of requests routed nowhere: no upstream
/// may take it.
#[test]
fn the_name_none_is_reserved() {
    let src = "[upstreams.none]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"api\"]\n";
    expect_one(src, 1, "upstreams.none", "reserved");
}

#[test]
fn resolve_every_has_a_floor() {
    let src = format!("{UP}resolve_every = \"10ms\"\n");
    expect_one(&src, 4, "upstreams.api.resolve_every", "at least 100ms");
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
    assert_eq!(a.breaker.failure_rate, 1.0);
    assert_eq!(a.breaker.failing_for.as_secs(), 1);
    assert_eq!(a.breaker.open.as_millis(), 320);
    assert_eq!(a.breaker.max_open.as_millis(), 320);
    assert_eq!(a.concurrency.max_in_flight, 1024);
    assert!(a.rate_limit.is_none());
}

/// `[….idempotency]`: on by default with the documented defaults, merged
/// field by field, off with `enabled = false`.
#[test]
fn idempotency_defaults_merge_and_disable() {
    use std::time::Duration;
    let c = Config::parse(Path::new("weir.toml"), UP).unwrap();
    let i = c.upstreams[0].idempotency.clone().unwrap();
    assert_eq!(i.ttl, Duration::from_secs(24 * 3600));
    assert_eq!((i.max_bytes, i.max_response_bytes), (16 << 20, 1 << 20));
    assert_eq!(i.methods, ["POST", "PATCH"]);
    let src = format!("[defaults.idempotency]\nttl = \"1h\"\n{UP}[upstreams.api.idempotency]\nmethods = [\"POST\"]\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let i = c.upstreams[0].idempotency.clone().unwrap();
    assert_eq!((i.ttl.as_secs(), i.max_bytes), (3600, 16 << 20));
    assert_eq!(i.methods, ["POST"]);
    let src = format!("{UP}[upstreams.api.idempotency]\nenabled = false\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert!(c.upstreams[0].idempotency.is_none());
    // The effective config spells the table out.
    assert!(c.effective_toml().contains("[upstreams.api.idempotency]"));
}

#[test]
fn idempotency_values_are_validated_where_they_are_written() {
    let t = "[upstreams.api.idempotency]\n";
    let src = format!("{UP}{t}ttl = \"0s\"\n");
    expect_one(&src, 5, "upstreams.api.idempotency.ttl", "greater than 0");
    let src = format!("[defaults.idempotency]\nttl = \"0s\"\n{UP}");
    expect_one(&src, 2, "defaults.idempotency.ttl", "greater than 0");
    let src = format!("{UP}{t}scope = [\"authorization\", \"tenant\"]\n");
    expect_one(
        &src,
        5,
        "upstreams.api.idempotency.scope",
        "unknown part \"tenant\"",
    );
    let src = format!("{UP}{t}scope = [\"none\", \"host\"]\n");
    expect_one(
        &src,
        5,
        "upstreams.api.idempotency.scope",
        "\"none\" stands alone",
    );
    let src = format!("{UP}{t}scope = [\"header:x tenant\"]\n");
    expect_one(
        &src,
        5,
        "upstreams.api.idempotency.scope",
        "not a header field name",
    );
    let src = format!("{UP}{t}max_bytes = 1000\nmax_response_bytes = 1001\n");
    expect_one(
        &src,
        6,
        "upstreams.api.idempotency.max_response_bytes",
        "must be ≤ max_bytes (1000)",
    );
    // Against the default max_bytes (16 MiB).
    let src = format!("{UP}{t}max_response_bytes = 16777217\n");
    expect_one(
        &src,
        5,
        "upstreams.api.idempotency.max_response_bytes",
        "must be ≤ max_bytes (16777216)",
    );
    // Left unset, max_response_bytes follows a smaller max_bytes.
    let src = format!("[defaults.idempotency]\nmax_bytes = 1000\n{UP}");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let i = c.upstreams[0].idempotency.clone().unwrap();
    assert_eq!((i.max_bytes, i.max_response_bytes), (1000, 1000));
    let src = format!("{UP}{t}max_bytes = 0\nmax_response_bytes = 0\n");
    expect_one(
        &src,
        5,
        "upstreams.api.idempotency.max_bytes",
        "enabled = false",
    );
    for (methods, needle) in [
        (
            "[\"POST\", \"GET\"]",
            "GET is idempotent by itself and never needs a key",
        ),
        ("[\"PUT\"]", "PUT is idempotent by itself"),
        ("[\"OPTIONS\"]", "never needs a key"),
        (
            "[\"PO ST\"]",
            "\"PO ST\" is not a method: a method is a token",
        ),
        ("[\"post\"]", "case-sensitive"),
        ("[]", "at least one method"),
    ] {
        let src = format!("{UP}{t}methods = {methods}\n");
        expect_one(&src, 5, "upstreams.api.idempotency.methods", needle);
    }
    // Checked even when turned off.
    let src = format!("{UP}{t}enabled = false\nttl = \"0s\"\n");
    expect_one(&src, 6, "upstreams.api.idempotency.ttl", "greater than 0");
}

#[test]
fn idempotency_fields_are_known_to_the_schema() {
    let src = format!("{UP}[upstreams.api.idempotency]\ntll = \"1h\"\nmax_bytes = \"16MiB\"\n");
    let errs = errors(&src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            (5, "upstreams.api.idempotency.tll"),
            (6, "upstreams.api.idempotency.max_bytes"),
        ],
        "{errs:#?}"
    );
    assert!(
        errs[0].message.contains("did you mean `ttl`?"),
        "{}",
        errs[0]
    );
    assert!(errs[1].message.contains("invalid type"), "{}", errs[1]);
    // Written in the upstream's own table, it is pointed to the right one.
    let src = format!("{UP}max_response_bytes = 10\n");
    expect_one(
        &src,
        4,
        "upstreams.api.max_response_bytes",
        "did you mean `idempotency.max_response_bytes`?",
    );
}

/// `[….cache]`: off by default; on, the documented defaults, merged field
/// by field.
#[test]
fn cache_is_off_by_default_and_merges_field_by_field() {
    use std::time::Duration;
    let c = Config::parse(Path::new("weir.toml"), UP).unwrap();
    assert!(c.upstreams[0].cache.is_none());
    // The effective config spells the table out, off.
    let eff = c.effective_toml();
    assert!(eff.contains("[upstreams.api.cache]"), "{eff}");
    let src = format!("[defaults.cache]\nenabled = true\n{UP}");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let k = c.upstreams[0].cache.clone().unwrap();
    assert_eq!((k.max_bytes, k.max_object_bytes), (32 << 20, 1 << 20));
    assert_eq!(k.default_ttl, Duration::ZERO);
    assert_eq!(k.stale_while_revalidate, Duration::ZERO);
    assert_eq!(k.stale_if_error, Duration::ZERO);
    assert!(!k.store_set_cookie);
    let src = format!(
        "[defaults.cache]\nenabled = true\nstale_if_error = \"10m\"\n{UP}[upstreams.api.cache]\ndefault_ttl = \"30s\"\nstale_while_revalidate = \"5s\"\nstore_set_cookie = true\n"
    );
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let k = c.upstreams[0].cache.clone().unwrap();
    assert_eq!(k.default_ttl, Duration::from_secs(30));
    assert_eq!(k.stale_while_revalidate, Duration::from_secs(5));
    assert_eq!(k.stale_if_error, Duration::from_secs(600));
    assert!(k.store_set_cookie);
    // One upstream may turn off what [defaults] turned on.
    let src =
        format!("[defaults.cache]\nenabled = true\n{UP}[upstreams.api.cache]\nenabled = false\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert!(c.upstreams[0].cache.is_none());
    // The printed effective config is itself valid, and says the same.
    let again = Config::parse(Path::new("weir.toml"), &c.effective_toml()).unwrap();
    assert!(again.upstreams[0].cache.is_none());
}

#[test]
fn cache_values_are_validated_where_they_are_written() {
    let t = "[upstreams.api.cache]\nenabled = true\n";
    let src = format!("{UP}{t}max_bytes = 1000\nmax_object_bytes = 1001\n");
    expect_one(
        &src,
        7,
        "upstreams.api.cache.max_object_bytes",
        "must be ≤ max_bytes (1000)",
    );
    let src = format!("[defaults.cache]\nmax_object_bytes = 33554433\n{UP}");
    expect_one(
        &src,
        2,
        "defaults.cache.max_object_bytes",
        "must be ≤ max_bytes (33554432)",
    );
    let src = format!("{UP}{t}max_bytes = 0\n");
    expect_one(&src, 6, "upstreams.api.cache.max_bytes", "enabled = false");
    // Off, a zero max_bytes is no mistake; max_object_bytes followed it.
    let src = format!("{UP}[upstreams.api.cache]\nmax_bytes = 0\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert!(c.upstreams[0].cache.is_none());
    // Left unset, max_object_bytes follows a smaller max_bytes.
    let src = format!("[defaults.cache]\nenabled = true\nmax_bytes = 1000\n{UP}");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let k = c.upstreams[0].cache.clone().unwrap();
    assert_eq!((k.max_bytes, k.max_object_bytes), (1000, 1000));
    // Checked even when off.
    let src = format!("{UP}[upstreams.api.cache]\nmax_bytes = 10\nmax_object_bytes = 11\n");
    expect_one(
        &src,
        6,
        "upstreams.api.cache.max_object_bytes",
        "must be ≤ max_bytes (10)",
    );
}

#[test]
fn cache_fields_are_known_to_the_schema() {
    let src = format!(
        "{UP}[upstreams.api.cache]\nstale_if_eror = \"1m\"\ndefault_ttl = 30\nstore_set_cookies = true\nenabled = \"yes\"\n"
    );
    let errs = errors(&src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            (5, "upstreams.api.cache.stale_if_eror"),
            (6, "upstreams.api.cache.default_ttl"),
            (7, "upstreams.api.cache.store_set_cookies"),
            (8, "upstreams.api.cache.enabled"),
        ],
        "{errs:#?}"
    );
    assert!(
        errs[0].message.contains("did you mean `stale_if_error`?"),
        "{}",
        errs[0]
    );
    assert!(errs[1].message.contains("bare number"), "{}", errs[1]);
    assert!(
        errs[2].message.contains("did you mean `store_set_cookie`?"),
        "{}",
        errs[2]
    );
    assert!(errs[3].message.contains("invalid type"), "{}", errs[3]);
    // Written in the upstream's own table, it is pointed to the right one.
    let src = format!("{UP}default_ttl = \"30s\"\n");
    expect_one(
        &src,
        4,
        "upstreams.api.default_ttl",
        "did you mean `cache.default_ttl`?",
    );
    let src = format!("[defaults]\nstale_while_revalidate = \"1s\"\n{UP}");
    expect_one(
        &src,
        2,
        "defaults.stale_while_revalidate",
        "did you mean `cache.stale_while_revalidate`?",
    );
}

/// `[tracing]` (docs/reference/tracing.md#configuration): off without an
/// endpoint; each bad value at its own line and column.
#[test]
fn tracing_values_are_validated_where_they_are_written() {
    let c = Config::parse(Path::new("weir.toml"), UP).unwrap();
    assert_eq!(c.tracing, weir::config::TracingConfig::default());
    assert!(c.tracing.endpoint.is_none());
    let t = "[tracing]\n";
    let ok = format!("{t}endpoint = \"http://otel:4318\"\nprotocol = \"http/protobuf\"\nsample = 0.25\nheaders = {{ \"X-Api-Key\" = \"k\" }}\n{UP}");
    let c = Config::parse(Path::new("weir.toml"), &ok).unwrap();
    assert_eq!(
        c.tracing.endpoint.as_deref(),
        Some("http://otel:4318/v1/traces")
    );
    assert_eq!(c.tracing.sample, 0.25);
    assert_eq!(
        c.tracing.headers,
        [("x-api-key".to_string(), "k".to_string())]
    );
    // The key is not shown back.
    assert_eq!(c.effective.tracing.headers.unwrap()["X-Api-Key"], "***");
    let cases: [(&str, &str, &str); 7] = [
        ("sample = 1.5\n", "tracing.sample", "between 0 and 1"),
        ("sample = -0.1\n", "tracing.sample", "between 0 and 1"),
        (
            "endpoint = \"https://otel:4317\"\n",
            "tracing.endpoint",
            "https is not supported",
        ),
        (
            "endpoint = \"otel:4317\"\n",
            "tracing.endpoint",
            "expected http://host:port",
        ),
        (
            "endpoint = \"http://otel:4317/v1/traces\"\n",
            "tracing.endpoint",
            "a gRPC endpoint has no path",
        ),
        (
            "service_name = \"\"\n",
            "tracing.service_name",
            "1 to 255 bytes",
        ),
        (
            "headers = { \"bad name\" = \"v\" }\n",
            "tracing.headers.bad name",
            "not a header name",
        ),
    ];
    for (line, field, needle) in cases {
        expect_one(&format!("{t}{line}{UP}"), 2, field, needle);
    }
    // Unknown fields and wrong types, as everywhere.
    let src = format!("{t}endpont = \"http://otel:4317\"\nprotocol = \"thrift\"\n{UP}");
    let errs = errors(&src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [(2, "tracing.endpont"), (3, "tracing.protocol")],
        "{errs:#?}"
    );
    assert!(
        errs[0].message.contains("did you mean `endpoint`?"),
        "{}",
        errs[0]
    );
}

/// `weir check --config PATH`: (exit code, stdout, stderr).
fn check(path: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every shipped config passes `weir check` — those that name files the user
/// provides (`/etc/weir/…`, a CA, a client certificate and key) once the
/// files exist. As shipped, those fail with one located error per missing
/// file, quoted in the example's own comments.
#[test]
fn every_shipped_config_passes_weir_check() {
    let mut files = vec!["config/weir.toml".to_string()];
    for e in std::fs::read_dir("config/examples").unwrap() {
        files.push(e.unwrap().path().display().to_string());
    }
    assert!(files.len() >= 3);
    let mut with_files = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut dir = None;
        let path = if text.contains("\"/etc/weir/") {
            with_files += 1;
            let (d, copy) = provided_files_fail_until_they_exist(&f, &text);
            dir = Some(d);
            copy
        } else {
            Path::new(&f).to_path_buf()
        };
        let (code, out, err) = check(&path);
        assert_eq!(code, Some(0), "{f}: {err}");
        // The printed effective config is itself a valid config.
        Config::parse(Path::new(&f), &out).unwrap_or_else(|e| panic!("{f} effective config:\n{e}"));
        drop(dir);
    }
    assert_eq!(
        with_files, 2,
        "egress-private-ca.toml and mtls-upstream.toml"
    );
}

/// Checks an example naming `/etc/weir/…` files as shipped, then writes
/// those files (PEM, made here) and returns a copy of the example naming them.
fn provided_files_fail_until_they_exist(f: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let (code, _, err) = check(Path::new(f));
    assert_eq!(code, Some(1), "{f}: {err}");
    let named: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split("\"/etc/weir/").nth(1))
        .filter_map(|r| r.split('"').next())
        .collect();
    let errors: Vec<&str> = err.lines().collect();
    assert_eq!(errors.len(), named.len(), "{f}: {err}");
    for (e, name) in errors.iter().zip(&named) {
        assert!(e.starts_with(&format!("error: {f}:")), "{e}");
        assert!(
            e.contains(&format!(
                "`: cannot read \"/etc/weir/{name}\": No such file or directory"
            )),
            "{e}"
        );
    }
    // The error quoted in the example's comments is the real one.
    let base = Path::new(f).file_name().unwrap().to_str().unwrap();
    let quoted: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| l.starts_with(&format!("{base}:")))
        .collect();
    assert!(!quoted.is_empty(), "{f} does not show its error");
    for q in quoted {
        assert!(err.contains(&format!("/{q}")), "{f}: {q}\nnot in\n{err}");
    }
    // With the files in place, it passes.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    for name in &named {
        let pem = if name.ends_with(".key") {
            pair.signing_key.serialize_pem()
        } else {
            pair.cert.pem()
        };
        std::fs::write(dir.join(name), pem).unwrap();
    }
    let copy = dir.join(base);
    let text = text.replace("\"/etc/weir/", &format!("\"{}/", dir.display()));
    std::fs::write(&copy, text).unwrap();
    (tmp, copy)
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

// ---------------------------------------------------------------------------
// Every unknown field and wrong type in one pass (issue 17, item 3).

/// The file: `timout` on line 9, `max_atempts` on line 11.
const TWO_TYPOS: &str = "# two typos\n[server]\nlisten = \"127.0.0.1:15001\"\n\n[upstreams.api]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"api\"]\nprotocol = \"http1\"\ntimout = \"5s\"\n[upstreams.api.retry]\nmax_atempts = 3\n";

#[test]
fn two_typos_are_both_reported_in_file_order_with_hints() {
    let errs = errors(TWO_TYPOS);
    let got: Vec<(usize, usize, &str)> = errs
        .iter()
        .map(|e| (e.line, e.column, e.field.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (9, 1, "upstreams.api.timout"),
            (11, 1, "upstreams.api.retry.max_atempts")
        ],
        "{errs:#?}"
    );
    assert_eq!(
        errs[0].message,
        "unknown field `timout`: did you mean `timeout`?"
    );
    assert_eq!(
        errs[1].message,
        "unknown field `max_atempts`: did you mean `max_attempts`?"
    );
}

#[test]
fn type_errors_and_unknown_fields_are_reported_together() {
    let src = "[defaults]\nconect_timeout = \"1s\"\n[defaults.breaker]\nfailure_rate = \"high\"\n\n[upstreams.api]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"api\", 5]\ntimeout = 10\nlisten_tls = { cert = \"a.pem\" }\n[upstreams.api.retry]\nmax_attempts = 3\nfrobnicate = true\n[upstreams.api.retry.backoff]\njitter = { proportionl = 0.2 }\n";
    let errs = errors(src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            (2, "defaults.conect_timeout"),
            (4, "defaults.breaker.failure_rate"),
            (8, "upstreams.api.hosts[1]"),
            (9, "upstreams.api.timeout"),
            (10, "upstreams.api.listen_tls"),
            (13, "upstreams.api.retry.frobnicate"),
            (15, "upstreams.api.retry.backoff.jitter.proportionl"),
        ],
        "{errs:#?}"
    );
    let msg = |i: usize| errs[i].message.as_str();
    assert!(
        msg(0).contains("did you mean `connect_timeout`?"),
        "{}",
        msg(0)
    );
    assert!(
        msg(1).contains("invalid type: string \"high\""),
        "{}",
        msg(1)
    );
    assert!(msg(2).contains("invalid type: integer `5`"), "{}", msg(2));
    assert!(msg(3).contains("bare number"), "{}", msg(3));
    assert_eq!(errs[3].column, 11);
    assert!(msg(4).contains("missing field `key`"), "{}", msg(4));
    // No close name: the fields valid there are listed instead (after the
    // message, by `weir check`; a reload's log lines leave them out).
    assert_eq!(msg(5), "unknown field `frobnicate`");
    assert!(
        errs[5]
            .to_string()
            .ends_with("unknown field `frobnicate`: expected one of `max_attempts`, `retry_on`, `max_retry_after`, `max_replay_body_bytes`, `min_attempt_time`, `backoff`, `budget`"),
        "{}",
        errs[5]
    );
    assert!(
        msg(6).contains("did you mean `proportional`?"),
        "{}",
        msg(6)
    );
}

#[test]
fn a_field_written_in_the_wrong_table_is_pointed_to_the_right_one() {
    let src = format!("{UP}max_attempts = 2\n");
    expect_one(
        &src,
        4,
        "upstreams.api.max_attempts",
        "did you mean `retry.max_attempts`?",
    );
    let src = format!("timeout = \"1s\"\n{UP}");
    expect_one(&src, 1, "timeout", "did you mean `defaults.timeout`?");
}

/// Validation too reports everything at once.
#[test]
fn once_the_schema_passes_every_validation_error_is_reported() {
    let src = format!("{UP}timeout = \"0s\"\n[upstreams.api.retry]\nmax_attempts = 25\n[upstreams.api.breaker]\nfailure_rate = 1.5\n");
    let errs = errors(&src);
    let lines: Vec<usize> = errs.iter().map(|e| e.line).collect();
    assert_eq!(lines, [4, 6, 8], "{errs:#?}");
}

// ---------------------------------------------------------------------------
// Every error in one pass, validation included (issue 32, item 5): what is
// well-formed is validated even when the schema finds errors elsewhere, and
// nothing is reported that rests on a field already reported.

/// Every error of `src`, as `weir check` prints them (after `error: `).
fn shown(src: &str) -> Vec<String> {
    errors(src).iter().map(|e| e.to_string()).collect()
}

/// The file: a type error (`burst = -1`), a misspelt field and a bad
/// URL, all three from one check, in file order.
const THREE_KINDS: &str = "[upstreams.api]\nurl = \"ftp://files\"\nhosts = [\"api\"]\ntimout = \"5s\"\n\n[upstreams.api.rate_limit]\nrps = 100\nburst = -1\n";

#[test]
fn a_type_error_an_unknown_field_and_a_bad_url_in_one_check() {
    assert_eq!(
        shown(THREE_KINDS),
        [
            "weir.toml:2:7: `upstreams.api.url`: invalid url \"ftp://files\": scheme \"ftp\" is not http or https",
            "weir.toml:4:1: `upstreams.api.timout`: unknown field `timout`: did you mean `timeout`?",
            "weir.toml:8:9: `upstreams.api.rate_limit.burst`: invalid value: integer `-1`, expected u32",
        ]
    );
    // The same three from `weir check`, and nothing else.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("weir.toml");
    std::fs::write(&p, THREE_KINDS).unwrap();
    let (code, out, err) = check(&p);
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    let want: Vec<String> = shown(THREE_KINDS)
        .iter()
        .map(|e| {
            format!(
                "error: {}",
                e.replacen("weir.toml", &p.display().to_string(), 1)
            )
        })
        .collect();
    assert_eq!(err.lines().collect::<Vec<_>>(), want);
}

/// A required value of the wrong type is reported once: not again as
/// missing, nor through the checks that needed it.
#[test]
fn a_type_error_in_a_required_field_is_reported_once() {
    // `url` is required by validation, `cert` by the schema.
    let src = "[upstreams.api]\nurl = 8080\nhosts = [\"api\"]\n";
    assert_eq!(
        shown(src),
        ["weir.toml:2:7: `upstreams.api.url`: invalid type: integer `8080`, expected a string"]
    );
    let src =
        format!("{UP}listen = \"127.0.0.1:0\"\nlisten_tls = {{ cert = 5, key = \"k.pem\" }}\n");
    assert_eq!(
        shown(&src),
        ["weir.toml:5:23: `upstreams.api.listen_tls.cert`: invalid type: integer `5`, expected a string"]
    );
    // A misspelt required field likewise: the hint stands for it.
    let src = "[upstreams.api]\nulr = \"http://127.0.0.1:1\"\nhosts = [\"api\"]\n";
    assert_eq!(
        shown(src),
        ["weir.toml:2:1: `upstreams.api.ulr`: unknown field `ulr`: did you mean `url`?"]
    );
}

/// A rule across fields that would have judged a rejected field against a
/// default in its place says nothing; the rejected field's error stands.
#[test]
fn rules_across_fields_do_not_judge_a_rejected_field() {
    let cases: [(&str, &[&str]); 6] = [
        // `hosts` rejected: not "unreachable".
        (
            "[upstreams.api]\nurl = \"http://127.0.0.1:1\"\nhosts = \"api\"\n",
            &["weir.toml:3:9: `upstreams.api.hosts`: invalid type: string \"api\", expected a sequence"],
        ),
        // `listen` rejected: not "listen_tls needs a dedicated listen".
        (
            "[upstreams.api]\nurl = \"http://127.0.0.1:1\"\nlisten = 15001\nlisten_tls = { cert = \"c.pem\", key = \"k.pem\" }\n",
            &[
                "weir.toml:3:10: `upstreams.api.listen`: invalid type: integer `15001`, expected a string",
                // Its own errors stand.
                "weir.toml:4:23: `upstreams.api.listen_tls.cert`: cannot read \"c.pem\": No such file or directory",
                "weir.toml:4:38: `upstreams.api.listen_tls.key`: cannot read \"k.pem\": No such file or directory",
            ],
        ),
        // `open` rejected: `max_open` is not held to the default `open`.
        (
            &format!("{UP}[upstreams.api.breaker]\nopen = \"soon\"\nmax_open = \"500ms\"\n"),
            &["weir.toml:5:8: `upstreams.api.breaker.open`: invalid duration \"soon\": expected a number before \"soon\""],
        ),
        // `rps` misspelt: not "`burst` needs `rps`".
        (
            &format!("{UP}[upstreams.api.rate_limit]\nrsp = 10\nburst = 5\n"),
            &["weir.toml:5:1: `upstreams.api.rate_limit.rsp`: unknown field `rsp`: did you mean `rps`?"],
        ),
        // `window` incomplete: not "needs `rps` or `window`".
        (
            &format!("{UP}[upstreams.api.rate_limit]\nwindow = {{ limit = 10 }}\n"),
            &["weir.toml:5:10: `upstreams.api.rate_limit.window`: missing field `period`"],
        ),
        // `[server] listen` rejected: the default is not said to clash.
        (
            "[server]\nlisten = 15001\n[upstreams.api]\nurl = \"http://127.0.0.1:1\"\nlisten = \"127.0.0.1:15001\"\n",
            &["weir.toml:2:10: `server.listen`: invalid type: integer `15001`, expected a string"],
        ),
    ];
    for (src, want) in cases {
        assert_eq!(shown(src), want, "{src}");
    }
}

/// Validation errors in a table the schema found errors in are reported
/// with them; a hint for a field that is written as well stands for nothing.
#[test]
fn validation_errors_beside_schema_errors_are_reported() {
    let src = format!("{UP}timeout = \"0s\"\nconect_timeout = true\n[upstreams.api.retry]\nmax_atempts = 3\nmax_attempts = 25\n[upstreams.api.breaker]\nfailure_rate = 1.5\nwindow = \"big\"\n");
    let errs = errors(&src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            (4, "upstreams.api.timeout"),
            (5, "upstreams.api.conect_timeout"),
            (7, "upstreams.api.retry.max_atempts"),
            (8, "upstreams.api.retry.max_attempts"),
            (10, "upstreams.api.breaker.failure_rate"),
            (11, "upstreams.api.breaker.window"),
        ],
        "{errs:#?}"
    );
    assert!(errs[0].message.contains("greater than 0"), "{}", errs[0]);
    assert!(errs[3].message.contains("retry budget"), "{}", errs[3]);
    assert!(errs[4].message.contains("(0, 1]"), "{}", errs[4]);
    // A field the hint names, written as well, keeps its own error.
    let src = format!("timeout = \"1s\"\n[defaults]\ntimeout = \"0s\"\n{UP}");
    assert_eq!(
        shown(&src),
        [
            "weir.toml:1:1: `timeout`: unknown field `timeout`: did you mean `defaults.timeout`?",
            "weir.toml:3:11: `defaults.timeout`: must be greater than 0",
        ]
    );
}

// ---------------------------------------------------------------------------
// The files a config names are loaded with it (issue 17, item 2).

/// A config naming every kind of file: (the config's path, its text).
fn with_files(dir: &Path, ca: &Path, cert: &Path, key: &Path) -> PathBuf {
    let p = dir.join("weir.toml");
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ntls = {{ cert = {cert:?}, key = {key:?} }}\n\n[upstreams.api]\nurl = \"https://127.0.0.1:1\"\nhosts = [\"api\"]\n\n[upstreams.api.tls]\nca_file = {ca:?}\nclient_cert = {cert:?}\nclient_key = {key:?}\n"
    );
    std::fs::write(&p, src).unwrap();
    p
}

fn pem_pair() -> (String, String) {
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    (pair.cert.pem(), pair.signing_key.serialize_pem())
}

#[test]
fn missing_files_fail_check_at_the_field_that_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, cert, key) = (d.join("ca.pem"), d.join("client.pem"), d.join("client.key"));
    let p = with_files(d, &ca, &cert, &key);
    let (code, out, err) = check(&p);
    assert_eq!(code, Some(1), "{out}");
    let at = |line: usize, col: usize, field: &str, file: &Path| {
        format!(
            "error: {}:{line}:{col}: `{field}`: cannot read {file:?}: No such file or directory",
            p.display()
        )
    };
    let col = |field: &str| field.len() + 4;
    let want = [
        at(4, 16, "server.tls.cert", &cert),
        at(
            4,
            16 + format!("{cert:?}").len() + 8,
            "server.tls.key",
            &key,
        ),
        at(11, col("ca_file"), "upstreams.api.tls.ca_file", &ca),
        at(
            12,
            col("client_cert"),
            "upstreams.api.tls.client_cert",
            &cert,
        ),
        at(13, col("client_key"), "upstreams.api.tls.client_key", &key),
    ];
    assert_eq!(err.lines().collect::<Vec<_>>(), want, "{err}");

    // Present and valid: the same file passes.
    let (c, k) = pem_pair();
    std::fs::write(&ca, &c).unwrap();
    std::fs::write(&cert, &c).unwrap();
    std::fs::write(&key, &k).unwrap();
    let (code, _, err) = check(&p);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn files_that_are_not_pem_fail_check_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, cert, key) = (d.join("ca.pem"), d.join("client.pem"), d.join("client.key"));
    let p = with_files(d, &ca, &cert, &key);
    let (c, k) = pem_pair();
    std::fs::write(&ca, "not a certificate\n").unwrap();
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(&key, &c).unwrap(); // a certificate where the key should be
    let (code, _, err) = check(&p);
    assert_eq!(code, Some(1));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 5, "{err}");
    let has = |i: usize, place: &str, why: &str| {
        assert!(
            lines[i].starts_with(&format!("error: {}:{place}", p.display()))
                && lines[i].contains(why),
            "{}",
            lines[i]
        );
    };
    has(
        0,
        "4:16: `server.tls.cert`",
        "is not a PEM certificate file",
    );
    has(1, "4:", "holds no PEM private key");
    has(
        2,
        "11:11: `upstreams.api.tls.ca_file`",
        "holds no PEM certificate",
    );
    has(
        3,
        "12:15: `upstreams.api.tls.client_cert`",
        "is not a PEM certificate file",
    );
    has(
        4,
        "13:14: `upstreams.api.tls.client_key`",
        "holds no PEM private key",
    );

    // A key that does not go with its certificate.
    let (_, other) = pem_pair();
    std::fs::write(&ca, &c).unwrap();
    std::fs::write(&cert, &c).unwrap();
    std::fs::write(&key, &other).unwrap();
    let (code, _, err) = check(&p);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("`server.tls.key`: this key cannot be used with cert"),
        "{err}"
    );
    assert!(
        err.contains(
            "13:14: `upstreams.api.tls.client_key`: this key cannot be used with client_cert"
        ),
        "{err}"
    );
    std::fs::write(&key, &k).unwrap();
    assert_eq!(check(&p).0, Some(0));
}

/// Missing files and validation errors come out together.
#[test]
fn file_errors_join_the_other_validation_errors() {
    let src = "[upstreams.api]\nurl = \"https://127.0.0.1:1\"\nhosts = [\"api\"]\ntimeout = \"0s\"\n[upstreams.api.tls]\nca_file = \"/nonexistent/weir-test/ca.pem\"\n";
    let errs = errors(src);
    let got: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            (4, "upstreams.api.timeout"),
            (6, "upstreams.api.tls.ca_file")
        ],
        "{errs:#?}"
    );
    assert_eq!(
        errs[1].message,
        "cannot read \"/nonexistent/weir-test/ca.pem\": No such file or directory"
    );
}

// ---------------------------------------------------------------------------
// POST /reload: 422 with every error; the running config stays.

async fn post_reload(admin: std::net::SocketAddr) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    s.write_all(b"POST /reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn a_failed_reload_answers_422_with_every_error_and_keeps_the_running_config() {
    use std::time::Duration;
    use weir::runtime::{Options, Runtime};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let good = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"api\"]\ntimeout = \"7s\"\n";
    std::fs::write(&path, good).unwrap();
    let opts = Options {
        watch: false,
        sighup: false,
        workers: 0,
    };
    let rt = Runtime::start(Config::load(&path).unwrap(), opts)
        .await
        .unwrap();

    // Three errors, lines 8, 9 and 11: all in the one answer, in file order.
    std::fs::write(
        &path,
        format!(
            "{good}timout = \"5s\"\nconnect_timeout = 2\n[upstreams.api.retry]\nmax_atempts = 3\n"
        ),
    )
    .unwrap();
    let (status, body) = post_reload(rt.admin_addr).await;
    assert_eq!(status, 422, "{body}");
    let p = path.display();
    let lines: Vec<&str> = body.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines,
        [
            format!("error: {p}:8:1: `upstreams.api.timout`: unknown field `timout`: did you mean `timeout`?"),
            format!("error: {p}:9:19: `upstreams.api.connect_timeout`: a bare number (2) is not a duration: write it as a string with a unit, e.g. \"2s\" or \"2ms\""),
            format!("error: {p}:11:1: `upstreams.api.retry.max_atempts`: unknown field `max_atempts`: did you mean `max_attempts`?"),
        ],
        "{body}"
    );

    // A CA file that is not there: 422 at its field.
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"https://127.0.0.1:1\"\nhosts = [\"api\"]\n[upstreams.api.tls]\nca_file = \"/nonexistent/weir-test/ca.pem\"\n",
    )
    .unwrap();
    let (status, body) = post_reload(rt.admin_addr).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains(&format!(
            "{p}:8:11: `upstreams.api.tls.ca_file`: cannot read"
        )),
        "{body}"
    );

    // The running config is the first one throughout.
    let snap = rt.proxy.snapshot();
    assert_eq!(snap.config.upstreams[0].timeout, Duration::from_secs(7));
    assert_eq!(
        snap.config.upstreams[0].url.scheme,
        weir::config::Scheme::Http
    );
    rt.shutdown(Duration::from_secs(1)).await;
}

// ---------------------------------------------------------------------------
// `[state]` and the scopes (docs/reference/fleet.md#fleet-state, issue 20).

/// Without `[state]`: memory, with the documented defaults spelt out in the
/// effective config; every breaker's scope `fleet`, every rate limit's
/// `instance`.
#[test]
fn state_defaults_to_memory_and_scopes_to_their_defaults() {
    use std::time::Duration;
    use weir::config::StateBackend;
    use weir::policy::Scope;
    let src = format!("{UP}[upstreams.api.rate_limit]\nrps = 10.0\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert_eq!(c.state.backend, StateBackend::Memory);
    assert_eq!(c.state.redis_url(), None);
    assert_eq!(c.state.key_prefix, "weir:");
    assert_eq!(c.state.timeout, Duration::from_millis(5));
    assert_eq!(c.state.refresh, Duration::from_secs(1));
    let u = &c.upstreams[0];
    assert_eq!(u.breaker.scope, Scope::Fleet);
    let rl = u.rate_limit.clone().unwrap();
    assert_eq!((rl.scope, rl.expected_instances), (Scope::Instance, None));
    let eff = c.effective_toml();
    for line in [
        "[state]",
        "backend = \"memory\"",
        "key_prefix = \"weir:\"",
        "timeout = \"5ms\"",
        "refresh = \"1s\"",
        "scope = \"fleet\"",
        "scope = \"instance\"",
    ] {
        assert!(eff.contains(line), "{line} not in:\n{eff}");
    }
    let again = Config::parse(Path::new("weir.toml"), &eff).unwrap();
    assert_eq!(again.state, c.state);
}

#[test]
fn a_redis_state_with_fleet_scopes_merges_field_by_field() {
    use weir::config::StateBackend;
    use weir::policy::Scope;
    let src = format!(
        "[state]\nbackend = \"redis\"\nurl = \"rediss://:s3cret@cache.internal:6380/2\"\nkey_prefix = \"prod:weir:\"\ntimeout = \"10ms\"\nrefresh = \"500ms\"\n\n[defaults.rate_limit]\nrps = 100.0\nscope = \"fleet\"\nexpected_instances = 4\n[defaults.breaker]\nscope = \"instance\"\n{UP}[upstreams.api.breaker]\nscope = \"fleet\"\n"
    );
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    assert_eq!(c.state.backend, StateBackend::Redis);
    assert_eq!(
        c.state.redis_url(),
        Some("rediss://:s3cret@cache.internal:6380/2")
    );
    assert_eq!(c.state.key_prefix, "prod:weir:");
    assert_eq!(c.state.timeout.as_millis(), 10);
    assert_eq!(c.state.refresh.as_millis(), 500);
    let u = &c.upstreams[0];
    assert_eq!(u.breaker.scope, Scope::Fleet);
    let rl = u.rate_limit.clone().unwrap();
    assert_eq!((rl.scope, rl.expected_instances), (Scope::Fleet, Some(4)));
    // Alone, each instance takes its share: 100 / 4 rps, burst ⌈100 / 4⌉.
    let alone = rl.fallback();
    assert_eq!(
        (alone.bucket, alone.scope),
        (Some((25.0, 25)), Scope::Instance)
    );
    // The password never reaches the effective config.
    let eff = c.effective_toml();
    assert!(!eff.contains("s3cret"), "{eff}");
    assert!(
        eff.contains("url = \"rediss://:***@cache.internal:6380/2\""),
        "{eff}"
    );
}

#[test]
fn state_values_are_validated_with_their_place() {
    let state = |body: &str| format!("[state]\n{body}\n{UP}");
    expect_one(
        &state("backend = \"redis\""),
        1,
        "state.url",
        "missing `url`: backend = \"redis\" needs the server",
    );
    for (url, needle) in [
        (
            "http://cache:6379",
            "scheme \"http\" is not redis or rediss",
        ),
        ("cache:6379", "invalid url"),
        ("redis://cache:6379/0?protocol=resp3", "query string"),
        ("rediss://cache:6379/0#insecure", "always verifies"),
        ("redis://cache:6379/zero", "the path is the database number"),
        ("redis:///0", "invalid url"),
    ] {
        let src = state(&format!("backend = \"redis\"\nurl = \"{url}\""));
        expect_one(&src, 3, "state.url", needle);
    }
    // Checked with the memory backend too, so switching later reveals nothing.
    expect_one(
        &state("url = \"http://cache\""),
        2,
        "state.url",
        "not redis or rediss",
    );
    expect_one(
        &state("timeout = \"0s\""),
        2,
        "state.timeout",
        "greater than 0 and at most 1s",
    );
    expect_one(&state("timeout = \"2s\""), 2, "state.timeout", "at most 1s");
    expect_one(
        &state("refresh = \"10ms\""),
        2,
        "state.refresh",
        "between 100ms and 1m",
    );
    expect_one(
        &state("key_prefix = \"weir prod:\""),
        2,
        "state.key_prefix",
        "whitespace",
    );
    expect_one(
        &state("backend = \"postgres\""),
        2,
        "state.backend",
        "unknown variant `postgres`, expected `memory` or `redis`",
    );
    expect_one(
        &state("timout = \"5ms\""),
        2,
        "state.timout",
        "did you mean `timeout`?",
    );
    expect_one(&state("timeout = 5"), 2, "state.timeout", "bare number");
}

#[test]
fn scopes_are_validated_where_they_are_written() {
    let src = format!("{UP}[upstreams.api.breaker]\nscope = \"global\"\n");
    expect_one(
        &src,
        5,
        "upstreams.api.breaker.scope",
        "unknown variant `global`, expected `instance` or `fleet`",
    );
    // A fleet bucket needs `rps`: a window stays per instance.
    let src = format!("{UP}[upstreams.api.rate_limit]\nwindow = {{ limit = 10, period = \"1s\" }}\nscope = \"fleet\"\n");
    expect_one(
        &src,
        6,
        "upstreams.api.rate_limit.scope",
        "shares the token bucket: it needs `rps`",
    );
    let src = format!("[defaults.rate_limit]\nrps = 5.0\nexpected_instances = 0\n{UP}");
    expect_one(
        &src,
        3,
        "defaults.rate_limit.expected_instances",
        "must be at least 1",
    );
    let src = format!("{UP}[upstreams.api.rate_limit]\nrps = 5.0\nexpected_instances = -2\n");
    expect_one(&src, 6, "upstreams.api.rate_limit.expected_instances", "-2");
}

// ---- endpoints (docs/reference/endpoints.md) ----

#[test]
fn an_endpoints_entry_that_is_not_host_and_port() {
    let src = format!("{UP}endpoints = [\"10.0.0.7:8080\", \"10.0.0.8\"]\n");
    let e = expect_one(&src, 4, "upstreams.api.endpoints[1]", "is not `host:port`");
    assert!(e.message.contains("\"10.0.0.8\""), "{e}");
}

#[test]
fn an_empty_endpoints_list() {
    let src = format!("{UP}endpoints = []\n");
    expect_one(&src, 4, "upstreams.api.endpoints", "lists no endpoint");
}

#[test]
fn a_repeated_endpoint() {
    let src = format!(
        "{UP}endpoints = [\n  \"10.0.0.7:8080\",\n  \"Api-2.internal:80\",\n  \"api-2.internal:80\",\n]\n"
    );
    expect_one(
        &src,
        7,
        "upstreams.api.endpoints[2]",
        "repeats endpoints[1]",
    );
}

#[test]
fn max_endpoints_below_the_static_list() {
    let src = format!(
        "{UP}endpoints = [\"10.0.0.7:1\", \"10.0.0.8:1\", \"10.0.0.9:1\"]\nmax_endpoints = 2\n"
    );
    expect_one(
        &src,
        5,
        "upstreams.api.max_endpoints",
        "below the 3 static endpoints",
    );
}

#[test]
fn ejection_and_balance_are_validated() {
    let src = format!("{UP}balance = \"least_conn\"\n[upstreams.api.ejection]\nfailure_share_above = 30\nmax = \"1s\"\n");
    let errs = errors(&src);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "upstreams.api.balance",
            "upstreams.api.ejection.failure_share_above",
            "upstreams.api.ejection.max",
        ],
        "{errs:#?}"
    );
    assert!(errs.iter().all(|e| e.line > 0 && e.column > 0), "{errs:#?}");
}

#[test]
fn endpoints_and_their_defaults_parse() {
    let src = format!("{UP}endpoints = [\"10.0.0.7:8080\", \"[::1]:81\", \"api-2.internal:80\"]\n");
    let c = Config::parse(Path::new("weir.toml"), &src).unwrap();
    let e = &c.upstreams[0].endpoints;
    assert!(e.fixed);
    assert_eq!(
        e.entries,
        [
            ("10.0.0.7".to_string(), 8080),
            ("[::1]".to_string(), 81),
            ("api-2.internal".to_string(), 80)
        ]
    );
    assert_eq!(e.params.max_endpoints, 64);
    assert_eq!(e.params.ejection.consecutive_failures, 5);
    assert_eq!(e.params.ejection.base.as_secs(), 5);
    assert_eq!(e.params.ejection.max.as_secs(), 60);
    // Without a list: the url's host and port.
    let c = Config::parse(Path::new("weir.toml"), UP).unwrap();
    let e = &c.upstreams[0].endpoints;
    assert!(!e.fixed);
    assert_eq!(e.entries, [("127.0.0.1".to_string(), 8080)]);
    // `weir check` prints them.
    let shown = c.effective_toml();
    assert!(shown.contains("balance = \"peak_ewma\""), "{shown}");
    assert!(shown.contains("consecutive_failures = 5"), "{shown}");
}

/// `[upstreams.NAME.hedge]` (docs/reference/hedging.md#hedging): `after` is a
/// duration or p50–p99.9, `max_extra` a share, and hedging needs retries.
#[test]
fn hedge_errors_name_their_field() {
    let src = format!("{UP}[upstreams.api.hedge]\nafter = \"soon\"\n");
    expect_one(&src, 5, "upstreams.api.hedge.after", "neither a duration");
    let src = format!("{UP}[upstreams.api.hedge]\nafter = \"p100\"\n");
    expect_one(&src, 5, "upstreams.api.hedge.after", "p99.9");
    let src = format!("{UP}[upstreams.api.hedge]\nafter = \"20ms\"\nmax_extra = 1.5\n");
    expect_one(&src, 6, "upstreams.api.hedge.max_extra", "from 0 to 1");
    let src = format!(
        "{UP}[upstreams.api.retry]\nmax_attempts = 1\n[upstreams.api.hedge]\nenabled = true\n"
    );
    expect_one(&src, 7, "upstreams.api.hedge.enabled", "needs retries");
    // Valid: a percentile, a duration, and hedging off with retries off.
    for ok in [
        "[upstreams.api.hedge]\nafter = \"p99.9\"\n",
        "[upstreams.api.hedge]\nafter = \"15ms\"\nmax_extra = 0.1\n",
        "[upstreams.api.retry]\nmax_attempts = 1\n[upstreams.api.hedge]\nenabled = false\n",
    ] {
        let src = format!("{UP}{ok}");
        if let Err(e) = Config::parse(Path::new("weir.toml"), &src) {
            panic!("{ok}: {e}");
        }
    }
}

#[test]
fn every_bad_field_of_one_policy_table_is_reported_in_one_run() {
    // Hedging used to name only `after`; the breaker only its first field.
    let src = format!("{UP}[upstreams.api.hedge]\nafter = \"p101\"\nmax_extra = 1.5\n");
    let fields: Vec<String> = errors(&src).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        ["upstreams.api.hedge.after", "upstreams.api.hedge.max_extra"]
    );
    let src = format!(
        "{UP}[upstreams.api.breaker]\nwindow = 0\nopen_jitter = 1.5\nhalf_open_probes = 0\n"
    );
    let fields: Vec<String> = errors(&src).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        [
            "upstreams.api.breaker.window",
            "upstreams.api.breaker.open_jitter",
            "upstreams.api.breaker.half_open_probes"
        ]
    );
}

#[test]
fn weir_check_notes_a_trip_rule_that_failing_for_holds_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let held = format!(
        "{UP}timeout = \"5s\"\nper_try_timeout = \"20s\"\n[upstreams.api.breaker]\nconsecutive_failures = 3\n"
    );
    std::fs::write(&path, &held).unwrap();
    let (code, _, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    let note = err
        .lines()
        .find(|l| l.contains("breaker.consecutive_failures"))
        .unwrap_or_else(|| panic!("no breaker note:\n{err}"));
    assert!(note.starts_with("note: "), "{note}");
    assert!(note.contains(":7:"), "located at its line: {note}");
    assert!(
        note.contains("3 failures in a row") && note.contains("1s"),
        "{note}"
    );
    assert!(note.contains("failing_for = \"0s\""), "{note}");
    // A per-try timeout longer than the deadline passes, with a warning
    // (a note until issue 58: it never applies).
    assert!(
        err.lines().any(|l| l.starts_with("warning: ")
            && l.contains("per_try_timeout")
            && l.contains("20s")),
        "{err}"
    );

    // Said once `failing_for` is the user's own choice: no note.
    let chosen =
        format!("{UP}[upstreams.api.breaker]\nconsecutive_failures = 3\nfailing_for = \"0s\"\n");
    std::fs::write(&path, &chosen).unwrap();
    let (code, _, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("breaker."), "{err}");

    // The default trip rule is not the user's: no note either.
    std::fs::write(&path, UP).unwrap();
    let (_, _, err) = check(&path);
    assert!(!err.contains("breaker."), "{err}");

    // An `open` of the user's without `max_open` no longer doubles: said.
    let open = format!("{UP}[upstreams.api.breaker]\nopen = \"5s\"\n");
    std::fs::write(&path, &open).unwrap();
    let (code, _, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("note: ")
            && l.contains("breaker.open")
            && l.contains("max_open = \"30s\"")),
        "{err}"
    );
    let both = format!("{UP}[upstreams.api.breaker]\nopen = \"5s\"\nmax_open = \"30s\"\n");
    std::fs::write(&path, &both).unwrap();
    let (_, _, err) = check(&path);
    assert!(!err.contains("breaker.open"), "{err}");
}

#[test]
fn throttle_fields_are_checked_even_while_it_is_off() {
    let src = format!("{UP}[upstreams.api.throttle]\nmultiplier = 0.5\n");
    expect_one(&src, 5, "upstreams.api.throttle.multiplier", "≥ 1");
    let src = format!("{UP}[defaults.throttle]\nenabled = true\nmax_reject = 1.0\n");
    let errs = errors(&src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].field.ends_with("throttle.max_reject"),
        "{}",
        errs[0]
    );
    let src = format!("{UP}[upstreams.api.throttle]\nenabled = true\nwindow = \"100ms\"\n");
    expect_one(&src, 6, "upstreams.api.throttle.window", "at least 1s");
}

/// gRPC's own fields: a method pattern that is neither `/pkg.Svc/Method`
/// nor `/pkg.Svc/*`, and a `failure_statuses` name that is no gRPC code,
/// each name the field and the line.
#[test]
fn grpc_fields_are_checked() {
    let src = format!("{UP}protocol = \"grpc\"\n[upstreams.api.grpc]\nidempotent_methods = [\"/pkg.Svc/Get\", \"pkg.Svc/*\"]\n");
    expect_one(
        &src,
        6,
        "upstreams.api.grpc.idempotent_methods",
        "\"pkg.Svc/*\" is not a gRPC method",
    );
    let src = format!("{UP}[upstreams.api.breaker]\nfailure_statuses = [503, \"unavailabel\"]\n");
    let e = expect_one(
        &src,
        5,
        "upstreams.api.breaker.failure_statuses",
        "neither an HTTP status nor a gRPC code",
    );
    assert!(e.message.contains("did you mean \"unavailable\"?"), "{e}");
    let ok = format!("{UP}[upstreams.api.breaker]\nfailure_statuses = [503, \"UNAVAILABLE\", \"deadline_exceeded\"]\n[upstreams.api.grpc]\nidempotent_methods = [\"/a.B/*\"]\n");
    let cfg = Config::parse(Path::new("weir.toml"), &ok).unwrap();
    assert_eq!(cfg.upstreams[0].breaker.failure_grpc, vec![14, 4]);
    assert!(cfg.upstreams[0].idempotent_methods.contains("/a.B/C"));
}

/// `[state]`: one of `url`, `sentinels` and `cluster`; `master_name` with
/// `sentinels` only; the primary's credentials with `sentinels` only; no
/// brace in `key_prefix` on a Cluster; the waits bounded.
#[test]
fn state_topologies_are_checked() {
    let st = |body: &str| format!("{UP}[state]\nbackend = \"redis\"\n{body}");
    expect_one(
        &st("url = \"redis://127.0.0.1:6379/0\"\nsentinels = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"m\"\n"),
        7,
        "state.sentinels",
        "`url` and `sentinels` are both set",
    );
    expect_one(
        &st("sentinels = [\"redis://127.0.0.1:26379\"]\n"),
        4,
        "state.master_name",
        "missing: `sentinels` needs the name",
    );
    expect_one(
        &st("url = \"redis://127.0.0.1:6379/0\"\nmaster_name = \"m\"\n"),
        7,
        "state.master_name",
        "is set without `sentinels`",
    );
    expect_one(
        &st("cluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001/3\"]\n"),
        6,
        "state.cluster[1]",
        "has no database number",
    );
    expect_one(
        &st("cluster = [\"redis://127.0.0.1:7000\"]\nkey_prefix = \"w{x}:\"\n"),
        7,
        "state.key_prefix",
        "has a brace",
    );
    expect_one(
        &st("url = \"redis://127.0.0.1:6379/0\"\npassword = \"p\"\n"),
        7,
        "state.password",
        "goes in the URL",
    );
    expect_one(
        &st("url = \"redis://127.0.0.1:6379/0\"\nwait_timeout = \"2s\"\n"),
        7,
        "state.wait_timeout",
        "at most 1s",
    );
    expect_one(
        &st("sentinels = [\"redis://127.0.0.1:26379\", \"rediss://127.0.0.1:26380\"]\nmaster_name = \"m\"\n"),
        6,
        "state.sentinels",
        "mixes redis:// and rediss://",
    );
    let e = errors(&st(
        "url = \"redis://127.0.0.1:6379/0\"\non_unavailable = \"drop\"\n",
    ));
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].message.contains("local") && e[0].message.contains("refuse"),
        "{}",
        e[0]
    );
    let ok = st("sentinels = [\"redis://:s3cret@127.0.0.1:26379\"]\nmaster_name = \"m\"\npassword = \"p\"\nwait_replicas = 1\non_unavailable = \"refuse\"\n");
    let cfg = Config::parse(Path::new("weir.toml"), &ok).unwrap();
    assert_eq!(cfg.state.wait_replicas, 1);
    assert_eq!(
        cfg.state.on_unavailable,
        weir::config::OnUnavailable::Refuse
    );
    let shown = cfg.effective_toml();
    assert!(
        !shown.contains("s3cret") && !shown.contains("\"p\""),
        "{shown}"
    );
    // Waiting for replicas while deciding locally is said, not refused.
    let local = st("url = \"redis://127.0.0.1:6379/0\"\nwait_replicas = 1\n");
    let cfg = Config::parse(Path::new("weir.toml"), &local).unwrap();
    assert!(
        cfg.advice
            .iter()
            .any(|a| a.text.contains("on_unavailable = \"refuse\"")),
        "{:?}",
        cfg.advice
    );
}

/// The ample batches of fleet rate limits (2026-12-07) are said by `weir
/// check` where a config sets `rate_limit.scope = "fleet"`, once for a
/// `[defaults]` table every upstream shares, and nowhere else.
#[test]
fn weir_check_says_fleet_limits_lease_longer_batches() {
    let notes = |src: &str| -> Vec<String> {
        let c = weir::config::Config::parse(std::path::Path::new("w.toml"), src).unwrap();
        c.advice
            .iter()
            .map(|a| a.to_string())
            .filter(|n| n.contains("leases 3 s of its own demand"))
            .collect()
    };
    let up = |name: &str, extra: &str| {
        format!("[upstreams.{name}]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"{name}\"]\n{extra}")
    };
    let state = "[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1/0\"\n";
    let fleet = "[upstreams.a.rate_limit]\nrps = 100\nscope = \"fleet\"\n";
    let said = notes(&format!(
        "{state}{}{fleet}{}",
        up("a", ""),
        up("b", "[upstreams.b.rate_limit]\nrps = 5\n")
    ));
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("upstreams.a.rate_limit.scope"),
        "{}",
        said[0]
    );
    let shared = "[defaults.rate_limit]\nrps = 100\nscope = \"fleet\"\n";
    let said = notes(&format!("{state}{shared}{}{}", up("a", ""), up("b", "")));
    assert_eq!(said.len(), 1, "once for [defaults]: {said:?}");
    assert!(notes(&up("a", "[upstreams.a.rate_limit]\nrps = 5\n")).is_empty());
}
