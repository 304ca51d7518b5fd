//! A real `redis-server` (Debian's `redis-server` package) for the fleet
//! tests: each [`RedisServer`] is its own process on a free loopback port,
//! with no persistence (`--save "" --appendonly no`) and its working files
//! in a temporary directory, killed by its PID and reaped when dropped.
//!
//! Without `redis-server` on PATH, [`RedisServer::start`] returns `None`
//! and the test says it was skipped — unless WEIR_REQUIRE_REDIS is set (as
//! `.ci/run` sets it after installing the package), when it fails instead.

use super::third_party::free_port;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What to install, for messages.
pub const REDIS_TOOL: &str = "redis-server (apt-get install redis-server)";

/// How long a server gets to answer PING after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

#[allow(clippy::disallowed_methods)] // real time: another process is waited for
fn real_now() -> Instant {
    Instant::now()
}

/// Whether `redis-server --version` runs.
pub fn available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A redis-server this test started.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    process: Option<std::process::Child>,
    dir: tempfile::TempDir,
    /// TLS only, with this certificate and key (PEM files).
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// A config file's text (written into `dir`, given first) and more
    /// arguments: a replica, a Sentinel, a Cluster node.
    conf: Option<String>,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING; `None`
    /// (after saying SKIPPED) without redis-server, a failure with
    /// WEIR_REQUIRE_REDIS set.
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with(None)
    }

    /// Like [`RedisServer::start`], serving TLS only (`rediss://`) with
    /// `cert` and `key`; waits until its port accepts connections.
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Option<RedisServer> {
        RedisServer::start_with(Some((cert.to_path_buf(), key.to_path_buf())))
    }

    /// Like [`RedisServer::start`], on `port` (one a test held for
    /// something else first, such as a server that speaks no RESP).
    pub fn start_on(port: u16) -> Option<RedisServer> {
        RedisServer::start_at(port, None)
    }

    fn start_with(tls: Option<(std::path::PathBuf, std::path::PathBuf)>) -> Option<RedisServer> {
        RedisServer::start_at(free_port(), tls)
    }

    fn start_at(
        port: u16,
        tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Option<RedisServer> {
        if !available() {
            assert!(
                std::env::var_os("WEIR_REQUIRE_REDIS").is_none(),
                "{REDIS_TOOL} is required here (WEIR_REQUIRE_REDIS is set; .ci/run installs it)"
            );
            eprintln!("SKIPPED: {REDIS_TOOL} is not available");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("weir-redis")
            .tempdir()
            .unwrap();
        let mut s = RedisServer {
            port,
            process: None,
            dir,
            tls,
            conf: None,
            args: Vec::new(),
        };
        s.spawn();
        Some(s)
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).unwrap();
        let mut cmd = Command::new("redis-server");
        if let Some(conf) = &self.conf {
            let path = self.dir.path().join("redis.conf");
            std::fs::write(&path, conf).unwrap();
            cmd.arg(path);
        }
        cmd.args(&self.args);
        match &self.tls {
            None => cmd.args(["--port", &self.port.to_string()]),
            Some((cert, key)) => cmd
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .args(["--tls-auth-clients", "no"]),
        };
        let process = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting redis-server: {e}"));
        self.process = Some(process);
        let deadline = real_now() + START_TIMEOUT;
        while !self.pings() {
            if real_now() >= deadline {
                let log = std::fs::read_to_string(self.dir.path().join("redis.log"));
                panic!(
                    "redis-server did not answer PING on port {} within {START_TIMEOUT:?}:\n{}",
                    self.port,
                    log.unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers PING now (with TLS: accepts a connection).
    pub fn pings(&self) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://127.0.0.1:PORT/0`, or `rediss://localhost:PORT/0` with TLS.
    pub fn url(&self) -> String {
        match self.tls {
            None => format!("redis://127.0.0.1:{}/0", self.port),
            Some(_) => format!("rediss://localhost:{}/0", self.port),
        }
    }

    /// One started with `args` added (`--replicaof 127.0.0.1 PORT`,
    /// `--cluster-enabled yes`, …) and, when `conf` is given, that config
    /// file first (`{port}` in it is replaced by the port).
    pub fn start_args(conf: Option<&str>, args: &[&str]) -> Option<RedisServer> {
        let port = free_port();
        if !available() {
            return RedisServer::start_at(port, None);
        }
        let dir = tempfile::Builder::new()
            .prefix("weir-redis")
            .tempdir()
            .unwrap();
        let mut s = RedisServer {
            port,
            process: None,
            dir,
            tls: None,
            conf: conf.map(|c| c.replace("{port}", &port.to_string())),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        Some(s)
    }

    /// A Sentinel watching the primary on `primary` as `name` (quorum 2,
    /// down after 500 ms).
    pub fn sentinel(name: &str, primary: u16) -> Option<RedisServer> {
        let conf = format!(
            "port {{port}}\nbind 127.0.0.1\n\
             sentinel monitor {name} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {name} 500\n\
             sentinel failover-timeout {name} 3000\n\
             sentinel parallel-syncs {name} 1\n"
        );
        RedisServer::start_args(Some(&conf), &["--sentinel"])
    }

    /// Sends one command (inline) and reads what comes back within 500 ms,
    /// as text: enough to look for `role:master` or `+OK`.
    pub fn command(&self, args: &[&str]) -> String {
        RedisServer::command_port(self.port, args)
    }

    /// [`RedisServer::command`] to the server on `port` of 127.0.0.1.
    pub fn command_port(port: u16, args: &[&str]) -> String {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        if s.write_all(req.as_bytes()).is_err() {
            return String::new();
        }
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.id())
    }

    /// Kills it (SIGKILL, by its PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    /// Starts it again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends SIGSTOP (`pause = true`) or SIGCONT to it: a server that
    /// stops answering without closing its connections.
    pub fn pause(&self, pause: bool) {
        let Some(pid) = self.pid() else { return };
        let signal = if pause { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {pid}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped process still dies of SIGKILL.
        self.kill();
    }
}
