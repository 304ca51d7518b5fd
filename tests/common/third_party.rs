//! Real third-party servers and clients for integration tests: nginx, curl,
//! and the Python servers in tests/servers/ (hyper-h2 and grpcio, from the
//! venv `.ci/run` makes at target/ci-venv).
//!
//! Every helper returns `None` when its tool is missing; pass that to
//! [`require`], which skips the test (or, with WEIR_REQUIRE_THIRD_PARTY set,
//! as `.ci/run` does, fails it). A [`Child`] kills and reaps the one process
//! it started when dropped.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a server gets to start (print its port or accept connections).
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The real monotonic clock. Timeouts on other processes must run on real
/// time: under a paused tokio clock (`start_paused`) a blocking wait would
/// never see time pass.
#[allow(clippy::disallowed_methods)]
fn real_now() -> Instant {
    Instant::now()
}

/// The project root (where Cargo.toml is).
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// tests/servers/<script>.
pub fn server_script(script: &str) -> PathBuf {
    manifest_dir().join("tests").join("servers").join(script)
}

/// When a tool is not available: with WEIR_REQUIRE_THIRD_PARTY set (as
/// `.ci/run` sets it), panic naming what to install; otherwise say the test
/// was skipped and return false. Returns true when `available`.
///
/// `tool` names the tool and how to get it, e.g.
/// `"nginx (apt-get install nginx-light)"`.
pub fn require(tool: &str, available: bool) -> bool {
    if available {
        return true;
    }
    assert!(
        std::env::var_os("WEIR_REQUIRE_THIRD_PARTY").is_none(),
        "{tool} is required here (WEIR_REQUIRE_THIRD_PARTY is set; .ci/run installs it)"
    );
    eprintln!("SKIPPED: {tool} is not available");
    false
}

/// What to install for [`python`], for [`require`] messages.
pub const PYTHON_TOOL: &str = "python with h2 and grpcio (python3 -m venv target/ci-venv && \
     target/ci-venv/bin/pip install h2 grpcio opentelemetry-proto, or set WEIR_PYTHON)";
/// What to install for [`nginx`], for [`require`] messages.
pub const NGINX_TOOL: &str = "nginx (apt-get install nginx-light)";
/// What to install for [`curl`], for [`require`] messages.
pub const CURL_TOOL: &str = "curl (apt-get install curl)";

/// A Python that can `import h2, grpc`: $WEIR_PYTHON if set, else the venv at
/// target/ci-venv. Checked once per test binary.
pub fn python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let candidate = match std::env::var_os("WEIR_PYTHON") {
                Some(p) => PathBuf::from(p),
                None => manifest_dir().join("target/ci-venv/bin/python"),
            };
            let ok = candidate.exists()
                && Command::new(&candidate)
                    .args(["-c", "import h2, grpc"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            ok.then_some(candidate)
        })
        .clone()
}

/// curl, if `curl --version` runs.
pub fn curl() -> Option<PathBuf> {
    static CURL: OnceLock<Option<PathBuf>> = OnceLock::new();
    CURL.get_or_init(|| {
        Command::new("curl")
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            .then(|| PathBuf::from("curl"))
    })
    .clone()
}

/// /usr/sbin/nginx, if present.
pub fn nginx_bin() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/sbin/nginx");
    p.exists().then_some(p)
}

/// nginx's version from `nginx -v`, e.g. (1, 22, 1).
pub fn nginx_version() -> Option<(u32, u32, u32)> {
    static VERSION: OnceLock<Option<(u32, u32, u32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let out = Command::new(nginx_bin()?).arg("-v").output().ok()?;
        // "nginx version: nginx/1.22.1" (on stderr), maybe with a suffix.
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        let v = text.split("nginx/").nth(1)?;
        let mut parts = v
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??, parts.next()??))
    })
}

/// The `listen` directive(s) for HTTP/2 on `{PORT}` (TLS with ALPN h2 when
/// `tls`, else cleartext prior knowledge), in the syntax the installed nginx
/// takes: `listen ... http2;` before 1.25.1, `listen ...; http2 on;` after.
pub fn nginx_listen_h2(tls: bool) -> String {
    let ssl = if tls { " ssl" } else { "" };
    if nginx_version().is_some_and(|v| v >= (1, 25, 1)) {
        format!("listen 127.0.0.1:{{PORT}}{ssl}; http2 on;")
    } else {
        format!("listen 127.0.0.1:{{PORT}}{ssl} http2;")
    }
}

/// A loopback port that was free a moment ago (bound to :0, then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A third-party process a test started, listening on 127.0.0.1:`port`.
/// Dropping it kills that process (only that one) and reaps it.
#[derive(Debug)]
pub struct Child {
    pub port: u16,
    process: std::process::Child,
    /// nginx's prefix directory (config, logs, temp files); removed after the
    /// process is gone.
    dir: Option<tempfile::TempDir>,
}

impl Child {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn id(&self) -> u32 {
        self.process.id()
    }

    /// The process's own directory (nginx's prefix), if it has one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.process.try_wait(), Ok(None))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A `Command` running tests/servers/<script> with [`python`]; `None` without
/// that python.
pub fn py_command(script: &str) -> Option<Command> {
    let mut cmd = Command::new(python()?);
    cmd.arg(server_script(script)).stdin(Stdio::null());
    Some(cmd)
}

/// Starts tests/servers/<script> `args` with [`python`] and waits (10 s at
/// most) for its `PORT <n>` line. `None` without that python; panics if the
/// script fails to start. Its stderr goes to the test's stderr.
pub fn py_server(script: &str, args: &[&str]) -> Option<Child> {
    let mut cmd = py_command(script)?;
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {script}: {e}"));
    let stdout = process.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Reads the first line, then keeps draining stdout until the process is
    // gone, so nothing it prints later can block it.
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        for _ in lines.by_ref() {}
    });
    let line = rx.recv_timeout(START_TIMEOUT);
    let port = match &line {
        Ok(Some(Ok(l))) => l
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse::<u16>().ok()),
        _ => None,
    };
    let Some(port) = port else {
        let _ = process.kill();
        let status = process.wait();
        panic!("{script} {args:?} did not print `PORT <n>` within {START_TIMEOUT:?}: got {line:?}, exit {status:?}");
    };
    Some(Child {
        port,
        process,
        dir: None,
    })
}

/// Runs `cmd` to completion, killing it if it takes longer than `limit`
/// (then the status is the kill's). Stdout and stderr are captured.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut process = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    }
    let out = drain(process.stdout.take().unwrap());
    let err = drain(process.stderr.take().unwrap());
    let deadline = real_now() + limit;
    let status = loop {
        if let Some(status) = process.try_wait().unwrap() {
            break status;
        }
        if real_now() >= deadline {
            let _ = process.kill();
            break process.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Waits until 127.0.0.1:`port` accepts a connection; false after `limit`.
pub fn wait_for_port(port: u16, limit: Duration) -> bool {
    let deadline = real_now() + limit;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while real_now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Starts nginx in the foreground (one process, no master) on a generated
/// configuration: `server_block` (a whole `server { ... }`, in which every
/// `{PORT}` becomes a free loopback port) inside an `http {}` with
/// access_log off, and every path nginx writes inside a fresh temporary
/// prefix directory. Waits (10 s at most) until the port accepts
/// connections. `None` without nginx; panics, with nginx's error log, if it
/// fails to start. Use [`nginx_listen_h2`] for an HTTP/2 `listen`.
pub fn nginx(server_block: &str) -> Option<Child> {
    let bin = nginx_bin()?;
    let dir = tempfile::Builder::new()
        .prefix("weir-nginx")
        .tempdir()
        .unwrap();
    let d = dir.path().display().to_string();
    let port = free_port();
    // As root nginx would otherwise look up `nobody` for its (here unused)
    // worker processes; as anyone else the directive is ignored.
    let user = if running_as_root() { "user root;" } else { "" };
    let server = server_block.replace("{PORT}", &port.to_string());
    let conf = format!(
        "{user}
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
lock_file {d}/nginx.lock;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    default_type text/plain;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
{server}
}}
"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, &conf).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let process = Command::new(bin)
        .arg("-p")
        .arg(format!("{d}/"))
        .arg("-e")
        .arg(format!("{d}/error.log"))
        .arg("-c")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("starting nginx: {e}"));
    let mut child = Child {
        port,
        process,
        dir: Some(dir),
    };
    let deadline = real_now() + START_TIMEOUT;
    loop {
        if !child.running() {
            panic!("nginx exited at start:\n{}\n{conf}", nginx_logs(&child));
        }
        if TcpStream::connect_timeout(&child.addr(), Duration::from_millis(200)).is_ok() {
            return Some(child);
        }
        if real_now() >= deadline {
            panic!(
                "nginx did not accept connections on {} within {START_TIMEOUT:?}:\n{}\n{conf}",
                child.port,
                nginx_logs(&child)
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// nginx's stderr and error log so far.
pub fn nginx_logs(child: &Child) -> String {
    let Some(dir) = child.dir() else {
        return String::new();
    };
    ["stderr.log", "error.log"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A certificate for `localhost` and 127.0.0.1 that nginx can serve, made
/// here with rcgen the way tests/tls.rs makes them: a private CA signs the
/// leaf. Writes `nginx-cert.pem`, `nginx-key.pem` and `nginx-ca.pem` into
/// `dir`; returns (cert path, key path, the CA's PEM to trust).
pub fn nginx_tls_files(dir: &Path) -> (PathBuf, PathBuf, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "weir third-party test CA");
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let ca_pem = ca.pem();
    let cert_path = dir.join("nginx-cert.pem");
    let key_path = dir.join("nginx-key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::write(dir.join("nginx-ca.pem"), &ca_pem).unwrap();
    (cert_path, key_path, ca_pem)
}
