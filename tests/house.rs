//! The shape of the source tree, held: the top level of `src/` in layers
//! ([`LAYERS`], each importing only those before it), no two folders at any
//! level importing each other, no import cycle between modules of
//! `src/` (a module and its own ancestors or descendants aside), the
//! layers ([`FORBIDDEN`]: the upstream side and the live state never
//! import the request side, the policy core imports nothing), no source
//! file over 500 lines of code (blank and comment lines and inline tests
//! not counted), and no two types of the crate under one name. See
//! `src/lib.rs` for the module map.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/proxy/fast/mod.rs` → `proxy::fast`; `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    let m = parts.join("::");
    (m != "lib" && m != "main").then_some(m)
}

/// The code before the inline tests, without comment lines.
fn code(text: &str) -> Vec<&str> {
    text.split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with("//")
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `crate::…`, `super::…` or `self::…` path in `line`.
fn paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = line.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = line[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (is_ident(b[at - 1] as char) || b[at - 1] == b':') {
                continue;
            }
            let end = line[at..]
                .find(|c: char| !(is_ident(c) || c == ':'))
                .map_or(line.len(), |e| at + e);
            out.push(line[at..end].trim_end_matches(':').to_string());
        }
    }
    out
}

/// Splits `s` at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut from, mut out) = (0, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[from..].trim());
    out.into_iter().filter(|x| !x.is_empty()).collect()
}

/// The paths one `use` tree names, its `{…}` groups expanded:
/// `super::{fill, head::{self, Planned}}` → `super::fill`, `super::head`,
/// `super::head::Planned`.
fn expand_use(prefix: &str, tree: &str, out: &mut Vec<String>) {
    for item in split_top(tree) {
        let item = item.split(" as ").next().unwrap_or(item).trim();
        match item.find('{') {
            Some(i) if item.ends_with('}') => {
                let head = format!("{prefix}{}", &item[..i]);
                expand_use(&head, &item[i + 1..item.len() - 1], out);
            }
            _ => {
                let full = format!("{prefix}{item}");
                out.push(full.strip_suffix("::self").unwrap_or(&full).to_string());
            }
        }
    }
}

/// Every path the `use` statements of `lines` name (a statement may span
/// several lines), groups expanded: a grouped import of a sibling is an
/// edge like any other.
fn use_paths(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stmt: Option<String> = None;
    for l in lines {
        let t = l.trim();
        if stmt.is_none() {
            let body = t
                .split_once("use ")
                .filter(|(vis, _)| vis.is_empty() || vis.starts_with("pub"));
            match body {
                Some((_, rest)) => stmt = Some(String::new() + rest),
                None => continue,
            }
        } else if let Some(s) = stmt.as_mut() {
            s.push(' ');
            s.push_str(t);
        }
        if let Some(s) = stmt.as_ref().filter(|s| s.contains(';')) {
            let tree = s.split(';').next().unwrap_or("").split_whitespace();
            expand_use("", &tree.collect::<Vec<_>>().join(" "), &mut out);
            stmt = None;
        }
    }
    out
}

fn resolve(modules: &BTreeSet<String>, cur: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = Vec::new();
    match parts.first() {
        Some(&"crate") => {
            parts.remove(0);
        }
        Some(&"super") => {
            base = cur.split("::").collect();
            while parts.first() == Some(&"super") {
                parts.remove(0);
                base.pop();
            }
        }
        Some(&"self") => {
            parts.remove(0);
            base = cur.split("::").collect();
        }
        _ => return None,
    }
    let full: Vec<&str> = base.into_iter().chain(parts).collect();
    (1..=full.len())
        .rev()
        .map(|k| full[..k].join("::"))
        .find(|m| modules.contains(m))
}

fn related(a: &str, b: &str) -> bool {
    a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// Every module's imports of modules that are neither its ancestors nor
/// its descendants.
fn import_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let texts: BTreeMap<String, String> = files
        .iter()
        .filter_map(|f| Some((module_of(&src, f)?, std::fs::read_to_string(f).unwrap())))
        .collect();
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, text) in &texts {
        let e = edges.entry(m.clone()).or_default();
        let lines = code(text);
        let named = lines.iter().flat_map(|l| paths(l)).chain(use_paths(&lines));
        for p in named {
            if let Some(t) = resolve(&modules, m, &p) {
                if &t != m && !related(m, &t) {
                    e.insert(t);
                }
            }
        }
    }
    edges
}

/// Layers (DESIGN: the upstream side as a layer under the request side):
/// `(from, to, why)` — no module under `from` imports one under `to`.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "policy",
        "",
        "the decision core is pure: it imports only `clock`",
    ),
    (
        "upstream",
        "proxy",
        "the upstream side never imports the request side",
    ),
    (
        "state",
        "upstream",
        "live policy state knows nothing of endpoints or connections: those are the upstream layer's",
    ),
    (
        "state",
        "proxy",
        "live state is the request side's input, never its user",
    ),
    (
        "state::fleet",
        "proxy",
        "the shared state knows nothing of requests",
    ),
    (
        "state::fleet",
        "upstream",
        "the shared state knows nothing of endpoints",
    ),
    (
        "config",
        "proxy",
        "a config is parsed and checked without a data plane",
    ),
    (
        "config",
        "state",
        "a config is parsed and checked without live state",
    ),
    (
        "metrics",
        "proxy",
        "series are named and counted, not served, here",
    ),
    (
        "trace",
        "proxy",
        "spans are recorded and sent, not served, here: the data plane calls it",
    ),
    (
        "trace",
        "state",
        "a span records what the data plane tells it, not live state",
    ),
];

/// The top level of `src/`, bottom up: a module may import only modules
/// listed before it. A new top-level module has to be given its place here
/// (docs/reference/life-of-a-request.md#the-house).
const LAYERS: &[(&str, &str)] = &[
    (
        "clock",
        "the only reader of clocks and seeder of randomness: a leaf",
    ),
    ("shutdown", "the stop signal: a leaf"),
    (
        "h1",
        "HTTP/1 framing, written once for every reader of HTTP/1 bytes: a leaf",
    ),
    ("address", "where a socket is, TCP or Unix-domain: a leaf"),
    ("policy", "the pure decision core"),
    ("config", "the TOML schema, validated into typed snapshots"),
    ("metrics", "every metric family and meter"),
    ("tls", "certificates, keys and TLS configurations"),
    ("trace", "trace context, spans and their exporter"),
    (
        "state",
        "live per-upstream policy state and the fleet's shared state",
    ),
    (
        "upstream",
        "endpoints, the dialler and every upstream connection, kept across reloads",
    ),
    ("proxy", "the data plane: one serve order over its codecs"),
    ("admin", "the admin endpoints, the status page, reloads"),
    (
        "runtime",
        "a running weir: workers, signals, the file watch",
    ),
    (
        "cli",
        "the command line and what only it uses (chaos, health, fuzzing hooks)",
    ),
];

/// `m`'s child of `parent` (the empty parent is the top level): the folder
/// or file `m` lives in one level below `parent`, if `m` is under it.
fn child_of(parent: &str, m: &str) -> Option<String> {
    let rest = if parent.is_empty() {
        m
    } else {
        m.strip_prefix(parent)?.strip_prefix("::")?
    };
    let first = rest.split("::").next()?;
    Some(if parent.is_empty() {
        first.to_string()
    } else {
        format!("{parent}::{first}")
    })
}

#[test]
fn the_top_level_reads_as_layers() {
    let edges = import_edges();
    let place = |m: &str| LAYERS.iter().position(|(l, _)| *l == m);
    let mut broken = Vec::new();
    for m in edges.keys() {
        let top = child_of("", m).unwrap();
        if place(&top).is_none() {
            broken.push(format!("{top} has no place in LAYERS"));
        }
    }
    for (m, targets) in &edges {
        let from = child_of("", m).unwrap();
        for t in targets {
            let to = child_of("", t).unwrap();
            if let (Some(a), Some(b)) = (place(&from), place(&to)) {
                if b > a {
                    broken.push(format!(
                        "{m} imports {t}: {from} ({}) sits below {to} ({})",
                        LAYERS[a].1, LAYERS[b].1
                    ));
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(
        broken.is_empty(),
        "arrows that run back up:\n{}",
        broken.join("\n")
    );
}

/// At every level of the tree, the folders and files under one parent
/// import each other one way only: collapsed to the parent's children, the
/// import graph has no cycle (`proxy::fast` may use `proxy::general`, not
/// also the reverse).
#[test]
fn no_two_folders_import_each_other() {
    let edges = import_edges();
    let mut parents: BTreeSet<String> = BTreeSet::from([String::new()]);
    for m in edges.keys() {
        let parts: Vec<&str> = m.split("::").collect();
        for k in 1..parts.len() {
            parents.insert(parts[..k].join("::"));
        }
    }
    let mut cycles = Vec::new();
    for parent in &parents {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, targets) in &edges {
            let Some(a) = child_of(parent, m) else {
                continue;
            };
            for t in targets {
                if let Some(b) = child_of(parent, t) {
                    if a != b {
                        graph.entry(a.clone()).or_default().insert(b);
                    }
                }
            }
        }
        for start in graph.keys() {
            let mut seen = BTreeSet::new();
            let mut stack = vec![start.clone()];
            while let Some(n) = stack.pop() {
                for next in graph.get(&n).into_iter().flatten() {
                    if next == start {
                        cycles.push(format!(
                            "under `{parent}`: {start} and {n} import each other"
                        ));
                    } else if seen.insert(next.clone()) {
                        stack.push(next.clone());
                    }
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "folders that import each other:\n{}",
        cycles.join("\n")
    );
}

/// Whether `m` is `top` or under it.
fn under(m: &str, top: &str) -> bool {
    m == top || m.starts_with(&format!("{top}::"))
}

#[test]
fn the_layers_hold() {
    let mut broken = Vec::new();
    for (m, targets) in import_edges() {
        for (from, to, why) in FORBIDDEN {
            if !under(&m, from) {
                continue;
            }
            for t in &targets {
                let hit = match *to {
                    // Anything but `clock` and its own descendants.
                    "" => !under(t, from) && !under(t, "clock"),
                    to => under(t, to),
                };
                if hit {
                    broken.push(format!("{m} imports {t}: {why}"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let edges = import_edges();
    // Any path from a module back to itself is a cycle.
    let mut cycles = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> =
            vec![(start.to_string(), vec![start.to_string()])];
        while let Some((m, trail)) = stack.pop() {
            for next in edges.get(m.as_str()).into_iter().flatten() {
                if next == start {
                    cycles.push(trail.join(" → ") + " → " + start);
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_source_file_is_over_500_lines_of_code() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let big: Vec<String> = files
        .iter()
        .map(|f| (f, code(&std::fs::read_to_string(f).unwrap()).len()))
        .filter(|(_, n)| *n > 500)
        .map(|(f, n)| format!("{}: {n}", f.display()))
        .collect();
    assert!(big.is_empty(), "over 500 lines of code: {big:?}");
}

/// The name `line` defines as a struct, enum, union, trait or type alias,
/// and whether it is a type alias.
fn defined(line: &str) -> Option<(&str, bool)> {
    let mut t = line.trim_start();
    if let Some(rest) = t.strip_prefix("pub") {
        t = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')')?.1,
            None => rest,
        }
        .trim_start();
    }
    t = t.strip_prefix("unsafe ").unwrap_or(t);
    let (kind, rest) = t.split_once(' ')?;
    if !["struct", "enum", "union", "trait", "type"].contains(&kind) {
        return None;
    }
    let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
    let name = &rest[..end];
    name.starts_with(|c: char| c.is_ascii_uppercase())
        .then_some((name, kind == "type"))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Whether the indented line `i` is inside an `impl` or `trait` block:
/// the nearest line above it that is indented less, a multi-line
/// header's `where`, `{` and closing brackets aside, opens one.
fn in_impl_or_trait(lines: &[&str], i: usize) -> bool {
    let n = indent(lines[i]);
    for l in lines[..i].iter().rev() {
        let t = l.trim();
        if t.is_empty() || t.starts_with("//") || t.starts_with("#[") || indent(l) >= n {
            continue;
        }
        if t == "{" || t.starts_with("where") || t.starts_with([')', '>']) {
            continue;
        }
        let t = t.strip_prefix("unsafe ").unwrap_or(t);
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = match t.strip_prefix("pub(") {
            Some(r) => r.split_once(')').map_or(r, |(_, r)| r.trim_start()),
            None => t,
        };
        return t.starts_with("impl") || t.starts_with("trait ");
    }
    false
}

/// Every struct, enum, union, trait and type alias defined in `text`, with
/// its line number; the associated types of impls and traits (an indented
/// `type X = …;` or `type X;` in an `impl` or `trait` block) are not
/// definitions of their own. Inline tests count.
fn type_definitions(text: &str) -> Vec<(&str, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let (name, alias) = defined(l)?;
            let associated = alias && indent(l) > 0 && in_impl_or_trait(&lines, i);
            (!associated).then_some((name, i + 1))
        })
        .collect()
}

#[test]
fn no_two_types_share_a_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.sort();
    let mut defs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        for (name, line) in type_definitions(&text) {
            defs.entry(name.to_string())
                .or_default()
                .push(format!("{rel}:{line}"));
        }
    }
    assert!(
        defs.len() > 100,
        "found only {} type names under src/: is the parser broken?",
        defs.len()
    );
    let shared: Vec<String> = defs
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        shared.is_empty(),
        "{} type names are defined more than once (name each by its role):\n{}",
        shared.len(),
        shared.join("\n")
    );
}

/// Every connection weir keeps to an upstream lives under `src/upstream/`:
/// nothing in the data plane outside it dials, runs hyper's client or
/// names a pool, and `src/upstream/pool/` has one pool type per protocol.
/// (`src/cli/` is outside the data plane: `weir health` and the chaos
/// scenarios are clients of weir.)
#[test]
fn every_upstream_connection_lives_under_upstream() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.sort();
    let mut outside = Vec::new();
    let mut pools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let upstream = rel.starts_with("src/upstream/");
        if !upstream && !rel.starts_with("src/cli/") {
            for l in code(&text) {
                match dial_in(l) {
                    Some(d) if !NOT_UPSTREAM.contains(&(rel.as_str(), d)) => {
                        outside.push(format!("{rel}: {d}"));
                    }
                    _ => {}
                }
            }
        }
        for (name, line) in type_definitions(&text) {
            if name.ends_with("Pool") {
                pools
                    .entry(name.to_string())
                    .or_default()
                    .push(format!("{rel}:{line}"));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "upstream connections made or kept outside src/upstream/:\n{}",
        outside.join("\n")
    );
    let in_pool: Vec<&String> = pools
        .iter()
        .filter(|(_, at)| at.iter().all(|a| a.starts_with("src/upstream/pool/")))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        in_pool,
        ["H1Pool", "H2Pool"],
        "one pool type per protocol under src/upstream/pool/"
    );
    // No pool type anywhere else: hyper-util's pool is gone (an `auto`
    // endpoint over TLS is dialled by the one dialler and its ALPN answer
    // picks the pool; a name not resolved yet is waited for).
    let elsewhere: Vec<(&String, &Vec<String>)> =
        pools.iter().filter(|(n, _)| !in_pool.contains(n)).collect();
    assert!(
        elsewhere.is_empty(),
        "pool types outside src/upstream/pool/: {elsewhere:?}"
    );
    // And nothing in the data plane or the upstream layer uses hyper-util's
    // client (the command line's load drivers aside).
    let legacy: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(root.join("src/cli")))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            code(&text).iter().any(|l| l.contains("client::legacy"))
        })
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(legacy.is_empty(), "hyper-util's pool used in: {legacy:?}");
}

/// `proxy/` asks the upstream layer for a connection and neither picks an
/// endpoint nor takes from a pool nor dials itself: the one checkout is
/// `upstream::checkout` (`send` for the general path, `idle` then `dial` for the
/// fast path's raw HTTP/1.1).
#[test]
fn the_data_plane_neither_picks_nor_dials() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src/proxy"), &mut files);
    files.sort();
    let asks = [
        "endpoints.pick(",
        ".pick(avoid",
        "::connect_any(",
        "pool::open(",
        "pool.take(",
        "H1Pool::take",
    ];
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        for l in code(&text) {
            if let Some(a) = asks.iter().find(|a| l.contains(*a)) {
                found.push(format!("{rel}: {a}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "proxy/ picks or dials by itself (ask upstream::checkout):\n{}",
        found.join("\n")
    );
}

/// Connects outside `src/upstream/` that reach no upstream, each with its
/// reason. `listen_unix` connects to the socket file it is about to
/// listen on: a connection answered means another process holds it (an
/// error); one refused means a stale file to replace.
const NOT_UPSTREAM: [(&str, &str); 1] = [("src/proxy/listen_unix.rs", "UnixStream::connect")];

/// What on a line of code makes or keeps an upstream connection: a connect
/// of either socket kind (TCP or Unix-domain), a hyper client, a TLS
/// connector.
fn dial_in(line: &str) -> Option<&'static str> {
    const DIALS: [&str; 9] = [
        "TcpStream::connect",
        "TcpSocket::",
        "UnixStream::connect",
        "UnixSocket::",
        "client::conn::http1",
        "client::conn::http2",
        "legacy::Client",
        "SendRequest",
        "TlsConnector",
    ];
    DIALS.iter().copied().find(|d| line.contains(d))
}

#[test]
fn a_connect_of_either_kind_is_a_dial() {
    for line in [
        "let s = tokio::net::UnixStream::connect(path).await?;",
        "let s = TcpStream::connect(addr).await?;",
        "let s = tokio::net::TcpSocket::new_v4()?;",
        "let s = std::os::unix::net::UnixStream::connect(p)?;",
    ] {
        assert!(dial_in(line).is_some(), "{line}");
    }
    assert!(dial_in("let l = UnixListener::bind(path)?;").is_none());
}

/// `autotests = false`: a file in `tests/` runs only if `tests/main.rs`
/// names it as a module or Cargo.toml gives it a `[[test]]` of its own.
/// A file that is neither would compile nowhere and pass in silence.
#[test]
fn every_test_file_is_in_a_test_binary() {
    let main = std::fs::read_to_string("tests/main.rs").unwrap();
    let cargo = std::fs::read_to_string("Cargo.toml").unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir("tests").unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if stem == "main" {
            continue;
        }
        let as_module = main.lines().any(|l| l.trim() == format!("mod {stem};"));
        let alone = cargo.contains(&format!("path = \"tests/{name}\""));
        if as_module == alone {
            missing.push(format!(
                "{name} (module: {as_module}, own [[test]]: {alone})"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "each file in tests/ must be exactly one of a `mod` in tests/main.rs or a [[test]] in Cargo.toml: {missing:?}"
    );
}
