//! The concurrency gate (docs/reference/admission.md#concurrency): at most `max_in_flight` requests to an
//! upstream at once, up to `max_queue` more waiting in FIFO order (tokio's
//! semaphore is fair), anything beyond that refused at once with 503
//! `overloaded`. A waiting request never waits past its deadline.
//!
//! With `limit = "adaptive"` (docs/reference/admission.md#adaptive-limit)
//! the policy core's [`AdaptiveLimit`] sets how many requests may be
//! *waiting for the upstream's answer* at once, from the attempts'
//! latencies the data plane reports ([`Gate::observe`]); a request over it
//! is refused at once, never queued: a queue in front of an upstream that
//! is past its capacity only adds its wait to every request. It counts what
//! its samples measure: a request takes its place once its body is whole
//! ([`Gate::place`]) and gives it back when the answer's head arrives
//! ([`Slot::answered`]). A client slow to send its body or to read the
//! response holds a `max_in_flight` slot, never an adaptive place, so a
//! dozen slow clients cannot hold the limit at its floor.

use crate::clock::Clock;
use crate::config::ConcurrencyParams;
use crate::policy::AdaptiveLimit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

#[derive(Debug)]
pub struct Gate {
    sem: Arc<Semaphore>,
    /// Requests holding a slot (what `/metrics` shows in flight).
    in_flight: Arc<AtomicU32>,
    /// Requests holding an adaptive place: waiting for the upstream's
    /// answer (only counted with `limit = "adaptive"`).
    awaiting: Arc<AtomicU32>,
    /// Permits the semaphore currently represents (for reloads).
    limit: Mutex<u32>,
    max_queue: AtomicU32,
    queued: AtomicU32,
    /// The adaptive limit, with `limit = "adaptive"`.
    adaptive: Mutex<Option<AdaptiveLimit>>,
    /// The adaptive limit's value now (`u32::MAX`: none, `max_in_flight`
    /// alone limits).
    cap: AtomicU32,
    /// Requests refused `overloaded` since the start.
    refusals: AtomicU64,
    clock: Clock,
}

/// What the gate shows (`/metrics`, the status page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateView {
    /// Requests that may hold a slot now: the adaptive limit, or
    /// `max_in_flight`.
    pub limit: u32,
    /// The adaptive limit's latency estimate (its last window's median).
    pub latency: Option<Duration>,
    /// The adaptive limit's no-load latency.
    pub baseline: Option<Duration>,
    /// Requests refused `overloaded` since the start.
    pub refusals: u64,
}

/// Decrements the queue count however the wait ends (granted, deadline, or
/// the client going away).
struct Queued<'a>(&'a AtomicU32);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    pub fn new(c: &ConcurrencyParams, clock: Clock) -> Self {
        let adaptive = c.adaptive.clone().map(AdaptiveLimit::new);
        Gate {
            sem: Arc::new(Semaphore::new(c.max_in_flight as usize)),
            in_flight: Arc::new(AtomicU32::new(0)),
            awaiting: Arc::new(AtomicU32::new(0)),
            limit: Mutex::new(c.max_in_flight),
            max_queue: AtomicU32::new(c.max_queue),
            queued: AtomicU32::new(0),
            cap: AtomicU32::new(adaptive.as_ref().map_or(u32::MAX, |a| a.limit())),
            adaptive: Mutex::new(adaptive),
            refusals: AtomicU64::new(0),
            clock,
        }
    }

    /// A slot, if one is free now (and the adaptive limit has room: looked
    /// at here, taken by [`Gate::place`] once the body is whole).
    pub fn try_enter(&self) -> Option<Slot> {
        if self.awaiting.load(Ordering::Acquire) >= self.cap.load(Ordering::Acquire) {
            return None;
        }
        let p = self.sem.clone().try_acquire_owned().ok()?;
        Some(self.slot(p))
    }

    /// Takes the adaptive place of a request whose body is whole (a
    /// request waits for its answer only from then): refused (503
    /// `overloaded`) when the limit is reached meanwhile. Without an
    /// adaptive limit, one atomic load.
    pub fn place(&self, slot: &mut Slot) -> Result<(), GateRefusal> {
        match self.try_place(slot) {
            true => Ok(()),
            false => Err(self.refuse()),
        }
    }

    /// [`Gate::place`] without counting a refusal (a hedge that finds no
    /// place is skipped, not refused).
    pub fn try_place(&self, slot: &mut Slot) -> bool {
        let cap = self.cap.load(Ordering::Acquire);
        if cap == u32::MAX || slot.place.is_some() {
            return true;
        }
        let mut n = self.awaiting.load(Ordering::Acquire);
        loop {
            if n >= cap {
                return false;
            }
            match self
                .awaiting
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => n = now,
            }
        }
        slot.place = Some(self.awaiting.clone());
        true
    }

    /// Counts a refusal (and tells the adaptive limit, which probes its
    /// no-load latency again only when it has bound).
    fn refuse(&self) -> GateRefusal {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        if let Some(a) = self.adaptive().as_mut() {
            a.refused(self.clock.now());
            self.cap.store(a.limit(), Ordering::Release);
        }
        GateRefusal::Full
    }

    fn adaptive(&self) -> std::sync::MutexGuard<'_, Option<AdaptiveLimit>> {
        self.adaptive.lock().expect("adaptive limit lock poisoned")
    }

    /// An attempt begun at `started` answered (or timed out) after `took`:
    /// the adaptive limit's latency sample. Nothing without one.
    pub fn observe(&self, started: Instant, took: Duration) {
        if self.cap.load(Ordering::Acquire) == u32::MAX {
            return;
        }
        let at = self.clock.at(started);
        let in_flight = self.awaiting.load(Ordering::Acquire);
        if let Some(a) = self.adaptive().as_mut() {
            a.record(at, took, in_flight, at + took);
            self.cap.store(a.limit(), Ordering::Release);
        }
    }

    /// The limit, the adaptive limit's estimates and the refusals, now.
    pub fn view(&self) -> GateView {
        let a = self.adaptive();
        let limit = *self.limit.lock().expect("gate lock poisoned");
        GateView {
            limit: a.as_ref().map_or(limit, |a| a.limit()),
            latency: a.as_ref().and_then(|a| a.latency()),
            baseline: a.as_ref().and_then(|a| a.baseline()),
            refusals: self.refusals.load(Ordering::Relaxed),
        }
    }

    /// A slot for one request, held until its response body ends: now,
    /// or after waiting in the queue (`max_queue`) until `deadline`.
    pub async fn enter(&self, deadline: Instant) -> Result<Slot, GateRefusal> {
        if let Some(s) = self.try_enter() {
            return Ok(s);
        }
        if self.cap.load(Ordering::Acquire) != u32::MAX {
            // Adaptive: refused at once, never queued.
            return Err(self.refuse());
        }
        let max_queue = self.max_queue.load(Ordering::Acquire);
        if self.queued.fetch_add(1, Ordering::AcqRel) >= max_queue {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refuse());
        }
        let _queued = Queued(&self.queued);
        match tokio::time::timeout_at(deadline, self.sem.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(self.slot(p)),
            Ok(Err(_)) => Err(self.refuse()),
            Err(_) => Err(GateRefusal::Deadline),
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Slot {
            _permit: permit,
            in_flight: self.in_flight.clone(),
            place: None,
        }
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests waiting for the upstream's answer under the adaptive limit
    /// now (0 without one).
    pub fn awaiting(&self) -> u32 {
        self.awaiting.load(Ordering::Acquire)
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Acquire)
    }

    /// Applies reloaded limits. Raising takes effect at once; lowering takes
    /// slots away as requests in flight finish.
    /// The adaptive limit keeps what it learnt when its parameters change;
    /// it starts afresh when turned on, and is dropped when turned off.
    pub fn set_limits(&self, c: &ConcurrencyParams) {
        let (max_in_flight, max_queue) = (c.max_in_flight, c.max_queue);
        {
            let mut a = self.adaptive();
            match (a.as_mut(), &c.adaptive) {
                (Some(a), Some(p)) if a.params() != p => a.set_params(p.clone()),
                (Some(_), Some(_)) => {}
                (_, p) => *a = p.clone().map(AdaptiveLimit::new),
            }
            let cap = a.as_ref().map_or(u32::MAX, |a| a.limit());
            self.cap.store(cap, Ordering::Release);
        }
        self.max_queue.store(max_queue, Ordering::Release);
        let mut limit = self.limit.lock().expect("gate lock poisoned");
        if max_in_flight > *limit {
            self.sem.add_permits((max_in_flight - *limit) as usize);
        } else if max_in_flight < *limit {
            let excess = *limit - max_in_flight;
            let sem = self.sem.clone();
            let forgotten = sem.forget_permits(excess as usize) as u32;
            if forgotten < excess {
                // The rest are held by requests in flight: take them as they finish.
                let rest = excess - forgotten;
                tokio::spawn(async move {
                    if let Ok(p) = sem.acquire_many_owned(rest).await {
                        p.forget();
                    }
                });
            }
        }
        *limit = max_in_flight;
    }
}

/// Why the gate did not let a request in (weir answers 503 `overloaded` or
/// 504 `deadline_exceeded`; see `ProxyError`'s `From`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// Every slot taken and the queue full (or closed).
    Full,
    /// The deadline passed while queued.
    Deadline,
}

/// One request's place under `max_in_flight`, and under the adaptive
/// limit while it waits for its answer; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    in_flight: Arc<AtomicU32>,
    /// Its adaptive place ([`Gate::place`]), until [`Slot::answered`].
    place: Option<Arc<AtomicU32>>,
}

impl Slot {
    /// The upstream's answer has arrived (or the attempts are over): what
    /// is left is delivery to the client, which the adaptive limit does
    /// not count.
    #[inline]
    pub fn answered(&mut self) {
        if let Some(p) = self.place.take() {
            p.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.answered();
    }
}
