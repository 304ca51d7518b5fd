//! `[server]`, validated: the listeners, the limits and timeouts of
//! client connections, inbound TLS.

use super::super::raw::RawServer;
use super::*;

pub(super) fn addr(cx: &mut ErrorSink, field: &str, s: &str) -> Option<Address> {
    if let Some(path) = s.strip_prefix("unix:") {
        if !path.starts_with('/') || path.ends_with('/') {
            cx.err(
                field,
                format!("invalid listen address {s:?}: a socket path must be absolute, e.g. \"unix:/run/weir/weir.sock\""),
            );
            return None;
        }
        return Some(Address::unix(std::path::Path::new(path)));
    }
    match s.parse::<SocketAddr>() {
        Ok(a) => Some(Address::Tcp(a)),
        Err(_) => {
            cx.err(
                field,
                format!("invalid listen address {s:?}: expected IP:PORT, e.g. \"127.0.0.1:15001\", or unix:/path"),
            );
            None
        }
    }
}

/// `socket_mode`: permissions in octal, at most `0777`.
fn socket_mode(cx: &mut ErrorSink, s: Option<&str>) -> u32 {
    let s = s.unwrap_or("0660");
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => m,
        _ => {
            cx.err(
                "server.socket_mode",
                format!("{s:?} is not a file mode in octal, e.g. \"0660\" (at most \"0777\")"),
            );
            0o660
        }
    }
}

pub(super) fn server(cx: &mut ErrorSink, s: &RawServer) -> Option<ServerConfig> {
    let listen = addr(cx, "server.listen", s.listen.as_deref().unwrap_or_default());
    let admin = addr(cx, "server.admin", s.admin.as_deref().unwrap_or_default());
    let max_connections = s.max_connections.unwrap_or_default();
    if max_connections == 0 {
        cx.err("server.max_connections", "must be at least 1");
    }
    let max_header_bytes = s.max_header_bytes.unwrap_or_default();
    if max_header_bytes < 8192 {
        cx.err(
            "server.max_header_bytes",
            format!("must be at least 8192 (hyper's smallest read buffer), got {max_header_bytes}"),
        );
    }
    let max_streams_per_connection = s.max_streams_per_connection.unwrap_or_default();
    if max_streams_per_connection == 0 {
        cx.err("server.max_streams_per_connection", "must be at least 1");
    }
    let max_resets_per_second = s.max_resets_per_second.unwrap_or_default();
    if max_resets_per_second == 0 {
        cx.err("server.max_resets_per_second", "must be at least 1");
    }
    let client_write_timeout = s.client_write_timeout.map(|d| d.0).unwrap_or_default();
    if client_write_timeout.is_zero() {
        cx.err("server.client_write_timeout", "must be greater than 0");
    }
    let client_idle_timeout = s.client_idle_timeout.map(|d| d.0).unwrap_or_default();
    if client_idle_timeout.is_zero() {
        cx.err("server.client_idle_timeout", "must be greater than 0");
    }
    let header_read_timeout = s.header_read_timeout.map(|d| d.0).unwrap_or_default();
    if header_read_timeout.is_zero() {
        cx.err("server.header_read_timeout", "must be greater than 0");
    }
    if let (Some(l), Some(a)) = (listen, admin) {
        if l == a && l.tcp().is_none_or(|t| t.port() != 0) {
            cx.err_given(
                "server.admin",
                &["server.listen".into()],
                format!("the admin listener cannot share {l} with `server.listen`"),
            );
        }
    }
    let tls = s.tls.as_ref().map(|t| ListenerTls {
        cert: PathBuf::from(&t.cert),
        key: PathBuf::from(&t.key),
    });
    if tls.is_some() && listen.is_some_and(|l| l.is_unix()) {
        cx.err_given(
            "server.tls",
            &["server.listen".into()],
            "inbound TLS is for a TCP listener; a unix: socket is reached through the file system",
        );
    }
    let socket_mode = socket_mode(cx, s.socket_mode.as_deref());
    if let Some(t) = &tls {
        files::listener(cx, "server.tls", t);
    }
    Some(ServerConfig {
        listen: listen?,
        admin: admin?,
        socket_mode,
        max_connections: max_connections as usize,
        header_read_timeout,
        client_idle_timeout,
        client_write_timeout,
        max_streams_per_connection,
        max_resets_per_second,
        access_log: s.access_log.unwrap_or_default(),
        max_header_bytes: max_header_bytes as usize,
        shutdown_timeout: s.shutdown_timeout.map(|d| d.0).unwrap_or_default(),
        tls,
        fast_path: true,
    })
}
