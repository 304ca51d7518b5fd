//! Shipping weir: the Dockerfile, `deploy/` and `.ci/run` checked against
//! each other, against the configs they mount, and against a running weir.
//! No container engine is needed: the files are parsed and cross-read.
//!
//! - every TOML under `config/` and `deploy/` (and the ConfigMap's) passes
//!   `weir check`;
//! - the image builds with the command `.ci/run` builds with, and copies only
//!   what `.dockerignore` lets through;
//! - the Kubernetes and Compose files agree with the image (config path,
//!   user, ports) and with the weir.toml they mount (listeners, probes,
//!   scrape port, the URLs the application calls, upstream addresses, the
//!   Redis the replicas share and the instances a fleet rate limit expects);
//! - every metric and label the dashboard and the alert rules query exists in
//!   the `/metrics` of a weir that has served traffic.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Response, StatusCode};
use serde_yaml_ng::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use weir::config::Config;
use weir::runtime::{Options, Runtime};

/// Where the image's ENTRYPOINT reads its config (the issue's contract).
const IMAGE_CONFIG: &str = "/etc/weir/weir.toml";

/// Labels a Prometheus scrape adds to every series (target labels and the
/// Kubernetes relabelling in deploy/prometheus/kubernetes.yml).
const TARGET_LABELS: [&str; 5] = ["job", "instance", "namespace", "pod", "app"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a YAML file, `<<` merge keys applied.
fn yaml_docs(rel: &str) -> Vec<Yaml> {
    let src = read(rel);
    serde_yaml_ng::Deserializer::from_str(&src)
        .map(|d| {
            let mut v: Yaml = serde::Deserialize::deserialize(d)
                .unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"));
            v.apply_merge()
                .unwrap_or_else(|e| panic!("{rel}: merge keys: {e}"));
            v
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml(rel: &str) -> Yaml {
    let mut docs = yaml_docs(rel);
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.remove(0)
}

/// `v[a][b]...`, panicking with the path when a step is missing.
fn at<'a>(v: &'a Yaml, path: &[&str]) -> &'a Yaml {
    let mut cur = v;
    for (i, k) in path.iter().enumerate() {
        cur = cur
            .get(*k)
            .unwrap_or_else(|| panic!("missing `{}`", path[..=i].join(".")));
    }
    cur
}

fn s(v: &Yaml) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v:?}"))
}

fn seq(v: &Yaml) -> &Vec<Yaml> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("expected a list, got {v:?}"))
}

/// A YAML scalar as text (ports and numbers may be written either way).
fn scalar(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        other => panic!("expected a scalar, got {other:?}"),
    }
}

fn strings(v: &Yaml) -> Vec<String> {
    seq(v).iter().map(scalar).collect()
}

fn parse_config(label: &str, src: &str) -> Config {
    Config::parse(Path::new(label), src).unwrap_or_else(|e| panic!("{label}:\n{e}"))
}

fn load_config(rel: &str) -> Config {
    parse_config(rel, &read(rel))
}

/// `http://host:port[/...]` → (host, port).
fn host_port(url: &str) -> (String, u16) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("{url}: not http://"));
    let authority = rest.split('/').next().unwrap();
    let (h, p) = authority
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{url}: no port"));
    (h.to_string(), p.parse().unwrap())
}

// ---------------------------------------------------------------------------
// Every TOML passes `weir check`.

fn tomls(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            tomls(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

fn weir_check(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `weir.toml` key of deploy/kubernetes/configmap.yaml.
fn configmap() -> (String, String, String) {
    let cm = yaml("deploy/kubernetes/configmap.yaml");
    assert_eq!(s(at(&cm, &["kind"])), "ConfigMap");
    let name = s(at(&cm, &["metadata", "name"])).to_string();
    let data = at(&cm, &["data"]).as_mapping().unwrap();
    assert_eq!(data.len(), 1, "the ConfigMap holds weir.toml only");
    let (k, v) = data.iter().next().unwrap();
    (name, scalar(k), s(v).to_string())
}

#[test]
fn every_toml_under_config_and_deploy_passes_weir_check() {
    let mut files = Vec::new();
    tomls(&root().join("config"), &mut files);
    tomls(&root().join("deploy"), &mut files);
    let dir = tempfile::tempdir().unwrap();
    let (_, key, src) = configmap();
    let cm = dir.path().join(&key);
    std::fs::write(&cm, src).unwrap();
    files.push(cm);
    for must in [
        "config/weir.toml",
        "deploy/docker/weir.toml",
        "deploy/compose/weir/weir.toml",
    ] {
        assert!(files.contains(&root().join(must)), "{must} not found");
    }
    for f in &files {
        // Examples naming files the user provides (`/etc/weir/…`) fail until
        // those exist; tests/config_errors.rs checks them with files made there.
        if std::fs::read_to_string(f).unwrap().contains("\"/etc/weir/") {
            continue;
        }
        let (ok, err) = weir_check(f);
        assert!(ok, "weir check {} failed:\n{err}", f.display());
    }
    // And the check is real: a broken file fails.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[upstreams.x]\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    assert!(!weir_check(&bad).0);
}

// ---------------------------------------------------------------------------
// The Dockerfile.

#[derive(Debug, Default)]
struct Stage {
    from: String,
    name: Option<String>,
    /// (sources, destination, --from stage)
    copies: Vec<(Vec<String>, String, Option<String>)>,
    runs: Vec<String>,
    expose: Vec<u16>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    /// HEALTHCHECK: its `--flag=value` options, and its CMD (exec form).
    healthcheck: Option<(BTreeMap<String, String>, Vec<String>)>,
}

/// Instructions with continuations joined and comments dropped, per stage.
fn dockerfile() -> Vec<Stage> {
    let src = read("Dockerfile");
    let mut logical = Vec::new();
    let mut cur = String::new();
    for line in src.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
        } else {
            cur.push_str(t);
            logical.push(std::mem::take(&mut cur));
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for ins in logical {
        let (kw, rest) = ins.split_once(' ').unwrap_or((&ins, ""));
        let rest = rest.trim();
        let words: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
        match kw.to_ascii_uppercase().as_str() {
            "FROM" => stages.push(Stage {
                from: words[0].clone(),
                name: (words.len() == 3 && words[1].eq_ignore_ascii_case("as"))
                    .then(|| words[2].clone()),
                ..Stage::default()
            }),
            "COPY" => {
                let from = words
                    .iter()
                    .find_map(|w| w.strip_prefix("--from="))
                    .map(str::to_string);
                let mut paths: Vec<String> = words
                    .iter()
                    .filter(|w| !w.starts_with("--"))
                    .cloned()
                    .collect();
                let dst = paths.pop().unwrap();
                stages.last_mut().unwrap().copies.push((paths, dst, from));
            }
            "RUN" => stages.last_mut().unwrap().runs.push(rest.to_string()),
            "EXPOSE" => stages.last_mut().unwrap().expose.extend(
                words
                    .iter()
                    .map(|w| w.trim_end_matches("/tcp").parse::<u16>().unwrap()),
            ),
            "USER" => stages.last_mut().unwrap().user = Some(rest.to_string()),
            "ENTRYPOINT" => {
                let v: Vec<String> = serde_json::from_str(rest)
                    .unwrap_or_else(|e| panic!("ENTRYPOINT must be exec form: {e}"));
                stages.last_mut().unwrap().entrypoint = Some(v);
            }
            "HEALTHCHECK" => {
                let (opts, cmd) = rest
                    .split_once("CMD ")
                    .unwrap_or_else(|| panic!("HEALTHCHECK without CMD: {rest}"));
                let opts = opts
                    .split_whitespace()
                    .map(|o| {
                        let (k, v) = o.split_once('=').unwrap();
                        (k.trim_start_matches("--").to_string(), v.to_string())
                    })
                    .collect();
                let cmd: Vec<String> = serde_json::from_str(cmd.trim())
                    .unwrap_or_else(|e| panic!("HEALTHCHECK CMD must be exec form: {e}"));
                stages.last_mut().unwrap().healthcheck = Some((opts, cmd));
            }
            _ => {}
        }
    }
    stages
}

/// The shell commands of a RUN instruction: `--mount` style flags removed,
/// split on `&&`, `;` and `||`.
fn commands(run: &str) -> Vec<String> {
    let words: Vec<&str> = run.split_whitespace().collect();
    let start = words.iter().position(|w| !w.starts_with("--")).unwrap_or(0);
    words[start..]
        .join(" ")
        .split("&&")
        .flat_map(|c| c.split(';'))
        .flat_map(|c| c.split("||"))
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|c| !c.is_empty())
        .collect()
}

/// The runtime (last) stage's config, its uid and the file it copies in.
fn image() -> (Stage, String) {
    let stages = dockerfile();
    assert!(stages.len() >= 2, "the Dockerfile is multi-stage");
    let rt = stages.into_iter().last().unwrap();
    let src = rt
        .copies
        .iter()
        .find(|(_, dst, _)| dst == IMAGE_CONFIG)
        .map(|(srcs, _, _)| srcs[0].clone())
        .unwrap_or_else(|| panic!("the runtime stage copies no config to {IMAGE_CONFIG}"));
    (rt, src)
}

fn image_uid() -> u32 {
    let (rt, _) = image();
    let user = rt.user.expect("the runtime stage sets USER");
    let uid: u32 =
        user.split(':').next().unwrap().parse().unwrap_or_else(|_| {
            panic!("USER {user}: use a numeric uid so runAsNonRoot can verify it")
        });
    assert_ne!(uid, 0, "the image runs as root");
    uid
}

fn config_dir() -> &'static str {
    Path::new(IMAGE_CONFIG).parent().unwrap().to_str().unwrap()
}

#[test]
fn the_image_is_built_with_the_command_ci_runs() {
    let stages = dockerfile();
    let builds: Vec<String> = stages
        .iter()
        .flat_map(|st| st.runs.iter().flat_map(|r| commands(r)))
        .filter(|c| c.starts_with("cargo build"))
        .collect();
    assert_eq!(
        builds.len(),
        1,
        "one cargo build in the Dockerfile: {builds:?}"
    );
    let build = &builds[0];
    assert_eq!(build, "cargo build --release --locked");
    let ci = read(".ci/run");
    let ci_lines: Vec<&str> = ci.lines().map(str::trim).collect();
    assert!(
        ci_lines.contains(&build.as_str()),
        ".ci/run does not run `{build}` as a line of its own"
    );
    assert!(ci_lines.contains(&"cargo test --locked"));

    // The builder is new enough for the crate's rust-version.
    let builder = &stages[0].from;
    let tag = builder.split(':').nth(1).unwrap_or("");
    let v: Vec<u32> = tag
        .split('-')
        .next()
        .unwrap()
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    let cargo: toml::Table = toml::from_str(&read("Cargo.toml")).unwrap();
    let msrv: Vec<u32> = cargo["package"]["rust-version"]
        .as_str()
        .unwrap()
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        builder.starts_with("rust:") && v >= msrv,
        "builder {builder} is older than rust-version {msrv:?}"
    );

    // The runtime stage takes the binary the build stage made.
    let (rt, _) = image();
    let build_stage = stages[0].name.clone().unwrap();
    let bin = rt
        .copies
        .iter()
        .find(|(_, _, from)| from.as_deref() == Some(build_stage.as_str()))
        .expect("the runtime stage copies the binary from the build stage");
    assert!(bin.1.ends_with("/weir"));
    assert!(stages[0]
        .runs
        .iter()
        .any(|r| r.contains("target/release/weir")));
}

/// `"1.88"`, `"1.85.0"` → comparable parts.
fn rust_version(v: &str) -> Vec<u32> {
    let mut parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
    parts.resize(3, 0);
    parts
}

/// Issue 32, item 8: which Rust builds weir is written once, as Cargo.toml's
/// `rust-version`; it is true of the locked dependencies (none of those in
/// the local registry cache, i.e. built here, asks for a newer Rust), and
/// README.md and CONTRIBUTING.md say it.
#[test]
fn the_rust_version_is_what_the_locked_dependencies_need_and_the_docs_say() {
    let cargo: toml::Table = toml::from_str(&read("Cargo.toml")).unwrap();
    let msrv = cargo["package"]["rust-version"].as_str().unwrap();
    for f in ["README.md", "CONTRIBUTING.md"] {
        let text = read(f);
        assert!(
            text.contains(&format!("Rust {msrv} or newer")),
            "{f} does not say weir builds with Rust {msrv} or newer"
        );
        for (i, _) in text.match_indices("Rust 1.") {
            let v: String = text[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            assert_eq!(v.trim_end_matches('.'), msrv, "{f} names Rust {v}");
        }
    }

    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap();
    let registries: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    let lock: toml::Table = toml::from_str(&read("Cargo.lock")).unwrap();
    let (mut checked, mut newer) = (BTreeSet::new(), Vec::new());
    for p in lock["package"].as_array().unwrap() {
        let (name, version) = (p["name"].as_str().unwrap(), p["version"].as_str().unwrap());
        for reg in &registries {
            let manifest = reg.join(format!("{name}-{version}/Cargo.toml"));
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let t: toml::Table = toml::from_str(&text).unwrap();
            checked.insert(name.to_string());
            if let Some(v) = t["package"].get("rust-version").and_then(|v| v.as_str()) {
                if rust_version(v) > rust_version(msrv) {
                    newer.push(format!("{name} {version} asks for Rust {v}"));
                }
            }
        }
    }
    assert!(
        newer.is_empty(),
        "Cargo.toml says rust-version {msrv}, but: {newer:?}"
    );
    if checked.is_empty() {
        eprintln!("SKIPPED: no crate of Cargo.lock in {}", home.display());
        return;
    }
    for built in ["tokio", "hyper", "rustls", "redis", "notify"] {
        assert!(
            checked.contains(built),
            "{built} not found in {}",
            home.display()
        );
    }
}

/// `.dockerignore` as an ordered list of (negated, pattern); the last match
/// wins. Patterns are `*`, or paths matching themselves and what is under them.
fn docker_ignored(rules: &[(bool, String)], path: &str) -> bool {
    let mut ignored = false;
    for (negated, pat) in rules {
        let pat = pat.trim_end_matches('/');
        let hit = pat == "*" || path == pat || path.starts_with(&format!("{pat}/"));
        if hit {
            ignored = !negated;
        }
    }
    ignored
}

#[test]
fn the_build_context_holds_what_the_dockerfile_copies_and_no_target_dir() {
    let rules: Vec<(bool, String)> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix('!') {
            Some(p) => (true, p.to_string()),
            None => (false, l.to_string()),
        })
        .collect();
    let mut sources = 0;
    for st in dockerfile() {
        for (srcs, _, from) in &st.copies {
            if from.is_some() {
                continue;
            }
            for src in srcs {
                let src = src.trim_start_matches("./").trim_end_matches('/');
                assert!(root().join(src).exists(), "COPY {src}: no such file");
                assert!(
                    !docker_ignored(&rules, src),
                    "COPY {src}: excluded by .dockerignore"
                );
                sources += 1;
            }
        }
    }
    assert!(sources >= 4, "Cargo.toml, Cargo.lock, src, the config");
    for must_go in ["target", "target/release/weir", ".git", "tests"] {
        assert!(
            docker_ignored(&rules, must_go),
            "{must_go} is sent to the build"
        );
    }
    // Everything cargo needs to build: the manifest's [[bench]] targets too.
    for needed in ["Cargo.toml", "Cargo.lock", "src/main.rs", "bench/micro"] {
        assert!(!docker_ignored(&rules, needed), "{needed} is not sent");
    }
}

#[test]
fn the_image_runs_weir_on_its_config_as_non_root_and_exposes_its_ports() {
    let (rt, src) = image();
    assert_eq!(
        rt.entrypoint.as_deref(),
        Some(&["weir", "run", "--config", IMAGE_CONFIG].map(String::from)[..])
    );
    image_uid();
    let cfg = load_config(&src);
    let mut want = vec![
        cfg.server.listen.tcp().unwrap().port(),
        cfg.server.admin.tcp().unwrap().port(),
    ];
    want.sort_unstable();
    let mut got = rt.expose.clone();
    got.sort_unstable();
    assert_eq!(got, want, "EXPOSE vs {src}'s listen and admin");
    assert!(
        cfg.server.admin.tcp().unwrap().ip().is_unspecified(),
        "{src}: admin must bind 0.0.0.0 for probes and scraping"
    );
}

/// The files the build stage's RUN commands name after `cargo build`, as
/// absolute paths (relative names resolved against each `cd`), per command.
fn build_steps(stage: &Stage) -> Vec<(String, Vec<String>)> {
    let mut cwd = "/src".to_string();
    let mut out = Vec::new();
    for run in &stage.runs {
        for c in commands(run) {
            let words: Vec<&str> = c.split_whitespace().collect();
            if words[0] == "cd" {
                cwd = words[1].to_string();
                continue;
            }
            let files = words[1..]
                .iter()
                .filter(|w| !w.starts_with('-'))
                .map(|w| match w.starts_with('/') {
                    true => w.to_string(),
                    false => format!("{cwd}/{w}"),
                })
                .collect();
            out.push((c.clone(), files));
        }
    }
    out
}

/// Issue 32, item 8: the image carries the release binary stripped (9.4 MB
/// rather than 47), its debug info split off into a file of its own, kept
/// out of the image and exported by a stage of its own.
#[test]
fn the_image_carries_a_stripped_binary_and_keeps_its_debug_info_apart() {
    let stages = dockerfile();
    let build = &stages[0];
    let build_name = build.name.clone().unwrap();
    let (rt, _) = image();
    let (bins, dst, _) = rt
        .copies
        .iter()
        .find(|(_, _, from)| from.as_deref() == Some(build_name.as_str()))
        .unwrap();
    assert!(dst.ends_with("/weir"));
    let shipped = &bins[0];
    let steps = build_steps(build);
    let at = |what: &str| {
        steps
            .iter()
            .position(|(c, _)| c.contains(what))
            .unwrap_or_else(|| panic!("no `{what}` in the build stage: {steps:?}"))
    };
    // Built, copied out, the debug info split off the copy, then stripped.
    let (built, keep, strip) = (
        at("cargo build"),
        at("objcopy --only-keep-debug"),
        at("objcopy --strip-all"),
    );
    assert!(built < keep && keep < strip, "{steps:?}");
    let install = &steps[at("target/release/weir")];
    assert_eq!(install.1.last(), Some(shipped), "{install:?}");
    let (_, kept) = &steps[keep];
    assert_eq!(
        kept[0], *shipped,
        "the debug info comes from the shipped binary"
    );
    let debug_file = kept[1].clone();
    let (strip_cmd, stripped) = &steps[strip];
    assert_eq!(stripped.last(), Some(shipped), "{strip_cmd}");
    let link = strip_cmd
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--add-gnu-debuglink="))
        .expect("the stripped binary names its debug file (.gnu_debuglink)");
    assert!(debug_file.ends_with(&format!("/{link}")));

    // The runtime stage copies nothing but the binary from the build; a
    // stage of its own holds the debug file.
    for (srcs, _, from) in &rt.copies {
        if from.is_some() {
            assert_eq!(srcs, std::slice::from_ref(shipped));
        }
    }
    let debug = stages
        .iter()
        .find(|st| {
            st.copies.iter().any(|(srcs, _, from)| {
                from.as_deref() == Some(build_name.as_str()) && srcs.contains(&debug_file)
            })
        })
        .expect("a stage exports the debug file");
    assert_eq!(debug.from, "scratch");
    assert!(debug.name.is_some(), "`docker build --target` names it");
}

/// `weir health` exactly as the image's HEALTHCHECK runs it, with the
/// image's config swapped for one naming where `admin` listens.
fn run_healthcheck(cmd: &[String], admin: SocketAddr, dir: &Path) -> bool {
    assert_eq!(cmd[..2], ["weir", "health"], "{cmd:?}");
    let cfg = dir.join("weir.toml");
    std::fs::write(&cfg, format!("[server]\nadmin = \"{admin}\"\n")).unwrap();
    let args: Vec<String> = cmd[1..]
        .iter()
        .map(|a| match a == IMAGE_CONFIG {
            true => cfg.display().to_string(),
            false => a.clone(),
        })
        .collect();
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(&args)
        .output()
        .unwrap()
        .status
        .success()
}

/// A health check's `weir health --timeout` fits inside the engine's own
/// timeout for it.
fn check_health_timeouts(cmd: &[String], engine_timeout: &str) {
    let i = cmd.iter().position(|a| a == "--timeout");
    let ours = i.map_or(std::time::Duration::from_secs(2), |i| {
        weir::config::duration::parse(&cmd[i + 1]).unwrap()
    });
    let engine = weir::config::duration::parse(engine_timeout).unwrap();
    assert!(
        ours < engine,
        "weir health --timeout {ours:?} >= {engine:?}"
    );
}

/// Issue 32, item 8: the image says when weir is ready — its HEALTHCHECK
/// runs `weir health` on the config the ENTRYPOINT runs (no curl in the
/// image), which passes against a running weir and fails without one.
#[tokio::test]
async fn the_image_health_check_asks_the_admin_listener_of_its_config() {
    let (rt_stage, src) = image();
    let (opts, cmd) = rt_stage.healthcheck.clone().expect("a HEALTHCHECK");
    assert!(cmd.iter().any(|a| a == IMAGE_CONFIG), "{cmd:?}");
    for o in ["interval", "timeout", "start-period", "retries"] {
        assert!(opts.contains_key(o), "HEALTHCHECK --{o}");
    }
    check_health_timeouts(&cmd, &opts["timeout"]);
    // What it reads from the image's config is where weir's admin listens.
    let cfg = load_config(&src);
    let admin = weir::cli::health::admin_of(&root().join(&src)).unwrap();
    assert_eq!(admin, cfg.server.admin.tcp().unwrap());
    assert!(weir::cli::health::target(admin).ip().is_loopback());

    let (rt, _up, dir) = weir_with_traffic().await;
    let checks = tempfile::tempdir().unwrap();
    let (c, a, d) = (cmd.clone(), rt.admin_addr, checks.path().to_path_buf());
    let ok = tokio::task::spawn_blocking(move || run_healthcheck(&c, a, &d))
        .await
        .unwrap();
    assert!(ok, "{cmd:?} fails against a running weir");
    rt.shutdown(std::time::Duration::from_millis(100)).await;
    drop(rt);
    drop(dir);
    let (c, d) = (cmd.clone(), checks.path().to_path_buf());
    let ok = tokio::task::spawn_blocking(move || run_healthcheck(&c, a, &d))
        .await
        .unwrap();
    assert!(!ok, "{cmd:?} passes with no weir running");
}

// ---------------------------------------------------------------------------
// Kubernetes.

fn find<'a>(items: &'a Yaml, name: &str) -> Option<&'a Yaml> {
    seq(items)
        .iter()
        .find(|c| c.get("name").and_then(Yaml::as_str) == Some(name))
}

/// A probe's or port's port, by number or by the container port's name.
fn port_of(container: &Yaml, port: &Yaml) -> u16 {
    match port {
        Yaml::Number(n) => u16::try_from(n.as_u64().unwrap()).unwrap(),
        Yaml::String(name) => {
            let p = find(at(container, &["ports"]), name)
                .unwrap_or_else(|| panic!("no container port named {name}"));
            u16::try_from(at(p, &["containerPort"]).as_u64().unwrap()).unwrap()
        }
        other => panic!("bad port {other:?}"),
    }
}

fn reachable_on_localhost(a: SocketAddr) -> bool {
    a.ip().is_loopback() || a.ip().is_unspecified()
}

fn data_ports(cfg: &Config) -> BTreeSet<u16> {
    let mut ports: BTreeSet<u16> = cfg
        .upstreams
        .iter()
        .filter_map(|u| u.listen.and_then(|l| l.tcp()))
        .inspect(|a| assert!(reachable_on_localhost(*a), "{a} is not on localhost"))
        .map(|a| a.port())
        .collect();
    assert!(reachable_on_localhost(cfg.server.listen.tcp().unwrap()));
    ports.insert(cfg.server.listen.tcp().unwrap().port());
    ports
}

fn localhost_port(v: &str) -> Option<u16> {
    let rest = v.strip_prefix("http://localhost:")?;
    let p: String = rest.chars().take_while(char::is_ascii_digit).collect();
    p.parse().ok()
}

#[test]
fn kubernetes_manifests_agree_with_the_image_and_the_config_they_mount() {
    let kust = yaml("deploy/kubernetes/kustomization.yaml");
    let resources = strings(at(&kust, &["resources"]));
    for r in &resources {
        assert!(root().join("deploy/kubernetes").join(r).exists(), "{r}");
    }
    for r in [
        "configmap.yaml",
        "deployment.yaml",
        "upstreams.yaml",
        "redis.yaml",
    ] {
        assert!(resources.contains(&r.to_string()), "{r}");
    }

    let (cm_name, cm_key, cm_src) = configmap();
    let cfg = parse_config(&cm_key, &cm_src);
    let admin = cfg.server.admin.tcp().unwrap();
    assert!(
        admin.ip().is_unspecified(),
        "admin {admin}: kubelet probes and Prometheus come from outside the pod's loopback"
    );

    let dep = yaml("deploy/kubernetes/deployment.yaml");
    assert_eq!(s(at(&dep, &["kind"])), "Deployment");
    let labels = at(&dep, &["spec", "selector", "matchLabels"]);
    let tpl = at(&dep, &["spec", "template"]);
    for (k, v) in labels.as_mapping().unwrap() {
        assert_eq!(at(tpl, &["metadata", "labels"]).get(k), Some(v), "selector");
    }
    let pod = at(tpl, &["spec"]);

    // A fleet rate limit's fallback share is the Deployment's replicas'.
    if cfg.state.redis_url().is_some() {
        let replicas = at(&dep, &["spec", "replicas"]).as_u64().unwrap();
        for u in &cfg.upstreams {
            if let Some(r) = u.rate_limit.as_ref() {
                if r.scope == weir::policy::Scope::Fleet {
                    assert_eq!(
                        r.expected_instances.map(u64::from),
                        Some(replicas),
                        "{}: expected_instances vs spec.replicas",
                        u.name
                    );
                }
            }
        }
    }

    // weir is a native sidecar running the image built from this repository.
    let weir = find(at(pod, &["initContainers"]), "weir").expect("an init container `weir`");
    assert_eq!(s(at(weir, &["restartPolicy"])), "Always", "native sidecar");
    let cargo: toml::Table = toml::from_str(&read("Cargo.toml")).unwrap();
    let version = cargo["package"]["version"].as_str().unwrap();
    assert_eq!(s(at(weir, &["image"])), format!("weir:{version}"));
    assert!(
        weir.get("command").is_none() && weir.get("args").is_none(),
        "the image's ENTRYPOINT runs weir on {IMAGE_CONFIG}"
    );

    // The ConfigMap is mounted, as a directory, where the image reads it.
    let (image_dir, image_file) = IMAGE_CONFIG.rsplit_once('/').unwrap();
    assert_eq!(cm_key, image_file);
    let mounts = seq(at(weir, &["volumeMounts"]));
    let mount = mounts
        .iter()
        .find(|m| s(at(m, &["mountPath"])) == image_dir)
        .unwrap_or_else(|| panic!("nothing mounted at {image_dir}"));
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap edits"
    );
    let vol = find(at(pod, &["volumes"]), s(at(mount, &["name"]))).unwrap();
    assert_eq!(s(at(vol, &["configMap", "name"])), cm_name);

    // Probes and the scrape port are the admin listener's.
    let probe_port = |kind: &str, path: &str| {
        let p = at(weir, &[kind, "httpGet"]);
        assert_eq!(s(at(p, &["path"])), path, "{kind}");
        assert_eq!(port_of(weir, at(p, &["port"])), admin.port(), "{kind}");
    };
    probe_port("readinessProbe", "/readyz");
    probe_port("startupProbe", "/readyz");
    probe_port("livenessProbe", "/healthz");
    let ann = at(tpl, &["metadata", "annotations"]);
    assert_eq!(s(at(ann, &["prometheus.io/scrape"])), "true");
    assert_eq!(s(at(ann, &["prometheus.io/path"])), "/metrics");
    assert_eq!(
        s(at(ann, &["prometheus.io/port"])),
        admin.port().to_string()
    );
    let declared: Vec<u16> = seq(at(weir, &["ports"]))
        .iter()
        .map(|p| port_of(weir, at(p, &["containerPort"])))
        .collect();
    assert!(declared.contains(&admin.port()));
    let (image_rt, _) = image();
    assert!(image_rt.expose.contains(&admin.port()));

    // The application calls weir on localhost, on a port weir listens on.
    let data = data_ports(&cfg);
    let apps = seq(at(pod, &["containers"]));
    let mut calls = 0;
    for app in apps {
        for e in app.get("env").map(seq).into_iter().flatten() {
            if let Some(port) = e
                .get("value")
                .and_then(Yaml::as_str)
                .and_then(localhost_port)
            {
                assert!(data.contains(&port), "{e:?}: weir listens on {data:?}");
                calls += 1;
            }
        }
    }
    assert!(calls >= 1, "the example app reaches weir on localhost");

    // Draining fits in the grace period.
    let grace = at(pod, &["terminationGracePeriodSeconds"])
        .as_u64()
        .unwrap();
    assert!(
        grace > cfg.server.shutdown_timeout.as_secs(),
        "terminationGracePeriodSeconds {grace} <= shutdown_timeout {:?}",
        cfg.server.shutdown_timeout
    );

    // Restrictive security context, as the image's user.
    let psc = at(pod, &["securityContext"]);
    let uid = image_uid();
    assert_eq!(at(psc, &["runAsUser"]).as_u64(), Some(u64::from(uid)));
    for c in std::iter::once(weir).chain(apps) {
        let sc = at(c, &["securityContext"]);
        let non_root = sc
            .get("runAsNonRoot")
            .or(psc.get("runAsNonRoot"))
            .and_then(Yaml::as_bool);
        assert_eq!(non_root, Some(true), "runAsNonRoot");
        assert_eq!(at(sc, &["readOnlyRootFilesystem"]).as_bool(), Some(true));
        assert_eq!(at(sc, &["allowPrivilegeEscalation"]).as_bool(), Some(false));
        assert!(strings(at(sc, &["capabilities", "drop"])).contains(&"ALL".to_string()));
    }
    let req = at(weir, &["resources", "requests"]);
    assert!(req.get("cpu").is_some() && req.get("memory").is_some());
    assert!(at(weir, &["resources", "limits"]).get("memory").is_some());

    // The cluster scrape config keys on exactly these annotations.
    let prom = yaml("deploy/prometheus/kubernetes.yml");
    let mut used = BTreeSet::new();
    for job in seq(at(&prom, &["scrape_configs"])) {
        for rl in seq(at(job, &["relabel_configs"])) {
            for l in rl.get("source_labels").map(strings).into_iter().flatten() {
                if let Some(a) = l.strip_prefix("__meta_kubernetes_pod_annotation_") {
                    used.insert(a.to_string());
                }
            }
        }
    }
    let set: BTreeSet<String> = ann
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| s(k).replace(['.', '/', '-'], "_"))
        .collect();
    assert!(!used.is_empty());
    assert!(used.is_subset(&set), "{used:?} vs the pod's {set:?}");
}

/// Every document of every resource of the kustomization in `dir`.
fn kustomized(dir: &str) -> Vec<Yaml> {
    let kust = yaml(&format!("{dir}/kustomization.yaml"));
    strings(at(&kust, &["resources"]))
        .iter()
        .flat_map(|r| yaml_docs(&format!("{dir}/{r}")))
        .collect()
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|d| d.get("kind").and_then(Yaml::as_str) == Some(kind))
        .collect()
}

/// Whether every label of `selector` is on `labels`.
fn selects(selector: &Yaml, labels: &Yaml) -> bool {
    let sel = selector.as_mapping().unwrap();
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The containers (init containers included) of a pod template's spec.
fn containers(pod: &Yaml) -> Vec<&Yaml> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod.get(*k))
        .flat_map(seq)
        .collect()
}

/// Issue 32, item 8: `kubectl apply -k deploy/kubernetes/` runs as shipped.
/// Every host the weir config calls — each upstream's and the Redis it
/// shares state through — is a Service of the kustomization, on the URL's
/// port, selecting the pods of one of its Deployments, whose container
/// listens on the port the Service sends to; those pods are locked down
/// like weir's.
#[test]
fn the_kubernetes_example_includes_every_service_its_config_calls() {
    let docs = kustomized("deploy/kubernetes");
    let (_, key, src) = configmap();
    let cfg = parse_config(&key, &src);
    let mut calls: Vec<(String, u16)> = cfg
        .upstreams
        .iter()
        .map(|u| (u.url.host.clone(), u.url.port))
        .collect();
    if let Some(url) = cfg.state.redis_url() {
        let authority = url
            .strip_prefix("redis://")
            .unwrap()
            .split('/')
            .next()
            .unwrap();
        let authority = authority.rsplit('@').next().unwrap();
        let (h, p) = authority.rsplit_once(':').unwrap();
        calls.push((h.to_string(), p.parse().unwrap()));
    }
    assert!(calls.len() >= 3, "payments, inventory and redis: {calls:?}");
    let services = of_kind(&docs, "Service");
    let deployments = of_kind(&docs, "Deployment");
    for (host, port) in &calls {
        let svc = services
            .iter()
            .find(|d| s(at(d, &["metadata", "name"])) == host)
            .unwrap_or_else(|| {
                panic!("the config calls {host}: no Service {host} in the kustomization")
            });
        let sp = seq(at(svc, &["spec", "ports"]))
            .iter()
            .find(|p| at(p, &["port"]).as_u64() == Some(u64::from(*port)))
            .unwrap_or_else(|| panic!("Service {host} has no port {port}"));
        let target = sp.get("targetPort").unwrap_or(at(sp, &["port"]));
        let selector = at(svc, &["spec", "selector"]);
        let dep = deployments
            .iter()
            .find(|d| selects(selector, at(d, &["spec", "template", "metadata", "labels"])))
            .unwrap_or_else(|| panic!("Service {host} selects no Deployment's pods"));
        let pod = at(dep, &["spec", "template", "spec"]);
        let listening = containers(pod).into_iter().find_map(|c| {
            let declared = c.get("ports").map(seq)?.iter().find(|p| match target {
                Yaml::String(name) => p.get("name").and_then(Yaml::as_str) == Some(name),
                n => at(p, &["containerPort"]) == n,
            })?;
            Some((c, at(declared, &["containerPort"]).as_u64().unwrap()))
        });
        let (c, container_port) =
            listening.unwrap_or_else(|| panic!("Service {host}: no container port {target:?}"));
        // A weir chaos upstream listens where it says it does.
        let mut cmd = c.get("command").map(strings).unwrap_or_default();
        cmd.extend(c.get("args").map(strings).unwrap_or_default());
        if let Some(l) = listen_arg(&cmd) {
            assert!(
                l.ip().is_unspecified(),
                "{host}: {l} is not reachable from other pods"
            );
            assert_eq!(u64::from(l.port()), container_port, "{host}: --listen");
        }
    }
    // Every pod of the example is locked down as weir's is.
    for dep in &deployments {
        let pod = at(dep, &["spec", "template", "spec"]);
        let name = s(at(dep, &["metadata", "name"]));
        let psc = at(pod, &["securityContext"]);
        assert_eq!(at(psc, &["runAsNonRoot"]).as_bool(), Some(true), "{name}");
        for c in containers(pod) {
            let sc = at(c, &["securityContext"]);
            assert_eq!(
                at(sc, &["readOnlyRootFilesystem"]).as_bool(),
                Some(true),
                "{name}"
            );
            assert_eq!(
                at(sc, &["allowPrivilegeEscalation"]).as_bool(),
                Some(false),
                "{name}"
            );
            assert!(strings(at(sc, &["capabilities", "drop"])).contains(&"ALL".to_string()));
            assert!(
                at(c, &["resources", "limits"]).get("memory").is_some(),
                "{name}"
            );
        }
    }
}

/// `kubectl kustomize` builds both kustomizations, where kubectl is
/// installed (it needs no cluster).
#[test]
fn kubectl_kustomize_builds_the_examples() {
    if !Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: kubectl is not installed");
        return;
    }
    for dir in ["deploy/kubernetes", "deploy/kubernetes/monitoring"] {
        let out = Command::new("kubectl")
            .args(["kustomize", dir])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 32, item 8: a PodMonitor for the Prometheus Operator scrapes the
/// orders pods' weir on its admin port and `/metrics`, with the labels the
/// dashboard and the alerts group by; it stays out of the main
/// kustomization, which must apply on a cluster without the operator.
#[test]
fn the_pod_monitor_scrapes_the_sidecars_admin_listener() {
    let docs = kustomized("deploy/kubernetes/monitoring");
    let pm = of_kind(&docs, "PodMonitor");
    assert_eq!(pm.len(), 1);
    let pm = pm[0];
    assert_eq!(s(at(pm, &["apiVersion"])), "monitoring.coreos.com/v1");
    assert!(of_kind(&kustomized("deploy/kubernetes"), "PodMonitor").is_empty());

    let (_, key, src) = configmap();
    let admin = parse_config(&key, &src).server.admin.tcp().unwrap();
    let dep = yaml("deploy/kubernetes/deployment.yaml");
    let tpl = at(&dep, &["spec", "template"]);
    assert!(selects(
        at(pm, &["spec", "selector", "matchLabels"]),
        at(tpl, &["metadata", "labels"])
    ));
    let weir_c = find(at(tpl, &["spec", "initContainers"]), "weir").unwrap();
    let endpoints = seq(at(pm, &["spec", "podMetricsEndpoints"]));
    assert_eq!(endpoints.len(), 1);
    let ep = &endpoints[0];
    assert_eq!(s(at(ep, &["path"])), "/metrics");
    assert_eq!(
        port_of(weir_c, at(ep, &["port"])),
        admin.port(),
        "the admin port"
    );
    // namespace, pod, job and instance come with every PodMonitor target;
    // `app` is copied from the pod's labels.
    let copied = strings(at(pm, &["spec", "podTargetLabels"]));
    for l in TARGET_LABELS {
        if !["job", "instance", "namespace", "pod"].contains(&l) {
            assert!(copied.contains(&l.to_string()), "podTargetLabels lacks {l}");
            assert!(
                at(tpl, &["metadata", "labels"]).get(l).is_some(),
                "the pod has no {l}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Compose.

/// A bind mount `SRC:DST[:ro]` of a service, `SRC` relative to deploy/compose.
fn mounts(svc: &Yaml) -> Vec<(PathBuf, String)> {
    svc.get("volumes")
        .map(strings)
        .unwrap_or_default()
        .iter()
        .map(|v| {
            let mut parts = v.split(':');
            let src = parts.next().unwrap();
            let dst = parts.next().unwrap().to_string();
            assert!(src.starts_with('.'), "{v}: bind mounts are relative");
            let p = root().join("deploy/compose").join(src);
            assert!(p.exists(), "{v}: {} does not exist", p.display());
            (p, dst)
        })
        .collect()
}

/// The host file a container path of `svc` maps to.
fn host_file(svc: &Yaml, container_path: &str) -> PathBuf {
    for (src, dst) in mounts(svc) {
        if let Some(rest) = container_path.strip_prefix(&dst) {
            return src.join(rest.trim_start_matches('/'));
        }
    }
    panic!("{container_path} is not mounted")
}

/// `--listen ADDR` in a command line.
fn listen_arg(cmd: &[String]) -> Option<SocketAddr> {
    let i = cmd.iter().position(|a| a == "--listen")?;
    cmd.get(i + 1).map(|a| a.parse().unwrap())
}

fn command_line(svc: &Yaml) -> Vec<String> {
    let mut v = svc.get("entrypoint").map(strings).unwrap_or_default();
    v.extend(svc.get("command").map(strings).unwrap_or_default());
    v
}

/// An application beside a weir replica calls it on localhost, on a port
/// weir listens on, with Host fields some upstream routes.
fn check_compose_app(app: &Yaml, cfg: &Config, data: &BTreeSet<u16>) {
    let env = at(app, &["environment"]).as_mapping().unwrap();
    let urls: Vec<u16> = env
        .values()
        .filter_map(|v| v.as_str().and_then(localhost_port))
        .collect();
    assert!(!urls.is_empty());
    for p in urls {
        assert!(
            data.contains(&p),
            "app calls localhost:{p}; weir listens on {data:?}"
        );
    }
    // Every Host the app sends is routed.
    let script = command_line(app).join("\n");
    let sent: Vec<&str> = script
        .split("-H 'Host: ")
        .skip(1)
        .map(|h| h.split('\'').next().unwrap())
        .collect();
    assert!(!sent.is_empty());
    for h in sent {
        assert!(
            cfg.upstreams
                .iter()
                .any(|u| u.hosts.iter().any(|p| p.matches(&h.to_ascii_lowercase()))),
            "the app sends Host {h}, which no upstream routes"
        );
    }
}

/// The weir replicas of the Compose file: the services built from this
/// repository that run the image's ENTRYPOINT (`weir run`), by name.
fn compose_replicas(services: &Yaml) -> Vec<(String, &Yaml)> {
    services
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, v)| {
            v.get("build").is_some() && v.get("entrypoint").is_none() && v.get("command").is_none()
        })
        .map(|(k, v)| (s(k).to_string(), v))
        .collect()
}

#[test]
fn compose_agrees_with_the_image_and_the_config_it_mounts() {
    let c = yaml("deploy/compose/compose.yaml");
    let services = at(&c, &["services"]);
    let svc = |n: &str| at(services, &[n]);
    let weir = svc("weir");
    let replicas = compose_replicas(services);
    assert!(
        replicas.iter().any(|(n, _)| n == "weir"),
        "the service `weir` runs weir"
    );
    assert!(
        replicas.len() >= 2,
        "two weir replicas share state: {:?}",
        replicas.iter().map(|r| &r.0).collect::<Vec<_>>()
    );

    let toml_path = host_file(weir, IMAGE_CONFIG);
    let cfg = parse_config(
        "compose weir.toml",
        &std::fs::read_to_string(&toml_path).unwrap(),
    );
    let admin = cfg.server.admin.tcp().unwrap();
    assert!(
        admin.ip().is_unspecified(),
        "Prometheus scrapes from another container"
    );
    let data = data_ports(&cfg);
    let mut host_ports = BTreeSet::new();
    for (name, replica) in &replicas {
        // Built from this repository's Dockerfile, config mounted where the
        // image reads it: the same file for every replica.
        let ctx = root()
            .join("deploy/compose")
            .join(s(at(replica, &["build", "context"])));
        assert_eq!(ctx.canonicalize().unwrap(), root().canonicalize().unwrap());
        assert_eq!(s(at(replica, &["build", "dockerfile"])), "Dockerfile");
        assert_eq!(
            s(at(replica, &["image"])),
            s(at(weir, &["image"])),
            "{name}"
        );
        assert!(
            mounts(replica).iter().any(|(_, d)| d == config_dir()),
            "{name}: mount a directory at {} so edits reload",
            config_dir()
        );
        assert_eq!(
            host_file(replica, IMAGE_CONFIG).canonicalize().unwrap(),
            toml_path.canonicalize().unwrap(),
            "{name}: every replica runs the same config"
        );
        // The admin port is published, each replica's on a host port of its own.
        let published: Vec<String> = strings(at(replica, &["ports"]));
        let admin_on = published
            .iter()
            .find(|p| p.rsplit(':').next() == Some(&admin.port().to_string()))
            .unwrap_or_else(|| {
                panic!(
                    "{name}: admin port {} published: {published:?}",
                    admin.port()
                )
            });
        let host_port = admin_on.rsplit(':').nth(1).unwrap().to_string();
        assert!(
            host_ports.insert(host_port.clone()),
            "{name}: host port {host_port} published twice"
        );

        // An application shares the replica's network namespace and calls
        // it on localhost.
        let mode = format!("service:{name}");
        let apps: Vec<&Yaml> = services
            .as_mapping()
            .unwrap()
            .values()
            .filter(|v| v.get("network_mode").and_then(Yaml::as_str) == Some(mode.as_str()))
            .collect();
        assert!(!apps.is_empty(), "no application beside {name}");
        for app in apps {
            check_compose_app(app, &cfg, &data);
        }
    }
    assert_eq!(s(at(svc("app"), &["network_mode"])), "service:weir");

    // The shared state: a Redis service of this file, on the URL's port,
    // persisting nothing; fleet rate limits expect as many instances as
    // there are replicas.
    if let Some(url) = cfg.state.redis_url() {
        let authority = url
            .strip_prefix("redis://")
            .unwrap_or_else(|| panic!("{url}: the demo's Redis is plain redis://"))
            .split('/')
            .next()
            .unwrap();
        let (host, port) = authority.rsplit_once(':').unwrap();
        assert_eq!(port, "6379", "{url}: the redis image listens on 6379");
        let redis = svc(host);
        assert!(s(at(redis, &["image"])).starts_with("redis:"), "{host}");
        let cmd = command_line(redis);
        for pair in [["--save", ""], ["--appendonly", "no"]] {
            assert!(
                cmd.windows(2).any(|w| w == pair),
                "{host}: {pair:?} not in {cmd:?}"
            );
        }
        for u in &cfg.upstreams {
            if let Some(r) = u.rate_limit.as_ref() {
                if r.scope == weir::policy::Scope::Fleet {
                    assert_eq!(
                        r.expected_instances,
                        Some(u32::try_from(replicas.len()).unwrap()),
                        "{}: expected_instances vs the replicas",
                        u.name
                    );
                }
            }
        }
    }

    // Every upstream is a chaos service of this file, on the port it listens on.
    for u in &cfg.upstreams {
        let s_ = svc(&u.url.host);
        let cmd = command_line(s_);
        assert_eq!(cmd[..3], ["weir", "chaos", "upstream"], "{}", u.url.host);
        assert!(cmd.contains(&"--profile".to_string()));
        assert_eq!(listen_arg(&cmd).map(|a| a.port()), Some(u.url.port));
        assert_eq!(s(at(s_, &["image"])), s(at(weir, &["image"])));
    }

    // Prometheus scrapes weir's admin port, with the repository's rules.
    let prom = svc("prometheus");
    let cmd = command_line(prom);
    let cfg_path = cmd
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .unwrap();
    let prom_file = host_file(prom, cfg_path);
    assert_eq!(
        prom_file.canonicalize().unwrap(),
        root()
            .join("deploy/prometheus/prometheus.yml")
            .canonicalize()
            .unwrap()
    );
    let pcfg = yaml("deploy/prometheus/prometheus.yml");
    for r in strings(at(&pcfg, &["rule_files"])) {
        assert!(prom_file.parent().unwrap().join(&r).exists(), "{r}");
    }
    let job = &seq(at(&pcfg, &["scrape_configs"]))[0];
    assert_eq!(s(at(job, &["metrics_path"])), "/metrics");
    let targets: BTreeSet<String> =
        strings(at(&seq(at(job, &["static_configs"]))[0], &["targets"]))
            .into_iter()
            .collect();
    let want: BTreeSet<String> = replicas
        .iter()
        .map(|(n, _)| format!("{n}:{}", admin.port()))
        .collect();
    assert_eq!(targets, want, "Prometheus scrapes every replica");

    // Grafana: the datasource is this Prometheus, the dashboard is provisioned.
    let graf = svc("grafana");
    let ds = yaml("deploy/compose/grafana/provisioning/datasources/prometheus.yml");
    let ds_url = s(at(&seq(at(&ds, &["datasources"]))[0], &["url"]));
    let (h, p) = host_port(ds_url);
    assert!(services.get(h.as_str()).is_some(), "{ds_url}");
    assert_eq!(p, 9090);
    assert!(host_file(graf, "/etc/grafana/provisioning/datasources")
        .join("prometheus.yml")
        .exists());
    let dp = yaml("deploy/compose/grafana/provisioning/dashboards/weir.yml");
    let dash_dir = s(at(&seq(at(&dp, &["providers"]))[0], &["options", "path"]));
    let dash = host_file(graf, &format!("{dash_dir}/weir.json"));
    assert_eq!(
        dash.canonicalize().unwrap(),
        root()
            .join("deploy/grafana/weir.json")
            .canonicalize()
            .unwrap()
    );
    let home = s(at(
        graf,
        &["environment", "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"],
    ));
    assert!(host_file(graf, home).exists(), "{home}");
}

/// Issue 32, item 8: in the Compose file each application starts once its
/// weir is healthy (`weir health`, as the image's HEALTHCHECK), and each weir
/// is given longer than its `shutdown_timeout` to drain before it is killed.
/// The services that run the image for something else switch its health
/// check off.
#[test]
fn compose_starts_apps_once_weir_is_healthy_and_lets_weir_drain() {
    let c = yaml("deploy/compose/compose.yaml");
    let services = at(&c, &["services"]);
    let (rt_stage, _) = image();
    let (_, image_check) = rt_stage.healthcheck.expect("the image has a HEALTHCHECK");
    let replicas = compose_replicas(services);
    assert!(replicas.len() >= 2);
    for (name, replica) in &replicas {
        let cfg = parse_config(
            name,
            &std::fs::read_to_string(host_file(replica, IMAGE_CONFIG)).unwrap(),
        );
        // Healthy when weir answers /readyz, asked as the image asks it.
        let hc = at(replica, &["healthcheck"]);
        let test = strings(at(hc, &["test"]));
        assert_eq!(test[0], "CMD", "{name}: exec form (the image has no shell)");
        assert_eq!(test[1..], image_check[..], "{name}: the image's own check");
        check_health_timeouts(&test[1..], s(at(hc, &["timeout"])));
        for k in ["interval", "start_period", "retries"] {
            assert!(hc.get(k).is_some(), "{name}: healthcheck.{k}");
        }
        // Drains inside the grace Compose gives it.
        let grace = weir::config::duration::parse(s(at(replica, &["stop_grace_period"]))).unwrap();
        assert!(
            grace > cfg.server.shutdown_timeout,
            "{name}: stop_grace_period {grace:?} <= shutdown_timeout {:?}",
            cfg.server.shutdown_timeout
        );
        // Its application waits for it to be healthy.
        let mode = format!("service:{name}");
        for (app_name, app) in services.as_mapping().unwrap() {
            if app.get("network_mode").and_then(Yaml::as_str) != Some(mode.as_str()) {
                continue;
            }
            let dep = at(app, &["depends_on", name.as_str()]);
            assert_eq!(
                s(at(dep, &["condition"])),
                "service_healthy",
                "{app_name:?} starts before {name} is ready"
            );
        }
    }
    // Services running the image for something other than `weir run` have
    // no admin listener: the image's health check is switched off.
    let image_name = s(at(at(services, &["weir"]), &["image"]));
    for (svc_name, svc) in services.as_mapping().unwrap() {
        let runs_image = svc.get("image").and_then(Yaml::as_str) == Some(image_name);
        if runs_image && svc.get("entrypoint").is_some() {
            assert_eq!(
                at(svc, &["healthcheck", "disable"]).as_bool(),
                Some(true),
                "{svc_name:?}: the image's health check cannot pass"
            );
        }
    }
}

/// `docker compose config` accepts the Compose file, where Docker Compose
/// v2 is installed (it needs no daemon).
#[test]
fn docker_compose_accepts_the_compose_file() {
    let present = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        eprintln!("SKIPPED: `docker compose` is not installed");
        return;
    }
    let out = Command::new("docker")
        .args([
            "compose",
            "-f",
            "deploy/compose/compose.yaml",
            "config",
            "--quiet",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker compose config:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// The dashboard and the alerts query what weir exports.

/// A metric name in a query, and its label matchers (name, op, value).
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// Every `weir_*` selector in a PromQL expression.
fn selectors(expr: &str) -> Vec<Selector> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = expr[i..].starts_with("weir_") && (i == 0 || !ident(b[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && ident(b[j]) {
            j += 1;
        }
        let name = expr[i..j].to_string();
        let mut matchers = Vec::new();
        let mut k = j;
        while k < b.len() && b[k] == b' ' {
            k += 1;
        }
        if k < b.len() && b[k] == b'{' {
            k += 1;
            loop {
                while k < b.len() && (b[k] == b' ' || b[k] == b',') {
                    k += 1;
                }
                if b[k] == b'}' {
                    k += 1;
                    break;
                }
                let l0 = k;
                while ident(b[k]) {
                    k += 1;
                }
                let label = expr[l0..k].trim().to_string();
                while b[k] == b' ' {
                    k += 1;
                }
                let o0 = k;
                while matches!(b[k], b'=' | b'!' | b'~') {
                    k += 1;
                }
                let op = expr[o0..k].to_string();
                while b[k] == b' ' {
                    k += 1;
                }
                assert_eq!(b[k], b'"', "{expr}: matcher value must be quoted");
                let v0 = k + 1;
                k = v0;
                while b[k] != b'"' {
                    k += 1;
                }
                matchers.push((label, op, expr[v0..k].to_string()));
                k += 1;
            }
        }
        out.push(Selector { name, matchers });
        i = k.max(j);
    }
    out
}

/// What a `/metrics` page exports: family → (type, label → values seen).
type Families = BTreeMap<String, (String, BTreeMap<String, BTreeSet<String>>)>;

fn families(text: &str) -> Families {
    let mut fams: Families = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap();
            fams.entry(name.to_string()).or_default().0 = ty.to_string();
        }
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap();
        let sample = &line[..name_end];
        let family = if fams.contains_key(sample) {
            sample.to_string()
        } else {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suf| sample.strip_suffix(suf))
                .filter(|base| fams.get(*base).is_some_and(|f| f.0 == "histogram"))
                .unwrap_or_else(|| panic!("sample {sample} has no # TYPE"))
                .to_string()
        };
        let labels = &mut fams.get_mut(&family).unwrap().1;
        if line.as_bytes()[name_end] == b'{' {
            let body = &line[name_end + 1..line.rfind('}').unwrap()];
            for pair in body.split("\",") {
                let (k, v) = pair.split_once("=\"").unwrap();
                labels
                    .entry(k.to_string())
                    .or_default()
                    .insert(v.trim_end_matches('"').to_string());
            }
        }
    }
    fams
}

/// Checks one selector against the scrape; returns the family it names.
fn check_selector(fams: &Families, sel: &Selector, whence: &str) -> String {
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suf| sel.name.strip_suffix(suf))
        .filter(|b| fams.get(*b).is_some_and(|f| f.0 == "histogram"));
    let family = match base {
        Some(b) => b.to_string(),
        None => sel.name.clone(),
    };
    let Some((ty, labels)) = fams.get(&family) else {
        panic!("{whence}: `{}` is not in weir's /metrics", sel.name)
    };
    if ty == "histogram" {
        assert!(
            base.is_some(),
            "{whence}: query a histogram as {family}_bucket/_sum/_count"
        );
    }
    for (label, op, value) in &sel.matchers {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        let seen = labels
            .get(label)
            .unwrap_or_else(|| panic!("{whence}: {family} has no label `{label}`"));
        if op == "=" && !value.contains('$') {
            assert!(
                seen.contains(value),
                "{whence}: {family}{{{label}=\"{value}\"}} is never exported (seen: {seen:?})"
            );
        }
    }
    family
}

/// Every PromQL expression of the dashboard (panels, nested panels, template
/// variables), with where it is.
fn dashboard_exprs(d: &serde_json::Value) -> Vec<(String, String)> {
    fn panels(ps: &serde_json::Value, out: &mut Vec<(String, String)>, ids: &mut BTreeSet<u64>) {
        for p in ps.as_array().into_iter().flatten() {
            let id = p["id"].as_u64().expect("every panel has an id");
            assert!(ids.insert(id), "duplicate panel id {id}");
            let title = p["title"].as_str().unwrap_or("").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
                out.push((
                    format!("panel {title:?}"),
                    t["expr"].as_str().unwrap().to_string(),
                ));
            }
            panels(&p["panels"], out, ids);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out, &mut BTreeSet::new());
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap();
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.rsplit_once(','))
                .map(|(sel, _)| sel)
                .unwrap_or(q);
            out.push((format!("variable {}", v["name"]), inner.to_string()));
        }
    }
    out
}

fn alert_rules() -> Vec<(String, String, Vec<String>)> {
    let rules = yaml("deploy/prometheus/alerts.yml");
    let mut out = Vec::new();
    for g in seq(at(&rules, &["groups"])) {
        for r in seq(at(g, &["rules"])) {
            let name = r.get("alert").or(r.get("record")).map(scalar).unwrap();
            let texts = r
                .get("annotations")
                .and_then(Yaml::as_mapping)
                .map(|m| m.values().map(|v| s(v).to_string()).collect())
                .unwrap_or_default();
            out.push((name, s(at(r, &["expr"])).to_string(), texts));
        }
    }
    out
}

/// weir started from a config file, in front of an upstream that fails every
/// third request with 503 (often enough for retries, not for the breaker), so
/// the scrape has retries in it; with a rate limit that never refuses, as
/// `weir_rate_limited_total` exists only for an upstream that has one.
async fn weir_with_traffic() -> (Runtime, TestUpstream, tempfile::TempDir) {
    let n = Arc::new(AtomicUsize::new(0));
    let up = TestUpstream::start(move |_req| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut r = Response::new(body("ok"));
            if i % 3 == 0 {
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n\
             [upstreams.svc.retry.backoff]\nbase = \"1ms\"\nmax = \"2ms\"\n\
             [upstreams.svc.rate_limit]\nrps = 100000.0\n",
            up.url()
        ),
    )
    .unwrap();
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let rt = Runtime::start(
        config,
        Options {
            watch: false,
            sighup: false,
            workers: 0,
        },
    )
    .await
    .unwrap();
    let c = client();
    for i in 0..6 {
        let url = format!("http://{}/x/{i}", rt.proxy.listen_addr());
        let (parts, b) = read_body(get(&c, &url, "svc").await).await;
        assert_eq!(parts.status, 200, "{b:?} {:?}", parts.headers);
    }
    let url = format!("http://{}/x", rt.proxy.listen_addr());
    let (parts, _) = read_body(get(&c, &url, "nobody").await).await;
    assert_eq!(parts.status, 404);
    (rt, up, dir)
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_query_is_exported() {
    let (rt, up, _dir) = weir_with_traffic().await;
    assert!(up.requests() >= 9, "retries reached the upstream");
    let url = format!("http://{}/metrics", rt.admin_addr);
    let (parts, b) = read_body(get(&client(), &url, "admin").await).await;
    assert_eq!(parts.status, 200);
    let fams = families(std::str::from_utf8(&b).unwrap());
    assert!(
        fams.contains_key("weir_retries_total"),
        "traffic made retries"
    );

    let dash: serde_json::Value = serde_json::from_str(&read("deploy/grafana/weir.json"))
        .unwrap_or_else(|e| panic!("deploy/grafana/weir.json: {e}"));
    let vars: BTreeSet<String> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    for v in ["datasource", "upstream"] {
        assert!(vars.contains(v), "dashboard variable ${v}");
    }
    let mut queried = BTreeSet::new();
    let dash_exprs = dashboard_exprs(&dash);
    assert!(dash_exprs.len() >= 10);
    for (whence, expr) in &dash_exprs {
        for var in expr.split('$').skip(1) {
            let name: String = var
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                name.starts_with("__") || vars.contains(&name),
                "{whence}: ${name} is not a dashboard variable"
            );
        }
        let sels = selectors(expr);
        assert!(!sels.is_empty(), "{whence}: no weir metric in {expr}");
        for sel in &sels {
            queried.insert(check_selector(&fams, sel, whence));
        }
    }
    // The repeated per-upstream row is driven by the `upstream` variable.
    let repeats: Vec<&str> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["repeat"].as_str())
        .collect();
    assert_eq!(repeats, ["upstream"]);

    let rules = alert_rules();
    let names: Vec<&str> = rules.iter().map(|r| r.0.as_str()).collect();
    for a in [
        "WeirBreakerOpen",
        "WeirRetryBudgetExhausted",
        "WeirConfigReloadFailing",
        "WeirRetrySpendHigh",
    ] {
        assert!(names.contains(&a), "alert {a}");
    }
    for (name, expr, texts) in &rules {
        let sels = selectors(expr);
        assert!(!sels.is_empty(), "alert {name}: no weir metric");
        for sel in &sels {
            queried.insert(check_selector(&fams, sel, &format!("alert {name}")));
        }
        // Names an annotation points the reader to exist too.
        for t in texts {
            for sel in selectors(&t.replace("{{ $labels.upstream }}", "x")) {
                let fam = sel
                    .name
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_count");
                assert!(
                    fams.contains_key(fam),
                    "alert {name}: annotation names {}",
                    sel.name
                );
            }
        }
    }
    // What the issue asks the dashboard and alerts to show is all there.
    for must in [
        "weir_requests_total",
        "weir_request_duration_seconds",
        "weir_retries_total",
        "weir_retry_budget_tokens",
        "weir_retry_stops_total",
        "weir_breaker_state",
        "weir_rate_limited_total",
        "weir_config_last_reload_success",
    ] {
        assert!(queried.contains(must), "nothing queries {must}");
    }
}

#[test]
fn selectors_parse_names_and_matchers() {
    let sels = selectors(
        r#"sum by (le) (rate(weir_request_duration_seconds_bucket{job=~"$job", upstream="a,b"}[1m])) / weir_x"#,
    );
    assert_eq!(sels.len(), 2);
    assert_eq!(sels[0].name, "weir_request_duration_seconds_bucket");
    assert_eq!(
        sels[0].matchers,
        [
            ("job".into(), "=~".into(), "$job".into()),
            ("upstream".into(), "=".into(), "a,b".into())
        ]
    );
    assert_eq!(sels[1].name, "weir_x");
    assert!(sels[1].matchers.is_empty());
    // A family that is not exported, or a label value never seen, is caught.
    let fams = families(
        "# TYPE weir_a counter\nweir_a{upstream=\"u\",reason=\"budget\"} 1\n\
         # TYPE weir_h histogram\nweir_h_bucket{le=\"1\"} 0\nweir_h_sum 0\nweir_h_count 0\n",
    );
    let ok = |e: &str| {
        std::panic::catch_unwind(|| {
            for s in selectors(e) {
                check_selector(&fams, &s, "t");
            }
        })
        .is_ok()
    };
    assert!(ok(r#"weir_a{reason="budget", job="j"} + weir_h_bucket"#));
    assert!(!ok(r#"weir_b"#));
    assert!(!ok(r#"weir_a{reason="budgett"}"#));
    assert!(!ok(r#"weir_a{cause="x"}"#));
    assert!(!ok(r#"weir_h"#));
}
