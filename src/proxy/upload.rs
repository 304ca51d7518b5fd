//! The request body's upload as the timers see it
//! (docs/reference/deadlines.md#uploads).
//!
//! `timeout` and `per_try_timeout` wait for the upstream's answer, so they
//! stand still while weir reads the client's body: from its first read of
//! the body until its last byte has been read (Envoy's route timeout
//! likewise starts once the request is whole). Meanwhile `idle_timeout`
//! bounds each gap in which the body does not move, and the client's own
//! deadline (`x-weir-timeout-ms`, `grpc-timeout`) counts throughout.
//!
//! A body read whole before the attempts (held for a replay, or read by the
//! fast path) moves the request's deadline on by the time it took
//! ([`Upload::read`], [`Upload::deadline`]). A body that streams through an
//! attempt is timed as it goes ([`Upload::watch`]), and the attempt's wait
//! for its answer follows it ([`Upload::within`]). Nothing here decides a
//! retry: an attempt's end is told to the driver as any other.

use crate::policy::Outcome;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::ProxyError;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// From weir's first read of the body to its end (its last byte read, or
/// the body failed or was dropped).
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    began: Option<Instant>,
    ended: Option<Instant>,
}

impl Span {
    /// How much of `from..now` the upload took: the time the timers stood
    /// still then.
    fn within(&self, from: Instant, now: Instant) -> Duration {
        let Some(began) = self.began else {
            return Duration::ZERO;
        };
        let end = self.ended.map_or(now, |e| e.min(now));
        end.saturating_duration_since(began.max(from))
    }

    /// Begun and not ended: the timers stand still.
    fn streaming(&self) -> bool {
        self.began.is_some() && self.ended.is_none()
    }
}

/// A streamed body's progress, as [`Timed`] tells it. Its span's changes
/// are told to the watchers; a frame's arrival is only written down (a
/// waiting attempt reads it when its idle check comes due).
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    span: Span,
    /// When the body last moved: its first read, or its last frame.
    moved: Option<Instant>,
    /// The last read found nothing: weir waits for the client to send more.
    waiting: bool,
}

#[derive(Debug, Clone, Default)]
enum Track {
    /// No body has been waited for.
    #[default]
    Nothing,
    /// Read whole before the attempts (the fast path's read).
    Read(Span),
    /// Timed as it is read ([`Upload::watch`]).
    Live(Arc<watch::Sender<Progress>>),
}

/// One request's upload and what bounds it: the client's own deadline and
/// `idle_timeout`. Cloned where it is read (an `Arc` at most).
#[derive(Debug, Clone)]
pub(crate) struct Upload {
    client: Option<Instant>,
    idle: Duration,
    track: Track,
}

/// Why an attempt's wait for its answer ended before the answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// The per-try deadline or the request's, as they stand once the
    /// upload's time is set aside.
    Deadline,
    /// The client sent nothing more of its body for `idle_timeout`.
    ClientIdle,
    /// The upstream took nothing more of the body for `idle_timeout`.
    UpstreamIdle,
}

impl Expired {
    /// The outcome and weir's error for an idle upload: a client that
    /// stops sending is its own doing (never retried, no verdict on the
    /// upstream) and gets 504 `deadline_exceeded`, as a stalled upload
    /// always has; an upstream that stops taking the body has timed out.
    /// `None` for [`Expired::Deadline`], whose error depends on which
    /// deadline it was (`attempt::timed_out`).
    pub(crate) fn idle_parts(self) -> Option<(Outcome, ProxyError)> {
        match self {
            Expired::Deadline => None,
            Expired::ClientIdle => Some((Outcome::ClientGone, ProxyError::DeadlineExceeded)),
            Expired::UpstreamIdle => Some((Outcome::Timeout, ProxyError::UpstreamTimeout)),
        }
    }
}

impl Upload {
    /// The upload of a request that arrived at `start` asking for `asked`
    /// (`x-weir-timeout-ms`, `grpc-timeout`), to an upstream whose
    /// `idle_timeout` is `idle`. Nothing is read yet.
    pub(crate) fn new(start: Instant, asked: [Option<Duration>; 2], idle: Duration) -> Self {
        Upload {
            client: asked.into_iter().flatten().min().map(|d| start + d),
            idle,
            track: Track::Nothing,
        }
    }

    /// The client's own deadline, if it set one.
    pub(crate) fn client(&self) -> Option<Instant> {
        self.client
    }

    /// The longest gap in the upload (`idle_timeout`).
    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    /// When reading the body must give up, after it last moved at `moved`:
    /// a gap of `idle_timeout`, or the client's own deadline.
    pub(crate) fn gives_up(&self, moved: Instant) -> Instant {
        let gap = moved + self.idle;
        self.client.map_or(gap, |c| c.min(gap))
    }

    /// The client's body, timed as it is read from now on. A body with
    /// nothing to read is returned as it is.
    pub(crate) fn watch(&mut self, body: Body) -> Body {
        if body.is_end_stream() {
            return body;
        }
        let tell = Arc::new(watch::channel(Progress::default()).0);
        self.track = Track::Live(tell.clone());
        crate::proxy::body::boxed(Timed {
            inner: body,
            tell,
            began: false,
            ended: false,
        })
    }

    /// Records a body read whole from `began` to `ended` (the fast path
    /// reads it itself).
    pub(crate) fn read(&mut self, began: Instant, ended: Instant) {
        self.track = Track::Read(Span {
            began: Some(began),
            ended: Some(ended),
        });
    }

    fn progress(&self) -> Progress {
        match &self.track {
            Track::Nothing => Progress::default(),
            Track::Read(span) => Progress {
                span: *span,
                ..Progress::default()
            },
            Track::Live(tell) => *tell.borrow(),
        }
    }

    /// How long of `from..now` the upload took: not counted against the
    /// timers, nor as the upstream's latency.
    #[inline]
    pub(crate) fn held(&self, from: Instant, now: Instant) -> Duration {
        if let Track::Nothing = self.track {
            return Duration::ZERO;
        }
        self.progress().span.within(from, now)
    }

    /// The upload's time so far; `now` is read only while it streams.
    #[inline]
    fn total(&self, now: impl FnOnce() -> Instant) -> Duration {
        if let Track::Nothing = self.track {
            return Duration::ZERO;
        }
        let span = self.progress().span;
        match span.began {
            None => Duration::ZERO,
            Some(began) => span
                .ended
                .unwrap_or_else(now)
                .saturating_duration_since(began),
        }
    }

    /// The request's deadline `d` (fixed on arrival) as it stands: moved on
    /// by the upload's time so far, never past the client's own. `now` is
    /// read only while the body streams.
    #[inline]
    pub(crate) fn deadline(&self, d: Instant, now: impl FnOnce() -> Instant) -> Instant {
        let moved = d + self.total(now);
        self.client.map_or(moved, |c| c.min(moved))
    }

    /// Whether the client's own deadline is the one that holds for a
    /// request whose deadline on arrival was `d`: then expiry is the
    /// client's doing, not the upstream's.
    #[inline]
    pub(crate) fn client_binds(&self, d: Instant, now: Instant) -> bool {
        self.client.is_some_and(|c| c < d + self.total(|| now))
    }

    /// Waits for `answer` (an attempt that started at `started`) until the
    /// attempt must give up: at `try_deadline` or `deadline` (as they stood
    /// then), each moved on by the time the upload takes meanwhile; or when
    /// the body, still to be read, does not move for `idle_timeout`.
    /// Returns both deadlines as they stand at the end.
    pub(crate) async fn within<F: Future>(
        &self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        answer: F,
    ) -> (Result<F::Output, Expired>, Instant, Instant) {
        let tell = match &self.track {
            Track::Live(tell) if tell.borrow().span.ended.is_none() => tell,
            // The body is whole (or there is none): the timers run.
            _ => {
                let r = tokio::time::timeout_at(try_deadline, answer).await;
                return (r.map_err(|_| Expired::Deadline), try_deadline, deadline);
            }
        };
        // Boxed: only a streaming upload's attempt waits this way, and every
        // attempt's future would otherwise carry it.
        let expiry = Box::pin(self.expiry(tell, started, try_deadline, deadline));
        let r = tokio::select! {
            biased;
            r = answer => Ok(r),
            e = expiry => Err(e),
        };
        let held = self.held(started, Instant::now());
        let (t, d) = self.moved((try_deadline, deadline), held);
        (r, t, d)
    }

    /// The per-try deadline and the request's, moved on by `held`, never
    /// past the client's own deadline.
    fn moved(
        &self,
        (try_deadline, deadline): (Instant, Instant),
        held: Duration,
    ) -> (Instant, Instant) {
        let d = deadline + held;
        let d = self.client.map_or(d, |c| c.min(d));
        ((try_deadline + held).min(d), d)
    }

    /// Completes when the attempt must give up (see [`Upload::within`]).
    async fn expiry(
        &self,
        tell: &watch::Sender<Progress>,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Expired {
        let mut rx = tell.subscribe();
        loop {
            let p = *rx.borrow_and_update();
            let now = Instant::now();
            let streaming = p.span.streaming();
            let until = match streaming {
                // The timers stand still; the gaps and the client's own
                // deadline do not.
                true => self.gives_up(p.moved.unwrap_or(now)),
                false => {
                    let held = p.span.within(started, now);
                    self.moved((try_deadline, deadline), held).0
                }
            };
            if now >= until {
                if !streaming || self.client.is_some_and(|c| now >= c) {
                    return Expired::Deadline;
                }
                return match p.waiting {
                    true => Expired::ClientIdle,
                    false => Expired::UpstreamIdle,
                };
            }
            tokio::select! {
                changed = rx.changed() => {
                    // Never: the sender is held by `self`.
                    if changed.is_err() {
                        tokio::time::sleep_until(until).await;
                    }
                }
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// The client's body, telling its [`Upload`] when it is first read, when
/// each frame comes, when it waits for the client, and when it ends.
struct Timed {
    inner: Body,
    tell: Arc<watch::Sender<Progress>>,
    began: bool,
    ended: bool,
}

impl Timed {
    fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        let now = Instant::now();
        self.tell.send_modify(|p| {
            p.span.ended = Some(now);
            p.waiting = false;
        });
    }
}

impl HttpBody for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.ended {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        if !this.began {
            this.began = true;
            let now = Instant::now();
            this.tell.send_modify(|p| {
                p.span.began = Some(now);
                p.moved = Some(now);
            });
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Pending => {
                this.tell.send_if_modified(|p| {
                    p.waiting = true;
                    false
                });
            }
            Poll::Ready(Some(Ok(_))) if !this.inner.is_end_stream() => {
                let now = Instant::now();
                this.tell.send_if_modified(|p| {
                    p.moved = Some(now);
                    p.waiting = false;
                    false
                });
            }
            // The last frame, the end, or a failure.
            Poll::Ready(_) => this.end(),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Timed {
    /// A body let go of before its end (the attempt ended first) is done
    /// with: the timers run again.
    fn drop(&mut self) {
        if self.began {
            self.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_span_counts_only_its_part_of_a_window() {
        let t0 = Instant::now();
        let span = Span {
            began: Some(t0 + 100 * MS),
            ended: Some(t0 + 400 * MS),
        };
        assert_eq!(span.within(t0, t0 + 1000 * MS), 300 * MS);
        assert_eq!(span.within(t0 + 200 * MS, t0 + 1000 * MS), 200 * MS);
        assert_eq!(span.within(t0 + 500 * MS, t0 + 1000 * MS), Duration::ZERO);
        assert_eq!(span.within(t0, t0 + 250 * MS), 150 * MS);
        let open = Span {
            began: Some(t0 + 100 * MS),
            ended: None,
        };
        assert_eq!(open.within(t0, t0 + 700 * MS), 600 * MS);
        assert_eq!(Span::default().within(t0, t0 + 700 * MS), Duration::ZERO);
    }

    #[test]
    fn the_deadline_moves_by_the_upload_never_past_the_clients_own() {
        let t0 = Instant::now();
        let mut u = Upload::new(t0, [None, None], Duration::from_secs(60));
        let d = t0 + 500 * MS;
        assert_eq!(u.deadline(d, || t0), d);
        u.read(t0 + 100 * MS, t0 + 1100 * MS);
        assert_eq!(u.deadline(d, || t0), d + 1000 * MS);
        assert!(!u.client_binds(d, t0));
        let mut c = Upload::new(t0, [Some(800 * MS), None], Duration::from_secs(60));
        c.read(t0 + 100 * MS, t0 + 1100 * MS);
        assert_eq!(c.deadline(d, || t0), t0 + 800 * MS);
        assert!(c.client_binds(d, t0));
        assert_eq!(c.gives_up(t0 + 100 * MS), t0 + 800 * MS);
        assert_eq!(u.gives_up(t0 + 100 * MS), t0 + 60_100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_after_the_upload_waits_the_per_try_span_from_its_end() {
        use http_body_util::BodyExt;
        let t0 = Instant::now();
        let mut u = Upload::new(t0, [None, None], Duration::from_secs(1));
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let b = rx.recv().await?;
            Some((Ok::<_, BoxError>(Frame::data(b)), rx))
        });
        let mut body = u.watch(crate::proxy::body::boxed(http_body_util::StreamBody::new(
            stream,
        )));
        // The client sends a chunk every 300 ms for 900 ms; the attempt's
        // answer never comes: it gives up 500 ms after the body's end.
        let reader = async move { while let Some(Ok(_)) = body.frame().await {} };
        let sender = async move {
            for _ in 0..4 {
                let _ = tx.send(Bytes::from_static(b"x")).await;
                tokio::time::sleep(300 * MS).await;
            }
        };
        let waited = u.within(
            t0,
            t0 + 500 * MS,
            t0 + 15_000 * MS,
            std::future::pending::<()>(),
        );
        let ((r, t, d), (), ()) = tokio::join!(waited, reader, sender);
        assert_eq!(r, Err(Expired::Deadline));
        // The body ended when its sender went, after the last 300 ms sleep.
        assert_eq!(Instant::now() - t0, 1700 * MS);
        assert_eq!(t, t0 + 1700 * MS);
        assert_eq!(d, t0 + 16_200 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_sending_is_told_from_an_upstream_that_stops_reading() {
        use http_body_util::BodyExt;
        let t0 = Instant::now();
        for read in [true, false] {
            let mut u = Upload::new(t0, [None, None], Duration::from_secs(1));
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                let b = rx.recv().await?;
                Some((Ok::<_, BoxError>(Frame::data(b)), rx))
            });
            let mut body = u.watch(crate::proxy::body::boxed(http_body_util::StreamBody::new(
                stream,
            )));
            tx.send(Bytes::from_static(b"x"))
                .await
                .expect("the body holds the receiver");
            tx.send(Bytes::from_static(b"x"))
                .await
                .expect("the body holds the receiver");
            let start = Instant::now();
            let first = body.frame().await;
            assert!(first.is_some());
            // Read on (and wait for the client), or take nothing more.
            let reader = async {
                while read && matches!(body.frame().await, Some(Ok(_))) {}
                std::future::pending::<()>().await
            };
            let waited = u.within(start, start + 500 * MS, start + 15_000 * MS, reader);
            let (r, _, _) = waited.await;
            let expected = if read {
                Expired::ClientIdle
            } else {
                Expired::UpstreamIdle
            };
            assert_eq!(r.err(), Some(expected));
            assert_eq!(Instant::now() - start, Duration::from_secs(1));
            drop(tx);
        }
    }
}
