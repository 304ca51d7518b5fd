//! `weir health` (docs/reference/cli.md#weir-health): asks a running weir's
//! admin listener whether it is ready, over plain HTTP/1.1, for a container
//! health check in an image that has no curl (distroless). The address is
//! given, or read from the config file's `[server] admin` alone — a config
//! being edited into something invalid does not make a running weir
//! unhealthy; the whole exchange is bounded by one timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// More than any admin answer to `/readyz` or `/healthz`.
const MAX_ANSWER: u64 = 64 << 10;

/// What the admin listener answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// The address to ask: an unspecified one (`0.0.0.0`, `[::]`), which a
/// listener binds but nothing can connect to, becomes the loopback address
/// of its family.
pub fn target(admin: SocketAddr) -> SocketAddr {
    match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), admin.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), admin.port())
        }
        _ => admin,
    }
}

/// `[server] admin` of the config file at `path` (the built-in default when
/// the file does not set it), read without validating the rest.
pub fn admin_of(path: &Path) -> Result<SocketAddr, String> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&src).map_err(|e| format!("{}: not TOML: {e}", path.display()))?;
    let builtin = crate::config::raw::RawServer::builtin().admin;
    let admin = match table.get("server").and_then(|s| s.get("admin")) {
        None => builtin.unwrap_or_default(),
        Some(toml::Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(format!(
                "{}: server.admin must be a string, not {other}",
                path.display()
            ))
        }
    };
    admin
        .parse()
        .map_err(|e| format!("{}: server.admin {admin:?}: {e}", path.display()))
}

/// The built-in default's `[server] admin`.
fn builtin_admin() -> Result<SocketAddr, String> {
    let admin = crate::config::raw::RawServer::builtin()
        .admin
        .unwrap_or_default();
    admin
        .parse()
        .map_err(|e| format!("the built-in server.admin {admin:?}: {e}"))
}

/// `weir health`: asks, prints the answer, and says 0 for a 200. `config`
/// `None`: no file, the built-in default's admin address.
pub fn run(
    config: Option<&Path>,
    admin: Option<SocketAddr>,
    path: &str,
    timeout: Duration,
) -> ExitCode {
    let of_config = || match config {
        Some(c) => admin_of(c),
        None => builtin_admin(),
    };
    let admin = match admin.map_or_else(of_config, Ok) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("weir health: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weir health: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let asked = format!("{}{path}", target(admin));
    match rt.block_on(probe(admin, path, timeout)) {
        Ok(a) if a.status == 200 => {
            print!("{asked}: {}\n{}", a.status, a.body);
            ExitCode::SUCCESS
        }
        Ok(a) => {
            eprint!("weir health: {asked}: {}\n{}", a.status, a.body);
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("weir health: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `GET path` on the admin listener at `admin`, within `timeout` in all.
pub async fn probe(admin: SocketAddr, path: &str, timeout: Duration) -> Result<Answer, String> {
    let addr = target(admin);
    match tokio::time::timeout(timeout, exchange(addr, path)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{addr}: no answer within {}",
            crate::config::duration::format(timeout)
        )),
    }
}

async fn exchange(addr: SocketAddr, path: &str) -> Result<Answer, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: weir-health\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("{addr}: cannot send the request: {e}"))?;
    let mut buf = Vec::new();
    (&mut s)
        .take(MAX_ANSWER)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("{addr}: cannot read the answer: {e}"))?;
    parse(&buf).ok_or_else(|| format!("{addr}: not an HTTP answer"))
}

/// The status and body of a whole HTTP/1.1 response (the admin listener
/// answers with a `Content-Length` and closes, as asked).
fn parse(bytes: &[u8]) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(bytes).ok()? else {
        return None;
    };
    Some(Answer {
        status: resp.code?,
        body: String::from_utf8_lossy(&bytes[head..]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_address_is_asked_on_loopback() {
        let t = |a: &str| target(a.parse().unwrap_or(SocketAddr::from(([1, 1, 1, 1], 1))));
        assert_eq!(
            t("0.0.0.0:15000"),
            SocketAddr::from(([127, 0, 0, 1], 15000))
        );
        assert_eq!(t("[::]:15000").to_string(), "[::1]:15000");
        assert_eq!(t("10.0.0.5:9").to_string(), "10.0.0.5:9");
    }

    #[test]
    fn an_answer_is_its_status_and_body() {
        let a = parse(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\ndraining\n");
        assert_eq!(
            a,
            Some(Answer {
                status: 503,
                body: "draining\n".into()
            })
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n"), None);
        assert_eq!(parse(b"SSH-2.0-OpenSSH\r\n"), None);
    }
}
