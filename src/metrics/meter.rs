//! One upstream's wire meter (docs/reference/metrics.md#metrics): its open
//! connections and the bytes each way, counted where the bytes cross the
//! socket, for both paths' connections (the general path's pools, a client
//! connection's held ones, the fast path's).

use prometheus::{IntCounter, IntGauge};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `weir_upstream_connections_open` and `weir_upstream_bytes_total` of one
/// upstream: handles resolved once, cheap to clone.
#[derive(Debug, Clone)]
pub struct Meter {
    open: IntGauge,
    sent: IntCounter,
    received: IntCounter,
}

impl Meter {
    pub fn new(open: IntGauge, sent: IntCounter, received: IntCounter) -> Self {
        Meter {
            open,
            sent,
            received,
        }
    }

    /// A meter no registry reads (a client built in a unit test); its names
    /// are not `weir_` ones, so no reference lists them.
    pub fn unregistered() -> Self {
        let valid = "constant, valid metric names";
        Meter::new(
            IntGauge::new("unregistered_open", "-").expect(valid),
            IntCounter::new("unregistered_sent", "-").expect(valid),
            IntCounter::new("unregistered_received", "-").expect(valid),
        )
    }

    /// Bytes written to the upstream.
    pub fn sent(&self, n: usize) {
        self.sent.inc_by(n as u64);
    }

    /// Bytes read from the upstream.
    pub fn received(&self, n: usize) {
        self.received.inc_by(n as u64);
    }

    /// A new connection, counted open until the returned guard drops.
    pub fn opened(&self) -> Open {
        self.open.inc();
        Open(self.open.clone())
    }
}

/// One open upstream connection in `weir_upstream_connections_open`.
#[derive(Debug)]
pub struct Open(IntGauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A connection to an upstream whose bytes and life the meter counts.
#[derive(Debug)]
pub struct Metered<S> {
    inner: S,
    meter: Meter,
    _open: Open,
}

impl<S> Metered<S> {
    pub fn new(inner: S, meter: &Meter) -> Self {
        Metered {
            inner,
            meter: meter.clone(),
            _open: meter.opened(),
        }
    }

    /// The connection itself, for what only it can do (readiness, a
    /// non-blocking write); bytes moved through it are the caller's to
    /// count ([`Metered::meter`]).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.meter
            .received(buf.filled().len().saturating_sub(before));
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.meter.sent(n);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
