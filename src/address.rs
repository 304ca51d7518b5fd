//! Where a socket is (docs/reference/endpoints.md#addresses): a TCP socket
//! address, or the path of a Unix-domain socket. A leaf: every layer may
//! name one. Everything that names an upstream's endpoint — the balancer,
//! ejection, the pools, the status page, the `endpoint` label, the access
//! log and the trace span — carries an [`Address`] (`upstream::Address`),
//! and only the upstream layer's dialler (`upstream::pool::open`) looks at
//! its kind.
//!
//! An `Address` is `Copy`, like the `SocketAddr` it replaces: a socket path
//! is interned once (leaked into a process-wide set, so each distinct path
//! costs its bytes once for the life of the process, however often a
//! reload names it again).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{LazyLock, Mutex};

/// Where an endpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Address {
    /// A TCP endpoint: an address a name resolved to, or an IP literal.
    Tcp(SocketAddr),
    /// A Unix-domain socket: `unix:/run/app.sock` in the config.
    Unix(&'static Path),
}

static PATHS: LazyLock<Mutex<HashSet<&'static Path>>> = LazyLock::new(Default::default);

impl Address {
    /// The address of the Unix-domain socket at `path` (interned).
    pub fn unix(path: &Path) -> Address {
        let mut paths = PATHS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = paths.get(path) {
            return Address::Unix(p);
        }
        let p: &'static Path = Box::leak(path.to_path_buf().into_boxed_path());
        paths.insert(p);
        Address::Unix(p)
    }

    /// The TCP address, if this is one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Address::Tcp(a) => Some(*a),
            Address::Unix(_) => None,
        }
    }

    /// Whether this is a Unix-domain socket.
    pub fn is_unix(&self) -> bool {
        matches!(self, Address::Unix(_))
    }
}

/// `unix:/run/app.sock` (an absolute path), or a socket address
/// (`10.0.0.5:8080`, `[::1]:8080`); no name is resolved here.
impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Address, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = Path::new(path);
            if !path.is_absolute() {
                return Err(format!("{s}: a socket path must be absolute"));
            }
            return Ok(Address::unix(path));
        }
        s.parse::<SocketAddr>()
            .map(Address::Tcp)
            .map_err(|e| format!("{s}: {e}"))
    }
}

impl From<SocketAddr> for Address {
    fn from(a: SocketAddr) -> Address {
        Address::Tcp(a)
    }
}

/// `10.0.0.5:8080`, `[::1]:8080`, or `unix:/run/app.sock`: the form the
/// config takes, the status page shows and the `endpoint` label carries.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(a) => a.fmt(f),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_interned_once_and_shown_as_configured() {
        let a = Address::unix(Path::new("/run/app.sock"));
        let b = Address::unix(Path::new("/run/app.sock"));
        assert_eq!(a, b);
        match (a, b) {
            (Address::Unix(p), Address::Unix(q)) => assert!(std::ptr::eq(p, q)),
            _ => panic!("not unix"),
        }
        assert_eq!(a.to_string(), "unix:/run/app.sock");
        assert!(a.is_unix() && a.tcp().is_none());
        let t = Address::from(SocketAddr::from(([10, 0, 0, 5], 8080)));
        assert_eq!(t.to_string(), "10.0.0.5:8080");
        assert_ne!(a, t);
        assert_eq!("unix:/run/app.sock".parse::<Address>(), Ok(a));
        assert_eq!("10.0.0.5:8080".parse::<Address>(), Ok(t));
        assert!("unix:run/app.sock".parse::<Address>().is_err());
        assert!("app:80".parse::<Address>().is_err());
    }
}
