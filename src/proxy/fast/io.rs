//! The fast path's waits on sockets: reads that grow their buffer, the
//! watch for a client that leaves, writes bounded by `client_write_timeout`,
//! and the one lazily armed timer per connection.

use std::io;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// Buffers kept larger than this between requests are given back.
pub(super) const KEEP_CAPACITY: usize = 64 * 1024;

/// One connection's buffers, reused by every request on it.
pub(super) struct Bufs {
    /// Bytes from the client: the current request, and any pipelined after it.
    pub(super) client: Vec<u8>,
    /// The upstream request: head and body, written as one.
    pub(super) request: Vec<u8>,
    /// Bytes from the upstream.
    pub(super) upstream: Vec<u8>,
    /// Bytes for the client.
    pub(super) out: Vec<u8>,
    /// Where in `out` the response fields a stored response keeps lie
    /// (`head::Response::kept`). Kept here, not in the exchange, which is
    /// moved by value through the attempt loop on every request.
    pub(super) kept: Option<(usize, usize)>,
    /// The client closed its side after pipelining requests: they are
    /// served, then the connection closes.
    pub(super) eof: bool,
}

impl Bufs {
    /// Nothing is allocated until a request needs it: an idle connection
    /// costs its task and socket only.
    pub(super) fn new() -> Self {
        Bufs {
            client: Vec::new(),
            request: Vec::new(),
            upstream: Vec::new(),
            out: Vec::new(),
            kept: None,
            eof: false,
        }
    }

    /// Drops the request just served; shrinks what one large message grew.
    pub(super) fn next_request(&mut self, consumed: usize) {
        self.client.drain(..consumed.min(self.client.len()));
        for b in [
            &mut self.client,
            &mut self.request,
            &mut self.upstream,
            &mut self.out,
        ] {
            if b.capacity() > KEEP_CAPACITY && b.len() < 4096 {
                b.shrink_to(8192);
            }
        }
    }
}

/// One timer per connection, armed lazily: it is moved only when a wait
/// needs it earlier than it is set. Deadlines on a keep-alive connection
/// (head, request, idle body) mostly lie later than the last one armed, so
/// a request usually touches no timer at all; when an early arming fires,
/// the wait re-arms it for its own deadline.
pub(super) struct Timer {
    sleep: Pin<Box<Sleep>>,
}

impl Timer {
    pub(super) fn new(now: Instant) -> Self {
        // Never registered at this deadline: the first wait moves it earlier.
        Timer {
            sleep: Box::pin(tokio::time::sleep_until(now + Duration::from_secs(86_400))),
        }
    }

    /// Completes once `at` has passed.
    pub(super) async fn at(&mut self, at: Instant) {
        if self.sleep.deadline() > at {
            self.sleep.as_mut().reset(at);
        }
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= at {
                return;
            }
            self.sleep.as_mut().reset(at);
        }
    }
}

/// Reads what has arrived onto the end of `buf`. The room it reads into
/// starts at 4 KiB and doubles (to 64 KiB) while reads fill it, so a small
/// exchange keeps small buffers and a large body moves in large reads.
pub(super) async fn read_more<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
) -> io::Result<usize> {
    let spare = buf.capacity() - buf.len();
    if spare < 1024 {
        buf.reserve(4096.max(buf.capacity().min(KEEP_CAPACITY)));
    }
    let room = buf.capacity() - buf.len();
    let n = s.read_buf(buf).await?;
    if n == room && buf.capacity() < KEEP_CAPACITY {
        buf.reserve(buf.capacity());
    }
    Ok(n)
}

/// How far past the request being served a client may pipeline before weir
/// stops reading from it.
const PIPELINE_CAP: usize = 64 * 1024;

/// Completes when the client goes away while the request in the first
/// `keep` bytes of `buf` is served. Bytes it pipelines meanwhile are kept;
/// a client that closes its side after pipelining whole requests is not
/// gone (`eof` records it): what it sent is served first, as hyper does.
pub(super) async fn client_gone(s: &mut TcpStream, buf: &mut Vec<u8>, keep: usize, eof: &mut bool) {
    loop {
        if *eof || buf.len() >= keep + PIPELINE_CAP {
            std::future::pending::<()>().await;
        }
        match read_more(s, buf).await {
            Ok(0) if buf.len() > keep => *eof = true,
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Writes `bytes` to the client. A client that takes nothing for `limit`
/// (`client_write_timeout`) is given up on: the connection ends and its
/// slot is freed. A write that goes through at once arms no timer.
pub(super) async fn write_client(s: &mut TcpStream, mut bytes: &[u8], limit: Duration) -> bool {
    while !bytes.is_empty() {
        match s.try_write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !matches!(tokio::time::timeout(limit, s.writable()).await, Ok(Ok(()))) {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}
