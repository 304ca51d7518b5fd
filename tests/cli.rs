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
/// warns. A config on the default scope gets no note (issue 53, item 5: a
/// changed default is said in the CHANGELOG, not on every check).
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
    // The default scope is said in the CHANGELOG, not on every check
    // (issue 53, item 5).
    assert!(!err.contains("defaults to"), "{err}");
    assert!(!err.contains("note:"), "{err}");
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

/// weir run as a child process in `dir` with `args` after `run`, in JSON
/// logs; every log line up to "weir is serving", that line last. Killed
/// when dropped.
fn run_in(dir: &std::path::Path, args: &[&str]) -> (Running, Vec<serde_json::Value>) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .current_dir(dir)
        .env_remove("WEIR_CONFIG")
        .args(["--log-format", "json", "run", "--workers", "1"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let admin = loop {
        let line = lines.next().expect("weir exited before serving").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen.push(v.clone());
        if v["message"] == "weir is serving" {
            break v["admin"].as_str().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (Running { child, admin }, seen)
}

/// One HTTP/1.1 GET through `addr` naming `host`: the status line and body.
fn get(addr: &str, host: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// An upstream on a free loopback port answering every request `200 hi`.
fn tiny_upstream() -> std::net::SocketAddr {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi");
        }
    });
    addr
}

/// Issue 46, item 1: from a directory with no config file, `weir run`
/// serves the built-in default and says so in its first line; `--listen`,
/// `--admin` and `--upstream NAME=URL` make the config, and the startup
/// line says how to call weir, with no empty field.
#[test]
fn run_without_a_config_file_serves_the_builtin_default_and_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let up = tiny_upstream();
    let (weir_, lines) = run_in(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            &format!("app=http://{up}"),
        ],
    );
    let first = lines[0]["message"].as_str().unwrap();
    assert!(first.contains("serving the built-in default"), "{first}");
    let serving = lines.last().unwrap();
    assert_eq!(serving["config"], "(built-in default)");
    assert_eq!(serving["upstreams"], "app");
    assert!(serving.get("dedicated").is_none(), "{serving}");
    let listen = serving["listen"].as_str().unwrap();
    assert_eq!(
        serving["try"],
        format!("curl -H 'Host: app' http://{listen}/").as_str()
    );
    let answer = get(listen, "app");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nhi"), "{answer}");
    // A reload of the built-in default keeps what the command line set.
    let reload = {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(weir_.admin).unwrap();
        write!(
            s,
            "POST /reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(reload.starts_with("HTTP/1.1 200"), "{reload}");
    let answer = get(listen, "app");
    assert!(answer.ends_with("\r\n\r\nhi"), "{answer}");
    drop(weir_);

    // With no flag at all: the built-in default's own addresses.
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .current_dir(dir.path())
        .env_remove("WEIR_CONFIG")
        .arg("check")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let shipped = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--config", "config/weir.toml"])
        .output()
        .unwrap();
    assert_eq!(
        out.stdout, shipped.stdout,
        "the built-in default is config/weir.toml"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).ends_with("(built-in default): ok (1 upstreams)\n")
    );
}

/// Issue 46, item 1: `weir check` prints the config the flags make, over
/// the built-in default or over a file; an error in a flag names the flag.
#[test]
fn check_prints_the_config_the_flags_make() {
    let dir = tempfile::tempdir().unwrap();
    let check_in = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_weir"))
            .current_dir(dir.path())
            .env_remove("WEIR_CONFIG")
            .arg("check")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = check_in(&[
        "--upstream",
        "api=http://127.0.0.1:9000",
        "--listen",
        "127.0.0.1:18001",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("listen = \"127.0.0.1:18001\"\n"), "{out}");
    assert!(out.contains("admin = \"127.0.0.1:15000\"\n"), "{out}");
    assert!(
        out.contains("[upstreams.api]\nurl = \"http://127.0.0.1:9000\"\nhosts = [\"api\"]\n"),
        "{out}"
    );
    // Over the built-in default, --upstream replaces its example `app`.
    assert!(!out.contains("[upstreams.app]"), "{out}");

    // Over a file: the url of an upstream it has is set, another is added.
    let file = dir.path().join("w.toml");
    std::fs::write(
        &file,
        "[upstreams.app]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"app\", \"localhost\"]\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (code, out, err) = check_in(&[
        "--config",
        f,
        "--upstream",
        "app=http://127.0.0.1:9001",
        "--upstream",
        "api=http://127.0.0.1:9002",
        "--admin",
        "127.0.0.1:18000",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("admin = \"127.0.0.1:18000\"\n"), "{out}");
    assert!(out.contains("[upstreams.app]\nurl = \"http://127.0.0.1:9001\"\nhosts = [\n    \"app\",\n    \"localhost\",\n]\n"), "{out}");
    assert!(
        out.contains("[upstreams.api]\nurl = \"http://127.0.0.1:9002\"\nhosts = [\"api\"]\n"),
        "{out}"
    );

    // A bad value names its flag, not a line of the file.
    let (code, _, err) = check_in(&["--config", f, "--upstream", "app=ftp://x"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: --upstream app=ftp://x: `upstreams.app.url`: invalid url \"ftp://x\": scheme \"ftp\" is not http or https\n"
    );
    let (code, _, err) = check_in(&["--upstream", "app"]);
    assert_eq!(code, 2);
    assert!(err.contains("expected NAME=URL"), "{err}");
    // A file named and missing is an error, not the built-in default.
    let (code, _, err) = check_in(&["--config", "nope.toml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: nope.toml: cannot read the config file"),
        "{err}"
    );
}

/// Issue 46, item 3: a newcomer's config with eight mistakes gets all eight
/// from one `weir check`: the checks across upstreams (a duplicate route,
/// a listen address taken) among the upstreams whose fields have errors
/// too, and what `weir schedule` warns about besides.
#[test]
fn check_reports_every_mistake_in_one_pass() {
    let (code, _, err) = check(
        r#"[server]
listen = "127.0.0.1:15001"

[upstreams.api]
url = "ftp://api.internal"
hosts = ["api"]
timout = "5s"

[upstreams.api.retry]
max_attempts = "3"

[upstreams.users]
url = "http://users.internal"
hosts = ["api"]
listen = "127.0.0.1:15001"
protocol = "http2"

[upstreams.users.retry.backoff]
base = "2s"
max = "1s"

[upstreams.orders]
url = "http://orders.internal"
hosts = ["orders:8080"]
"#,
    );
    assert_eq!(code, 1);
    let lines: Vec<&str> = err.lines().collect();
    let want = [
        ":5:7: `upstreams.api.url`: invalid url",
        ":7:1: `upstreams.api.timout`: unknown field",
        ":10:16: `upstreams.api.retry.max_attempts`:",
        ":14:10: `upstreams.users.hosts[0]`: host \"api\" with path_prefix \"/\" is already routed to upstream \"api\"",
        ":15:10: `upstreams.users.listen`: listen address 127.0.0.1:15001 is already used by [server] listen",
        ":16:12: `upstreams.users.protocol`: unknown protocol \"http2\"",
        ":20:7: `upstreams.users.retry.backoff.max`:",
        ":24:10: `upstreams.orders.hosts[0]`: invalid host pattern",
    ];
    assert_eq!(lines.len(), want.len(), "{err}");
    for (line, want) in lines.iter().zip(want) {
        assert!(line.contains(want), "{line:?} lacks {want:?}\n{err}");
    }

    // A valid config: what `weir schedule` warns about, and a
    // per_try_timeout past timeout, are said by `weir check` too.
    let (code, _, err) = check(
        r#"[upstreams.api]
url = "http://127.0.0.1:8080"
hosts = ["api"]
timeout = "5s"
per_try_timeout = "20s"

[upstreams.slow]
url = "http://127.0.0.1:8081"
hosts = ["slow"]
timeout = "1s"

[upstreams.slow.retry]
max_attempts = 5

[upstreams.slow.retry.backoff]
base = "1s"
max = "1s"
jitter = "none"
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(":5:19: `upstreams.api.per_try_timeout`: 20s is longer than `timeout` (5s)"),
        "{err}"
    );
    assert!(
        err.contains("warning: upstream `slow`: the worst-case backoff alone (4s) does not fit in timeout (1s)"),
        "{err}"
    );
}

/// Runs weir on a good config with `--log-format FORMAT`, replaces the
/// file with `bad`, asks `POST /reload` (expecting 422), stops weir and
/// returns its whole log.
fn log_of_a_rejected_reload(format: &str, bad: &str) -> String {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.toml");
    let good = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
                [upstreams.app]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"app\"]\n";
    std::fs::write(&p, good).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--log-format", format, "run", "--workers", "1", "--config"])
        .arg(&p)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut log = Vec::new();
    let admin = loop {
        let mut b = [0u8; 1];
        assert_eq!(err.read(&mut b).unwrap(), 1, "weir exited before serving");
        log.push(b[0]);
        let text = String::from_utf8_lossy(&log);
        if let Some(l) = text.lines().find(|l| l.contains("weir is serving")) {
            if text.ends_with('\n') {
                let at = l.find("admin").unwrap() + 5;
                let addr: String = l[at..]
                    .trim_start_matches(['=', '"', ':'])
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                break addr;
            }
        }
    };
    std::fs::write(&p, bad).unwrap();
    let mut s = std::net::TcpStream::connect(&admin).unwrap();
    write!(
        s,
        "POST /reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    // The rejection is logged before the answer is sent; stop weir and
    // read the rest of its log.
    child.kill().unwrap();
    err.read_to_end(&mut log).unwrap();
    let _ = child.wait();
    String::from_utf8(log).unwrap()
}

/// Three mistakes: a bad URL, a misspelt field (a "did you mean" hint) and
/// an unknown field with no close name (serde would list the 29 valid ones).
const THREE_MISTAKES: &str = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
     [upstreams.app]\nurl = \"ftp://x\"\nhosts = [\"app\"]\ntimout = \"1s\"\nfrobnicate = true\n";

/// Issue 58, item 1 (and issue 46, item 4): a rejected reload is one event
/// per mistake, each on one line with its place as fields of its own, and
/// never the list of every valid field name. It used to be one event whose
/// `error` held every mistake with a literal `\n` between them, followed by
/// the 29 field names an `[upstreams.NAME]` table takes.
#[test]
fn a_rejected_reload_logs_one_event_per_mistake() {
    let log = log_of_a_rejected_reload("text", THREE_MISTAKES);
    for line in log.lines() {
        assert!(
            line.starts_with("20"),
            "a line with no timestamp: {line:?}\n{log}"
        );
    }
    assert!(!log.contains("\\n"), "a literal \\n in the log:\n{log}");
    assert!(!log.contains("expected one of"), "{log}");
    assert!(!log.contains("`max_attempts`"), "{log}");
    // One from POST /reload; the file watch may have seen the edit first.
    let summaries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("config reload rejected; the running config stays"))
        .collect();
    assert!(!summaries.is_empty(), "{log}");
    assert!(summaries.iter().all(|l| l.contains("errors=3")), "{log}");
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("config reload rejected: why"))
        .collect();
    assert_eq!(why.len(), 3 * summaries.len(), "{log}");
    for (field, line, error) in [
        ("upstreams.app.url", 5, "invalid url"),
        (
            "upstreams.app.timout",
            7,
            "unknown field `timout`: did you mean `timeout`?",
        ),
        (
            "upstreams.app.frobnicate",
            8,
            "error=unknown field `frobnicate`",
        ),
    ] {
        assert!(
            why.iter().any(|l| l.contains(&format!("field=\"{field}\""))
                && l.contains(&format!("line={line} "))
                && l.contains(error)),
            "no line for {field}:\n{log}"
        );
    }

    // The JSON log: the same events, every field its own JSON value.
    let log = log_of_a_rejected_reload("json", THREE_MISTAKES);
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v: &serde_json::Value| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("config reload rejected"))
        })
        .collect();
    let why: Vec<&serde_json::Value> = events
        .iter()
        .filter(|v| v["message"] == "config reload rejected: why")
        .collect();
    assert!(!why.is_empty() && why.len() % 3 == 0, "{log}");
    for v in &why {
        let error = v["error"].as_str().unwrap();
        assert!(
            !error.contains('\n') && !error.contains("expected one of"),
            "{v}"
        );
        assert!(v["line"].is_u64() && v["column"].is_u64(), "{v}");
        assert!(v["file"].as_str().unwrap().ends_with("w.toml"), "{v}");
    }
    assert!(
        why.iter()
            .any(|v| v["field"] == "upstreams.app.frobnicate" && v["line"] == 8),
        "{log}"
    );
    assert!(
        events.iter().any(|v| v["errors"] == 3),
        "no summary event counting 3 errors:\n{log}"
    );
}

/// An upstream on a free loopback port answering its first request `503`
/// and every later one `200 ok`.
fn fails_once_upstream() -> std::net::SocketAddr {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for (i, mut c) in l.incoming().flatten().enumerate() {
            let mut buf = [0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let answer: &[u8] = if i == 0 {
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
            };
            let _ = c.write_all(answer);
        }
    });
    addr
}

/// Issue 46, item 6: `[tracing] exporter = "log"` writes each span to
/// standard output as one line of JSON, no collector needed: a request
/// retried once is three lines, a server span and two attempt spans under
/// it, the first attempt's 503 its retry cause. The log stays on standard
/// error.
#[test]
fn the_log_exporter_prints_a_retried_requests_three_spans() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let up = fails_once_upstream();
    let p = dir.path().join("run.toml");
    std::fs::write(
        &p,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [tracing]\nexporter = \"log\"\nsample = 1.0\n\
             [upstreams.app]\nurl = \"http://{up}\"\nhosts = [\"app\"]\n\
             [upstreams.app.retry.backoff]\nbase = \"10ms\"\njitter = \"none\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--log-format", "json", "run", "--workers", "1", "--config"])
        .arg(&p)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut log = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let running = Running {
        child,
        admin: "127.0.0.1:1".parse().unwrap(),
    };
    let listen = loop {
        let line = log.next().expect("weir exited before serving").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["message"] == "weir is serving" {
            break v["listen"].as_str().unwrap().to_string();
        }
    };
    std::thread::spawn(move || log.for_each(drop));
    let answer = get(&listen, "app");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-weir-attempts: 2"), "{answer}");

    // Read standard output on a thread of its own: the test fails, rather
    // than hangs, if fewer than three lines come.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let spans: Vec<serde_json::Value> = (0..3)
        .map(|_| {
            let line = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("fewer than three span lines on standard output");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
        })
        .collect();
    drop(running);
    let trace = spans[0]["trace_id"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert!(spans.iter().all(|s| s["trace_id"] == trace), "{spans:#?}");
    let server: Vec<_> = spans.iter().filter(|s| s["kind"] == "SERVER").collect();
    assert_eq!(server.len(), 1, "{spans:#?}");
    let server = server[0];
    assert_eq!(server["parent_span_id"], "");
    assert_eq!(server["service"], "weir");
    assert_eq!(server["name"], "GET");
    assert_eq!(server["attributes"]["weir.upstream"], "app");
    assert_eq!(server["attributes"]["weir.attempts"], 2);
    assert_eq!(server["attributes"]["http.response.status_code"], 200);
    let mut attempts: Vec<_> = spans.iter().filter(|s| s["kind"] == "CLIENT").collect();
    attempts.sort_by_key(|s| s["attributes"]["weir.attempt"].as_i64());
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for a in &attempts {
        assert_eq!(a["parent_span_id"], server["span_id"], "{spans:#?}");
        assert!(a["end"].as_u64().unwrap() >= a["start"].as_u64().unwrap());
    }
    assert_eq!(attempts[0]["attributes"]["http.response.status_code"], 503);
    assert_eq!(attempts[0]["attributes"]["weir.retry_cause"], "status_503");
    assert_eq!(attempts[0]["status"], "ERROR");
    assert_eq!(attempts[1]["attributes"]["http.response.status_code"], 200);
    // Issue 58, item 4: in the order docs/reference/tracing.md shows them —
    // the attempts in turn, then the server span (it came first).
    let kinds: Vec<&str> = spans.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["CLIENT", "CLIENT", "SERVER"], "{spans:#?}");
    assert_eq!(spans[0]["attributes"]["weir.attempt"], 1, "{spans:#?}");
    assert_eq!(spans[1]["attributes"]["weir.attempt"], 2, "{spans:#?}");
}

/// `exporter = "log"` with an `endpoint` is refused: one or the other.
#[test]
fn check_refuses_an_endpoint_with_the_log_exporter() {
    let (code, _, err) = check(
        "[tracing]\nexporter = \"log\"\nendpoint = \"http://127.0.0.1:4317\"\n\
         [upstreams.app]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"app\"]\n",
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("tracing.endpoint"), "{err}");
    assert!(err.contains("exporter = \"log\""), "{err}");
}

/// Issue 58, item 2: `weir check` says every warning in the same pass as
/// the errors (it used to say them only for a file without errors), a
/// `per_try_timeout` past `timeout` is a warning naming both values and
/// what weir does, and `--strict` fails on a warning (not on a note).
#[test]
fn check_says_warnings_beside_errors_and_strict_fails_on_them() {
    let api = "[upstreams.api]\nurl = \"http://127.0.0.1:8080\"\nhosts = [\"api\"]\ntimeout = \"1s\"\nper_try_timeout = \"5s\"\n";
    let bad = "[upstreams.bad]\nurl = \"ftp://x\"\nhosts = [\"bad\"]\n";
    let warning = ":5:19: `upstreams.api.per_try_timeout`: 5s is longer than `timeout` (1s), so it never applies: weir ends every attempt at the request's deadline, 1s after it arrived";
    let (code, _, err) = check(&format!("{api}{bad}"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`upstreams.bad.url`: invalid url"), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("per_try_timeout") && !l.contains("no longer counts the time"))
        .unwrap_or_else(|| panic!("no per_try_timeout warning beside the error:\n{err}"));
    assert!(line.starts_with("warning: "), "{line}");
    assert!(line.contains(warning), "{line}");

    // Valid: exit 0, the warning said; --strict: exit 1 for it.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.toml");
    std::fs::write(&p, api).unwrap();
    let path = p.to_str().unwrap();
    let (code, _, err) = weir(&["check", "--config", path], None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("warning: {path}{warning}")), "{err}");
    let (code, out, err) = weir(&["check", "--strict", "--config", path], None);
    assert_eq!(code, 1, "{err}");
    assert!(
        out.contains("[upstreams.api]"),
        "the effective config still: {out}"
    );
    assert!(err.contains(warning), "{err}");
    assert!(
        err.contains("1 warning (--strict: a warning fails the check)"),
        "{err}"
    );
    assert!(!err.contains(": ok ("), "{err}");

    // A note alone passes --strict.
    let noted = "[upstreams.t]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"t\"]\n[upstreams.t.throttle]\nenabled = true\n";
    std::fs::write(&p, noted).unwrap();
    let (code, _, err) = weir(&["check", "--strict", "--config", path], None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("note: upstream `t`"), "{err}");
}

/// Issue 53: settings whose meaning changed (client-side throttling's
/// quota answers, the adaptive limit's count and slow start) are said by
/// `weir check` where they are set, and nowhere else.
#[test]
fn check_says_what_changed_under_throttling_and_the_adaptive_limit() {
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n";
    let cfg = format!(
        "{head}[upstreams.t]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"t\"]\n[upstreams.t.throttle]\nenabled = true\n\
         [upstreams.a]\nurl = \"http://127.0.0.1:2\"\nhosts = [\"a\"]\n[upstreams.a.concurrency]\nlimit = \"adaptive\"\n\
         [upstreams.p]\nurl = \"http://127.0.0.1:3\"\nhosts = [\"p\"]\n"
    );
    let (code, _, err) = check(&cfg);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("note: upstream `t`: client-side throttling counts a 429"),
        "{err}"
    );
    assert!(
        err.contains("note: upstream `a`: the adaptive limit now counts only"),
        "{err}"
    );
    assert!(!err.contains("upstream `p`"), "{err}");
}

/// The JSON log lines of `weir run ARGS` (in an empty directory, so the
/// built-in default is the config) up to "weir is serving".
fn start_log(args: &[&str]) -> Vec<serde_json::Value> {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--log-format", "json", "run", "--workers", "1"])
        .args(args)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let _running = Running {
        child,
        admin: "127.0.0.1:1".parse().unwrap(),
    };
    let mut out = Vec::new();
    loop {
        let line = lines.next().expect("weir exited before serving").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let serving = v["message"] == "weir is serving";
        out.push(v);
        if serving {
            return out;
        }
    }
}

/// Issue 58, item 4: a listener or the admin bound beyond loopback is
/// said at start, with what it lets other hosts reach; nothing was said.
#[test]
fn run_warns_of_listeners_bound_beyond_loopback() {
    let warnings = |log: &[serde_json::Value]| -> Vec<String> {
        log.iter()
            .filter(|v| {
                v["level"] == "WARN" && v["message"].as_str().unwrap().contains("beyond loopback")
            })
            .map(|v| {
                format!(
                    "{} {}",
                    v["address"].as_str().unwrap(),
                    v["message"].as_str().unwrap()
                )
            })
            .collect()
    };
    let up = ["--upstream", "app=http://127.0.0.1:1"];
    let log = start_log(&[&["--listen", "0.0.0.0:0", "--admin", "0.0.0.0:0"][..], &up].concat());
    let w = warnings(&log);
    assert_eq!(w.len(), 2, "{log:#?}");
    assert!(
        w[0].starts_with("0.0.0.0:")
            && w[0].contains("the shared listener is bound beyond loopback: any host that can reach this one on port ")
            && w[0].contains("can send requests through weir, with its policy and its place in the network, to `app` (http://127.0.0.1:1)"),
        "{w:?}"
    );
    assert!(
        w[1].contains("the admin listener is bound beyond loopback: /metrics, /healthz and /readyz answer any host")
            && w[1].contains("/config, /reload and the status page still answer loopback peers only"),
        "{w:?}"
    );
    // Only the one beyond loopback is said.
    let log = start_log(
        &[
            &["--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"][..],
            &up,
        ]
        .concat(),
    );
    let w = warnings(&log);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("the admin listener"), "{w:?}");
    let log = start_log(
        &[
            &["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"][..],
            &up,
        ]
        .concat(),
    );
    assert_eq!(warnings(&log), Vec::<String>::new());
}
