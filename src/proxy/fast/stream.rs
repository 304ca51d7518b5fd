//! The fast path's upstream connections: cleartext TCP, or TLS (rustls)
//! for an `https://` upstream pinned to HTTP/1.1. One type, so the pool,
//! the exchange and the relay are written once for both.

use crate::metrics::meter::Metered;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// An upstream connection of the fast path, its socket metered (open, and
/// its bytes: `metrics::meter`).
#[derive(Debug)]
pub(crate) enum UpstreamIo {
    Plain(Metered<TcpStream>),
    Tls(Box<TlsStream<Metered<TcpStream>>>),
}

impl UpstreamIo {
    /// Whether an idle connection is still open, without a system call in
    /// the common case. Cleartext: nothing has been seen on it since its
    /// last read, so the runtime reports it not readable; when it is, a read
    /// tells (the upstream closed it, or sent bytes nobody asked for —
    /// either way it is not used again). TLS: a read that finds no
    /// application data says it is open (rustls takes session tickets by
    /// itself); a `close_notify`, a close or stray data say it is not.
    pub(crate) fn still_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self {
            UpstreamIo::Plain(s) => match s.get_mut().poll_read_ready(&mut cx) {
                Poll::Pending => true,
                Poll::Ready(Err(_)) => false,
                Poll::Ready(Ok(())) => {
                    let mut byte = [0u8; 1];
                    let s = s.get_mut();
                    matches!(s.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                }
            },
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
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
