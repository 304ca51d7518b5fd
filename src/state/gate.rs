//! The concurrency gate (docs/reference/admission.md#concurrency): at most `max_in_flight` requests to an
//! upstream at once, up to `max_queue` more waiting in FIFO order (tokio's
//! semaphore is fair), anything beyond that refused at once with 503
//! `overloaded`. A waiting request never waits past its deadline.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

#[derive(Debug)]
pub struct Gate {
    sem: Arc<Semaphore>,
    in_flight: Arc<AtomicU32>,
    /// Permits the semaphore currently represents (for reloads).
    limit: Mutex<u32>,
    max_queue: AtomicU32,
    queued: AtomicU32,
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
    pub fn new(max_in_flight: u32, max_queue: u32) -> Self {
        Gate {
            sem: Arc::new(Semaphore::new(max_in_flight as usize)),
            in_flight: Arc::new(AtomicU32::new(0)),
            limit: Mutex::new(max_in_flight),
            max_queue: AtomicU32::new(max_queue),
            queued: AtomicU32::new(0),
        }
    }

    /// A slot, if one is free now.
    pub fn try_enter(&self) -> Option<Slot> {
        self.sem
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|p| self.slot(p))
    }

    /// A slot for one request, held until its response body ends: now,
    /// or after waiting in the queue (`max_queue`) until `deadline`.
    pub async fn enter(&self, deadline: Instant) -> Result<Slot, GateRefusal> {
        if let Ok(p) = self.sem.clone().try_acquire_owned() {
            return Ok(self.slot(p));
        }
        let max_queue = self.max_queue.load(Ordering::Acquire);
        if self.queued.fetch_add(1, Ordering::AcqRel) >= max_queue {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(GateRefusal::Full);
        }
        let _queued = Queued(&self.queued);
        match tokio::time::timeout_at(deadline, self.sem.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(self.slot(p)),
            Ok(Err(_)) => Err(GateRefusal::Full),
            Err(_) => Err(GateRefusal::Deadline),
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Slot {
            _permit: permit,
            in_flight: self.in_flight.clone(),
        }
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Acquire)
    }

    /// Applies reloaded limits. Raising takes effect at once; lowering takes
    /// slots away as requests in flight finish.
    pub fn set_limits(&self, max_in_flight: u32, max_queue: u32) {
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

/// One request's place under `max_in_flight`; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    in_flight: Arc<AtomicU32>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
