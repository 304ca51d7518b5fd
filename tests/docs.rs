//! The docs hold (CONTRIBUTING.md, "Docs"): every relative link in the
//! README, the book and the other Markdown files reaches a file and a
//! heading that exist; every docs anchor the code cites exists; the
//! configuration reference names every field of the config file and the
//! metrics reference every metric family; and the runnable examples
//! (`toml,example` and `console,example` blocks) run against the real
//! binary and print what they say they print.
// The examples run real processes: their waits are on the wall clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file the repository publishes: the book under `docs/`
/// and the top-level pages.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("CHANGELOG.md"),
        root().join("bench/RESULTS.md"),
    ];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A heading's anchor as GitHub and mdBook make it: lower case, letters,
/// digits, `-` and `_` kept, spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file: each heading's slug (a repeated one
/// gets `-1`, `-2`, …) and any explicit `id="…"`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        if let Some(h) = line.strip_prefix('#') {
            let h = h.trim_start_matches('#');
            if h.starts_with(' ') {
                let s = slug(h);
                let n = seen.entry(s.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    s.clone()
                } else {
                    format!("{s}-{n}")
                });
                *n += 1;
            }
        }
        let mut rest = line;
        while let Some(i) = rest.find("id=\"") {
            rest = &rest[i + 4..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_string());
            }
        }
    }
    out
}

/// The targets of the inline links (`[text](target)`) in a Markdown text,
/// outside code blocks and code spans, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        // Code spans may show link syntax without being links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].trim().trim_matches(['<', '>']);
            let target = target.split_whitespace().next().unwrap_or_default();
            out.push((n, target.to_string()));
            rest = &rest[end..];
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| target.starts_with(p))
}

/// Whether `path#anchor` (relative to `from`'s directory; an empty path is
/// `from` itself) names a file and, when given, one of its anchors. `Err`
/// says what is missing.
fn resolve(from: &Path, target: &str) -> Result<(), String> {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(path)
    };
    if !file.exists() {
        return Err(format!("no file {}", file.display()));
    }
    let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
        return Ok(());
    };
    if file.extension().is_none_or(|x| x != "md") {
        return Ok(());
    }
    let text = std::fs::read_to_string(&file).unwrap();
    if anchors(&text).contains(anchor) {
        Ok(())
    } else {
        Err(format!("no heading #{anchor} in {}", file.display()))
    }
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in links(&text) {
            if is_external(&target) || target.is_empty() {
                continue;
            }
            checked += 1;
            if let Err(why) = resolve(&file, &target) {
                let at = file.strip_prefix(root()).unwrap().display();
                broken.push(format!("{at}:{line}: ({target}): {why}"));
            }
            // A book page's link must stay in the book: mdbook renders
            // `docs/` alone, and a file outside it is a dead link there.
            let path = target.split('#').next().unwrap_or_default();
            let in_book = file.starts_with(root().join("docs"));
            let dest = file.parent().unwrap().join(path);
            let mut normal = PathBuf::new();
            for c in dest.components() {
                match c {
                    std::path::Component::ParentDir => {
                        normal.pop();
                    }
                    std::path::Component::CurDir => {}
                    c => normal.push(c),
                }
            }
            if in_book && !path.is_empty() && !normal.starts_with(root().join("docs")) {
                let at = file.strip_prefix(root()).unwrap().display();
                broken.push(format!(
                    "{at}:{line}: ({target}): outside the book, a dead link in the rendered book"
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Issue 46, items 2 and 9: every cargo command the docs give to build,
/// run or install weir or a tool uses `Cargo.lock` (`--locked`), so the
/// stated minimum Rust version holds for what a reader builds; and the
/// README's test command is the one script that installs what the tests
/// need. bench/RESULTS.md and CHANGELOG.md record what was run, as run.
#[test]
fn every_cargo_command_the_docs_give_is_locked() {
    let mut files: Vec<PathBuf> = markdown_files()
        .into_iter()
        .filter(|f| !f.ends_with("bench/RESULTS.md") && !f.ends_with("CHANGELOG.md"))
        .collect();
    files.push(root().join("fuzz/README.md"));
    let mut unlocked = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            for verb in ["cargo install ", "cargo build ", "cargo run "] {
                let mut rest = line;
                while let Some(at) = rest.find(verb) {
                    let cmd = &rest[at..];
                    let end = cmd.find(['`', '#', '&', ';', ')']).unwrap_or(cmd.len());
                    if !cmd[..end].contains("--locked") {
                        unlocked.push(format!("{}:{}: {}", f.display(), i + 1, &cmd[..end]));
                    }
                    rest = &cmd[verb.len()..];
                }
            }
        }
    }
    assert!(
        unlocked.is_empty(),
        "without --locked:\n{}",
        unlocked.join("\n")
    );

    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let two = readme
        .split("## Two commands")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .unwrap();
    let commands: Vec<&str> = two.lines().collect();
    assert_eq!(commands.len(), 2, "{two}");
    assert!(commands[1].starts_with(".ci/run "), "{two}");
}

#[test]
fn the_book_lists_every_page_and_no_page_twice() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let listed: Vec<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    let unique: BTreeSet<&String> = listed.iter().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "a page listed twice: {listed:?}"
    );
    for file in markdown_files() {
        let Ok(rel) = file.strip_prefix(root().join("docs")) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&rel),
            "docs/{rel} is not in docs/SUMMARY.md"
        );
    }
}

/// `docs/…md` and `docs/…md#anchor` as the code writes them in comments.
fn citations(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/") {
        let before = &text[..text.len() - rest.len() + i];
        rest = &rest[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-#".contains(c)))
            .unwrap_or(rest.len());
        let cited = rest[..end].trim_end_matches('.');
        // A path inside another (`src/docs/…`) is not the book's.
        let inside = before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '/');
        if !inside && cited.contains(".md") {
            out.push(cited.to_string());
        }
        rest = &rest[end.max(1)..];
    }
    out
}

#[test]
fn every_docs_anchor_the_code_cites_exists() {
    let mut broken = Vec::new();
    let mut checked = 0;
    let mut dirs: Vec<PathBuf> = [
        "src",
        "tests",
        "bench",
        "deploy",
        "config",
        "fuzz/fuzz_targets",
        ".ci",
    ]
    .iter()
    .map(|d| root().join(d))
    .collect();
    let mut files = vec![root().join("Cargo.toml"), root().join("Dockerfile")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    // This file names missing pages on purpose.
    files.retain(|f| !f.ends_with("tests/docs.rs"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for cited in citations(&text) {
            checked += 1;
            if let Err(why) = resolve(&root().join("x"), &cited) {
                let at = file.strip_prefix(root()).unwrap().display();
                broken.push(format!("{at}: {cited}: {why}"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} citations found: is the scan right?"
    );
    assert!(
        broken.is_empty(),
        "citations of missing docs:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_citation_check_fails_on_a_missing_anchor() {
    let cited = citations(
        "see docs/reference/retries.md#backoff and docs/reference/retries.md#no-such-thing.",
    );
    assert_eq!(cited.len(), 2, "{cited:?}");
    assert!(resolve(&root().join("x"), &cited[0]).is_ok());
    assert!(resolve(&root().join("x"), &cited[1]).is_err());
    assert!(resolve(&root().join("x"), "docs/no-such-page.md").is_err());
}

/// The rows of each `### `[table]`` section of the configuration
/// reference: the field names in backticks in the first column.
fn reference_tables(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table: Option<String> = None;
    for (_, line) in prose(text) {
        if let Some(h) = line.strip_prefix("### ") {
            table = h
                .split('`')
                .nth(1)
                .map(|t| t.trim_matches(['[', ']']).to_string());
            continue;
        }
        if line.starts_with("## ") {
            table = None;
        }
        let (Some(t), Some(row)) = (&table, line.strip_prefix("| `")) else {
            continue;
        };
        if let Some(name) = row.split('`').next() {
            out.entry(t.clone()).or_default().insert(name.to_string());
        }
    }
    out
}

#[test]
fn the_configuration_reference_names_every_field() {
    let text = std::fs::read_to_string(root().join("docs/reference/configuration.md")).unwrap();
    let tables = reference_tables(&text);
    let mut missing = Vec::new();
    for (paths, fields) in weir::config::catalogue() {
        if paths == [""] {
            continue; // the top level holds only tables
        }
        for field in fields {
            let documented = paths
                .iter()
                .any(|p| tables.get(p).is_some_and(|rows| rows.contains(field)));
            if !documented {
                missing.push(format!("`{field}` in [{}]", paths.join("] or [")));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/reference/configuration.md lacks a row for:\n{}",
        missing.join("\n")
    );
    // And no row names a field the file does not have.
    let known: BTreeSet<(String, &str)> = weir::config::catalogue()
        .into_iter()
        .flat_map(|(paths, fields)| {
            paths
                .into_iter()
                .flat_map(move |p| fields.clone().into_iter().map(move |f| (p.clone(), f)))
        })
        .collect();
    let nested: BTreeSet<String> = known.iter().map(|(p, _)| p.clone()).collect();
    for (table, rows) in &tables {
        for row in rows {
            let child = format!("{table}.{row}");
            let is_table = nested
                .iter()
                .any(|p| p == &child || p.starts_with(&format!("{child}.")));
            assert!(
                is_table || known.contains(&(table.clone(), row.as_str())),
                "docs/reference/configuration.md documents `{row}` in [{table}], which the config does not have"
            );
        }
    }
}

/// Every metric family name the code registers: the `"weir_…"` strings in
/// `src/metrics.rs` and `src/metrics/`.
fn metric_families() -> BTreeSet<String> {
    let mut files = vec![root().join("src/metrics.rs")];
    for e in std::fs::read_dir(root().join("src/metrics")).unwrap() {
        files.push(e.unwrap().path());
    }
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        for part in text.split('"').skip(1).step_by(2) {
            let name_like = part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit());
            if part.starts_with("weir_") && name_like {
                out.insert(part.to_string());
            }
        }
    }
    out
}

#[test]
fn the_metrics_reference_names_every_family() {
    let text = std::fs::read_to_string(root().join("docs/reference/metrics.md")).unwrap();
    let rows: BTreeSet<String> = prose(&text)
        .into_iter()
        .filter_map(|(_, l)| l.strip_prefix("| `"))
        .filter_map(|r| r.split('`').next())
        .map(str::to_string)
        .collect();
    let families = metric_families();
    assert!(families.len() > 20, "{families:?}");
    let missing: Vec<&String> = families.iter().filter(|f| !rows.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "docs/reference/metrics.md lacks: {missing:?}"
    );
    for row in rows.iter().filter(|r| r.starts_with("weir_")) {
        assert!(
            families.contains(row),
            "docs/reference/metrics.md documents {row}, which the code does not register"
        );
    }
}

/// The value of `const NAME: &str = "…";` in the source file `rel`.
fn str_const(rel: &str, name: &str) -> String {
    let text = std::fs::read_to_string(root().join(rel)).unwrap();
    let at = text
        .find(&format!("const {name}: &str = \""))
        .unwrap_or_else(|| panic!("no const {name} in {rel}"));
    text[at..].split('"').nth(1).unwrap().to_string()
}

/// Issue 58, item 4: the fields weir adds to the requests it forwards are
/// listed together, `x-request-id` among them (it was said only in
/// logs.md), in responses.md beside what weir adds to responses.
#[test]
fn the_fields_weir_adds_to_requests_are_listed_together() {
    let text = std::fs::read_to_string(root().join("docs/reference/responses.md")).unwrap();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("What weir adds to requests\n"))
        .expect("docs/reference/responses.md has no section `What weir adds to requests`");
    for field in [
        str_const("src/proxy/request.rs", "REQUEST_ID_FIELD"),
        str_const("src/trace/context.rs", "TRACEPARENT"),
        "grpc-timeout".to_string(),
    ] {
        assert!(
            section.contains(&format!("- `{field}` — ")),
            "`{field}` is not listed in responses.md's `What weir adds to requests`"
        );
    }
}

// ---- the runnable examples ----

/// One `console,example` block: where it is, its commands with what each
/// prints (as the block says), and the config it runs against.
struct Example {
    at: String,
    config: Option<String>,
    steps: Vec<(String, Vec<String>)>,
}

fn examples() -> Vec<Example> {
    let mut out = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let at = file.strip_prefix(root()).unwrap().display().to_string();
        let mut config = None;
        let mut block: Option<(String, usize, Vec<&str>)> = None;
        for (i, line) in text.lines().enumerate() {
            let fence = line.trim_start().strip_prefix("```");
            match (&mut block, fence) {
                (None, Some(info)) => block = Some((info.trim().to_string(), i + 1, Vec::new())),
                (Some((info, start, lines)), Some(_)) => {
                    if info == "toml,example" {
                        config = Some(lines.join("\n") + "\n");
                    } else if info == "console,example" {
                        out.push(Example {
                            at: format!("{at}:{start}"),
                            config: config.clone(),
                            steps: steps(lines),
                        });
                    }
                    block = None;
                }
                (Some((_, _, lines)), None) => lines.push(line),
                (None, None) => {}
            }
        }
    }
    out
}

/// A console block's commands (`$ `, with ` \` continuations) and the
/// lines each is expected to print.
fn steps(lines: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut continued = false;
    for line in lines {
        if let Some(cmd) = line.strip_prefix("$ ") {
            out.push((cmd.trim_end_matches('\\').to_string(), Vec::new()));
            continued = line.ends_with('\\');
        } else if continued {
            let last = out.last_mut().unwrap();
            last.0.push_str(line.trim_end_matches('\\'));
            continued = line.ends_with('\\');
        } else if let Some(last) = out.last_mut() {
            last.1.push(line.trim_end().to_string());
        }
    }
    out
}

/// The ports a text names as `127.0.0.1:PORT` or `localhost:PORT`.
fn ports(text: &str) -> BTreeSet<u16> {
    let mut out = BTreeSet::new();
    for host in ["127.0.0.1:", "localhost:"] {
        for part in text.split(host).skip(1) {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(p) = digits.parse::<u16>() {
                out.insert(p);
            }
        }
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `text` with each port of `map` replaced where it follows a host.
fn remap(text: &str, map: &BTreeMap<u16, u16>) -> String {
    let mut out = text.to_string();
    for (from, to) in map {
        for host in ["127.0.0.1:", "localhost:"] {
            let mut s = String::new();
            let mut rest = out.as_str();
            let needle = format!("{host}{from}");
            while let Some(i) = rest.find(&needle) {
                let after = &rest[i + needle.len()..];
                s.push_str(&rest[..i]);
                if after.starts_with(|c: char| c.is_ascii_digit()) {
                    s.push_str(&needle);
                } else {
                    s.push_str(&format!("{host}{to}"));
                }
                rest = after;
            }
            s.push_str(rest);
            out = s;
        }
    }
    out
}

/// Processes a block started, killed when it ends (or the test fails).
struct Background(Vec<Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for(port: u16, until: Instant) {
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `expected` appears in `actual` in order, each line whole.
fn in_order(expected: &[String], actual: &str) -> bool {
    let mut lines = actual.lines().map(|l| l.trim_end_matches('\r').trim_end());
    expected
        .iter()
        .filter(|e| !e.is_empty())
        .all(|e| lines.any(|l| l == e))
}

fn run(example: &Example, n: usize) {
    let dir = std::env::temp_dir().join(format!("weir-docs-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let default = std::fs::read_to_string(root().join("config/weir.toml")).unwrap();
    let block: String = example
        .steps
        .iter()
        .map(|(c, _)| c.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let config = example.config.clone().unwrap_or_default();
    let named = ports(&format!("{block}\n{config}\n{default}"));
    let map: BTreeMap<u16, u16> = named.iter().map(|p| (*p, free_port())).collect();
    std::fs::write(dir.join("config/weir.toml"), remap(&default, &map)).unwrap();
    if let Some(c) = &example.config {
        std::fs::write(dir.join("weir.toml"), remap(c, &map)).unwrap();
    }
    #[cfg(unix)]
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_weir"), dir.join("bin/weir")).unwrap();
    let path = format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut background = Background(Vec::new());
    let mut waiting = false;
    for (cmd, expected) in &example.steps {
        let cmd = remap(cmd, &map);
        let shell = |c: &str| {
            let mut sh = Command::new("bash");
            sh.arg("-c").arg(c).current_dir(&dir).env("PATH", &path);
            sh.env_remove("WEIR_CONFIG").env_remove("RUST_LOG");
            sh
        };
        if let Some(bg) = cmd.trim_end().strip_suffix('&') {
            let child = shell(&format!("exec {bg}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            background.0.push(child);
            waiting = true;
            continue;
        }
        if std::mem::take(&mut waiting) {
            let until = Instant::now() + Duration::from_secs(15);
            for port in map.values() {
                wait_for(*port, until);
            }
        }
        let mut child = shell(&cmd)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < until,
                "{}: `{cmd}` did not end within 30 s",
                example.at
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            in_order(expected, &printed),
            "{}: `{cmd}` printed\n{printed}\nwhich lacks, in this order:\n{}",
            example.at,
            expected.join("\n")
        );
    }
    drop(background);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_examples_in_the_docs_run_as_written() {
    let all = examples();
    let at: Vec<&str> = all.iter().map(|e| e.at.as_str()).collect();
    for wanted in [
        "README.md",
        "docs/guide/quick-start.md",
        "docs/guide/exactly-once.md",
    ] {
        assert!(
            at.iter().any(|a| a.starts_with(wanted)),
            "no example in {wanted}: {at:?}"
        );
    }
    let curl = Command::new("curl").arg("--version").output().is_ok();
    if !curl {
        assert!(
            std::env::var_os("WEIR_REQUIRE_CURL").is_none(),
            "curl is required (WEIR_REQUIRE_CURL is set)"
        );
        eprintln!("SKIPPED: the examples call curl, which is not installed");
        return;
    }
    for (n, e) in all.iter().enumerate() {
        run(e, n);
    }
}

#[test]
fn the_example_check_fails_on_a_wrong_line() {
    let printed = "HTTP/1.1 200 OK\r\nx-weir-attempts: 1\r\n\r\nbody";
    let want = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(in_order(
        &want(&["HTTP/1.1 200 OK", "x-weir-attempts: 1"]),
        printed
    ));
    assert!(!in_order(
        &want(&["x-weir-attempts: 1", "HTTP/1.1 200 OK"]),
        printed
    ));
    assert!(!in_order(&want(&["x-weir-attempts: 2"]), printed));
    let map = BTreeMap::from([(8080, 41000), (15001, 42000)]);
    assert_eq!(
        remap(
            "http://127.0.0.1:8080/ and localhost:15001, not 127.0.0.1:80801",
            &map
        ),
        "http://127.0.0.1:41000/ and localhost:42000, not 127.0.0.1:80801"
    );
}

/// Issue 46, item 7: mdBook copies every file of the book's source
/// directory that is not a page into the rendered book, so that directory
/// holds pages, and only the pictures and files the pages link to: no
/// `book.toml`, no stray notes.
#[test]
fn the_book_copies_only_what_its_pages_use() {
    let config = ["book.toml", "docs/book.toml"]
        .iter()
        .map(|p| root().join(p))
        .find(|p| p.exists())
        .expect("the book's book.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let book: toml::Table = toml::from_str(&text).unwrap();
    let src = book["book"]
        .get("src")
        .and_then(|s| s.as_str())
        .unwrap_or("src");
    let src = config.parent().unwrap().join(src);
    let src = src.canonicalize().unwrap();
    let mut pages = Vec::new();
    let mut others = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            } else {
                others.push(p);
            }
        }
    }
    let mut used = BTreeSet::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (_, target) in links(&text) {
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || is_external(path) {
                continue;
            }
            if let Ok(p) = page.parent().unwrap().join(path).canonicalize() {
                used.insert(p);
            }
        }
    }
    let stray: Vec<String> = others
        .iter()
        .filter(|p| !used.contains(&p.canonicalize().unwrap()))
        .map(|p| p.strip_prefix(root()).unwrap_or(p).display().to_string())
        .collect();
    assert!(
        stray.is_empty(),
        "copied into the rendered book though no page uses them: {stray:?}"
    );
}

/// Issue 46, item 7: wherever the docs tell of `HTTPS_PROXY`, they say
/// that its traffic is tunnelled with `CONNECT` and gets no HTTP-level
/// policy (no retry, cache, per-request metric…): a reader must not take
/// a tunnel for weir's protection.
#[test]
fn every_page_on_https_proxy_says_a_tunnel_gets_no_http_policy() {
    let mut silent = Vec::new();
    for file in markdown_files() {
        if file.ends_with("CHANGELOG.md") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if flat.contains("HTTPS_PROXY") && !flat.contains("no HTTP-level policy") {
            silent.push(file.strip_prefix(root()).unwrap().display().to_string());
        }
    }
    assert!(
        silent.is_empty(),
        "these pages tell of HTTPS_PROXY without saying that a tunnel gets no HTTP-level policy: {silent:?}"
    );
}
