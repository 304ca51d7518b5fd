//! weir's upstream connections, of either protocol: cleartext TCP, a
//! Unix-domain socket (`unix:` endpoints, cleartext), or TLS
//! (rustls) for an `https://` upstream ([`FastTls`], ALPN by the upstream's
//! protocol). One type, so the pools, the exchange and the relay are written
//! once for both.

use crate::metrics::meter::Metered;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

/// An upstream connection of the fast path, its socket metered (open, and
/// its bytes: `metrics::meter`).
#[derive(Debug)]
pub(crate) enum UpstreamIo {
    Plain(Metered<TcpStream>),
    Unix(Metered<UnixStream>),
    Tls(Box<TlsStream<Metered<TcpStream>>>),
}

impl UpstreamIo {
    /// Whether the upstream chose HTTP/2 by ALPN (never over cleartext).
    pub(crate) fn chose_h2(&self) -> bool {
        match self {
            UpstreamIo::Plain(_) | UpstreamIo::Unix(_) => false,
            UpstreamIo::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }

    /// Whether an idle connection is still open, without a system call in
    /// the common case. Cleartext: nothing has been seen on it since its
    /// last read, so the runtime reports it not readable; when it is, a read
    /// tells (the upstream closed it, or sent bytes nobody asked for —
    /// either way it is not used again). TLS: a read that finds no
    /// application data says it is open (rustls takes session tickets by
    /// itself); a `close_notify`, a close or stray data say it is not.
    pub(crate) fn still_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        // A cleartext socket of either kind: the same calls, no trait of
        // tokio's in common.
        macro_rules! quiet {
            ($s:expr) => {
                match $s.poll_read_ready(&mut cx) {
                    Poll::Pending => true,
                    Poll::Ready(Err(_)) => false,
                    Poll::Ready(Ok(())) => {
                        let mut byte = [0u8; 1];
                        matches!($s.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                    }
                }
            };
        }
        match self {
            UpstreamIo::Plain(s) => quiet!(s.get_mut()),
            UpstreamIo::Unix(s) => quiet!(s.get_mut()),
            UpstreamIo::Tls(s) => {
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                matches!(
                    Pin::new(s.as_mut()).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                )
            }
        }
    }
}

impl AsyncRead for UpstreamIo {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Unix(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Unix(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Unix(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Unix(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS for weir's upstream connections (both paths', both protocols): the
/// upstream's client configuration (its roots, client certificate and
/// session cache) with ALPN by its protocol — `http/1.1` alone for
/// `http1`, `h2` alone for `h2c`/`grpc`, `h2` then `http/1.1` for `auto`
/// — the name to verify, and a tag that keeps its pooled connections apart
/// from any other upstream's at the same address.
pub struct FastTls {
    pub connector: tokio_rustls::TlsConnector,
    pub name: rustls::pki_types::ServerName<'static>,
    pub tag: u64,
}

impl std::fmt::Debug for FastTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastTls")
            .field("name", &self.name)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl FastTls {
    pub(crate) fn new(
        u: &crate::config::UpstreamConfig,
        tls: &crate::config::files::ClientTls,
        name: Option<&str>,
    ) -> Result<Self, String> {
        let host = u.url.host.trim_start_matches('[').trim_end_matches(']');
        let name = name.unwrap_or(host).to_string();
        let server = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("upstream {:?}: TLS server name {name:?}: {e}", u.name))?;
        let mut config = (*tls.config).clone();
        use crate::config::Protocol;
        config.alpn_protocols = match u.protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::H2c | Protocol::Grpc => vec![b"h2".to_vec()],
            Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        let tag = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (tls.fingerprint, &name, &u.name, u.protocol as u8).hash(&mut h);
            h.finish() | 1
        };
        Ok(FastTls {
            connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
            name: server,
            tag,
        })
    }
}
