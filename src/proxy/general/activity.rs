//! What one client connection has in flight, for its limits: requests in
//! flight and since when it has had none (`client_idle_timeout`), the
//! frames handed on that the client has not taken (`client_write_timeout`),
//! and requests abandoned per second (`max_resets_per_second`). Both
//! HTTP/2 and hyper's HTTP/1.1 connections keep one
//! (docs/reference/deadlines.md#deadlines-and-timeouts, "Client connections").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// Requests in flight on one connection, since when it has had none, and
/// the frames handed to hyper that the client has not taken: an HTTP/2
/// connection that holds no stream (or an HTTP/1.1 one between requests)
/// for `client_idle_timeout` is closed, so idle sockets cannot take every
/// connection slot; one whose client takes nothing of a response for
/// `client_write_timeout` is dropped, so a client that stops reading cannot
/// hold its requests' slots forever.
#[derive(Debug)]
pub(super) struct Activity {
    in_flight: AtomicUsize,
    quiet_since: Mutex<Instant>,
    /// One entry per response body: when it last handed hyper a frame that
    /// hyper has not come back for (hyper asks a body for more only once it
    /// could send what it got — a full socket, or no HTTP/2 window).
    handed: Mutex<Vec<Weak<Mutex<Option<Instant>>>>>,
    /// Woken when a request begins or is abandoned.
    changed: tokio::sync::Notify,
    /// Requests abandoned (their response not finished) in the current
    /// second, and that second's start; above `max_resets`, the connection
    /// ends.
    resets: Mutex<(Instant, u32)>,
    max_resets: u32,
}

/// Why [`Activity::watch`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ActivityEnd {
    Idle,
    Stalled,
    Resets,
}

impl Activity {
    pub(super) fn new(max_resets: u32) -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            quiet_since: Mutex::new(Instant::now()),
            handed: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            resets: Mutex::new((Instant::now(), 0)),
            max_resets,
        }
    }

    /// Counts an abandoned request; `true` once this second has seen more
    /// than `max_resets`.
    fn abandoned(&self) -> bool {
        let Ok(mut r) = self.resets.lock() else {
            return false;
        };
        let now = Instant::now();
        if now.duration_since(r.0) >= Duration::from_secs(1) {
            *r = (now, 0);
        }
        r.1 += 1;
        r.1 > self.max_resets
    }

    fn too_many_resets(&self) -> bool {
        self.resets
            .lock()
            .is_ok_and(|r| r.1 > self.max_resets && r.0.elapsed() < Duration::from_secs(1))
    }

    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let handed = Arc::new(Mutex::new(None));
        if let Ok(mut all) = self.handed.lock() {
            // Ended requests are swept now and then, not on every request.
            if all.len() > 2 * before + 16 {
                all.retain(|w| w.strong_count() > 0);
            }
            all.push(Arc::downgrade(&handed));
        }
        // Only the first request in flight moves the watcher's deadline
        // (from the idle one to the write one); later ones need no wake-up.
        if before == 0 {
            self.changed.notify_one();
        }
        Busy {
            activity: self.clone(),
            handed,
            done: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The oldest frame handed to hyper and not yet taken by the client.
    fn oldest_handoff(&self) -> Option<Instant> {
        let all = self.handed.lock().ok()?;
        all.iter()
            .filter_map(|w| w.upgrade())
            .filter_map(|h| h.lock().ok().and_then(|t| *t))
            .min()
    }

    /// Resolves once the connection has had nothing in flight for `idle`,
    /// or a response has waited on the client for `write`.
    pub(super) async fn watch(&self, idle: Duration, write: Duration) -> ActivityEnd {
        loop {
            if self.too_many_resets() {
                return ActivityEnd::Resets;
            }
            let now = Instant::now();
            let next = if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = self.quiet_since.lock().map(|t| *t).unwrap_or(now);
                if since + idle <= now {
                    return ActivityEnd::Idle;
                }
                since + idle
            } else {
                match self.oldest_handoff() {
                    Some(t) if t + write <= now => return ActivityEnd::Stalled,
                    Some(t) => t + write,
                    None => now + write,
                }
            };
            // A request arriving may bring the next deadline forward.
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = self.changed.notified() => {}
            }
        }
    }
}

/// One request in flight; its end (drop) may start the quiet period.
#[derive(Debug)]
pub(super) struct Busy {
    activity: Arc<Activity>,
    handed: Arc<Mutex<Option<Instant>>>,
    /// Its response went out whole (the body said it had ended, or was
    /// read to its end); dropped before that, it was abandoned.
    done: std::sync::atomic::AtomicBool,
}

impl Busy {
    pub(super) fn handed_now(&self) {
        if let Ok(mut t) = self.handed.lock() {
            *t = Some(Instant::now());
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) && self.activity.abandoned() {
            self.activity.changed.notify_one();
        }
        if self.activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Ok(mut t) = self.activity.quiet_since.lock() {
                *t = Instant::now();
            }
            // The watcher's deadline moves from the write one to the idle
            // one, which may be sooner (`client_idle_timeout` <
            // `client_write_timeout`).
            self.activity.changed.notify_one();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted as in flight, and
    /// notes each frame it hands to hyper until hyper asks for the next.
    pub(super) struct Holding<B> {
        #[pin]
        inner: B,
        busy: Busy,
    }
}

impl<B> Holding<B> {
    pub(super) fn new(inner: B, busy: Busy) -> Self {
        Holding { inner, busy }
    }
}

impl<B: http_body::Body> http_body::Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let r = this.inner.poll_frame(cx);
        if let Ok(mut t) = this.busy.handed.lock() {
            *t = match &r {
                std::task::Poll::Ready(Some(Ok(_))) => Some(Instant::now()),
                _ => None,
            };
        }
        // The end, or trailers, which are always the last frame: hyper's
        // HTTP/2 server ends the stream with them and never asks again, so
        // a gRPC response is not taken for one the client abandoned.
        let last = match &r {
            std::task::Poll::Ready(None) => true,
            std::task::Poll::Ready(Some(Ok(frame))) => frame.is_trailers(),
            _ => false,
        };
        if last {
            this.busy.done.store(true, Ordering::Release);
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            // hyper may stop here without asking for the end.
            self.busy.done.store(true, Ordering::Release);
        }
        end
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
