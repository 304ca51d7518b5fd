//! Whether the backend is up, what went wrong lately, and the warnings about
//! it: at most one a minute per operation, with how many were held back.
//! Time is tokio's (`tokio::time::Instant`), so paused-clock tests move it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A warning per operation at most this often.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(60);

/// Timeouts in a row that take the backend for down (a single slow answer
/// does not; a backend that stopped answering does, so later calls fail at
/// once instead of each waiting out `timeout`).
pub(super) const TIMEOUTS_FOR_DOWN: u32 = 3;

#[derive(Debug, Default)]
struct LogSlot {
    last: Option<Instant>,
    held_back: u64,
}

/// Errors per second over the last minute.
#[derive(Debug)]
struct Window {
    counts: [u64; 60],
    /// The second (since `origin`) `counts` was last written at.
    head: u64,
}

impl Window {
    fn roll(&mut self, sec: u64) {
        if sec <= self.head {
            return;
        }
        let gap = (sec - self.head).min(60);
        for i in 1..=gap {
            self.counts[((self.head + i) % 60) as usize] = 0;
        }
        self.head = sec;
    }

    fn add(&mut self, sec: u64) {
        self.roll(sec);
        self.counts[(sec % 60) as usize] += 1;
    }

    fn total(&mut self, sec: u64) -> u64 {
        self.roll(sec);
        self.counts.iter().sum()
    }
}

/// The up/down lines: a "down" at most once a minute (a backend that
/// flaps, say one that answers PING but not the calls, would otherwise log
/// a pair per call), and an "up" only after a logged "down".
#[derive(Debug, Default)]
struct Flaps {
    last_down: Option<Instant>,
    held_back: u64,
    down_logged: bool,
}

#[derive(Debug)]
struct Log {
    /// When `up` last changed (or the fleet started).
    since: Instant,
    flaps: Flaps,
    last_error: Option<String>,
    window: Window,
    slots: HashMap<&'static str, LogSlot>,
}

/// The backend's health as calls see it.
#[derive(Debug)]
pub(super) struct BackendHealth {
    origin: Instant,
    up: AtomicBool,
    timeouts: AtomicU32,
    /// When a call last answered, in ms since `origin` (0: never).
    answered_at: std::sync::atomic::AtomicU64,
    log: Mutex<Log>,
}

impl BackendHealth {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        BackendHealth {
            origin: now,
            up: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
            answered_at: std::sync::atomic::AtomicU64::new(0),
            log: Mutex::new(Log {
                since: now,
                flaps: Flaps::default(),
                last_error: None,
                window: Window {
                    counts: [0; 60],
                    head: 0,
                },
                slots: HashMap::new(),
            }),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().expect("state health lock poisoned")
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Sets up or down; true when that is a change.
    pub(super) fn set_up(&self, up: bool) -> bool {
        let changed = self.up.swap(up, Ordering::AcqRel) != up;
        if changed {
            self.log().since = Instant::now();
        }
        if up {
            self.timeouts.store(0, Ordering::Relaxed);
        }
        changed
    }

    /// The backend just went down: `Some(downs held back since the last
    /// logged one)` when this one is to be logged.
    pub(super) fn went_down(&self) -> Option<u64> {
        let now = Instant::now();
        let f = &mut self.log().flaps;
        match f.last_down {
            Some(t) if now.saturating_duration_since(t) < LOG_EVERY => {
                f.held_back += 1;
                f.down_logged = false;
                None
            }
            _ => {
                f.last_down = Some(now);
                f.down_logged = true;
                Some(std::mem::take(&mut f.held_back))
            }
        }
    }

    /// While down: `Some(downs held back)` once a held-back "down" is due
    /// (a minute after the last logged one), so that the last line logged
    /// never says "reachable" about a backend that has been down since.
    pub(super) fn overdue_down(&self) -> Option<u64> {
        if self.is_up() {
            return None;
        }
        let now = Instant::now();
        let f = &mut self.log().flaps;
        let due = !f.down_logged
            && f.held_back > 0
            && f.last_down
                .is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY);
        if !due {
            return None;
        }
        f.last_down = Some(now);
        f.down_logged = true;
        Some(std::mem::take(&mut f.held_back))
    }

    /// The backend just came back: whether to log it (its "down" was).
    pub(super) fn came_up(&self) -> bool {
        std::mem::take(&mut self.log().flaps.down_logged)
    }

    /// A call answered: the run of timeouts is over.
    pub(super) fn answered(&self) {
        self.timeouts.store(0, Ordering::Relaxed);
        let ms = Instant::now()
            .saturating_duration_since(self.origin)
            .as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX).max(1);
        self.answered_at.store(ms, Ordering::Relaxed);
    }

    /// Whether a call answered within the last `d`: proof enough that the
    /// connection is alive, without a heartbeat of its own.
    pub(super) fn answered_within(&self, d: std::time::Duration) -> bool {
        let at = self.answered_at.load(Ordering::Relaxed);
        let now = Instant::now()
            .saturating_duration_since(self.origin)
            .as_millis();
        at != 0 && u64::try_from(now).unwrap_or(u64::MAX).saturating_sub(at) < d.as_millis() as u64
    }

    /// A call timed out; true when that makes [`TIMEOUTS_FOR_DOWN`] in a row.
    pub(super) fn timed_out(&self) -> bool {
        self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_FOR_DOWN
    }

    /// Records an error of `op`; returns how many warnings of `op` were
    /// held back since the last one when this one is to be logged. A call
    /// refused because the backend is down (`cause = false`) does not
    /// replace the last error's text: that stays what took it down.
    pub(super) fn error(&self, op: &'static str, error: &str, cause: bool) -> Option<u64> {
        let now = Instant::now();
        let sec = self.second(now);
        let mut log = self.log();
        log.window.add(sec);
        if (cause || log.last_error.is_none()) && log.last_error.as_deref() != Some(error) {
            log.last_error = Some(error.to_string());
        }
        let slot = log.slots.entry(op).or_default();
        match slot.last {
            Some(t) if now.saturating_duration_since(t) < LOG_EVERY => {
                slot.held_back += 1;
                None
            }
            _ => {
                slot.last = Some(now);
                Some(std::mem::take(&mut slot.held_back))
            }
        }
    }

    /// (up, how long in that state, errors in the last minute, the last error).
    pub(super) fn summary(&self) -> (bool, Duration, u64, Option<String>) {
        let now = Instant::now();
        let sec = self.second(now);
        let up = self.is_up();
        let mut log = self.log();
        let errors = log.window.total(sec);
        let since = now.saturating_duration_since(log.since);
        (up, since, errors, log.last_error.clone())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warnings_are_held_back_to_one_a_minute_per_op() {
        let h = BackendHealth::new();
        assert_eq!(h.error("lease", "timeout", true), Some(0));
        assert_eq!(h.error("lease", "timeout", true), None);
        assert_eq!(h.error("lease", "timeout", true), None);
        assert_eq!(h.error("idempotency_begin", "timeout", true), Some(0));
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(h.error("lease", "refused", true), Some(2));
        let (up, _, errors, last) = h.summary();
        assert!(!up);
        assert_eq!(errors, 1, "only the last minute's");
        assert_eq!(last.as_deref(), Some("refused"));
        // Calls refused while down keep the cause that took it down.
        let _ = h.error("lease", "unavailable", false);
        assert_eq!(h.summary().3.as_deref(), Some("refused"));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(h.summary().2, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flapping_backend_logs_one_down_and_up_a_minute() {
        let h = BackendHealth::new();
        assert_eq!(h.went_down(), Some(0));
        assert!(h.came_up());
        for _ in 0..10 {
            assert_eq!(h.went_down(), None);
            assert!(!h.came_up(), "its down was held back");
        }
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(h.went_down(), Some(10));
        assert!(h.came_up());
        assert!(!h.came_up(), "once");
        // Down, held back, and still down a minute later: the "down" is
        // logged then, not left behind a "reachable".
        h.set_up(true);
        assert_eq!(h.went_down(), None);
        h.set_up(false);
        assert_eq!(h.overdue_down(), None, "not yet due");
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(h.overdue_down(), Some(1));
        assert_eq!(h.overdue_down(), None, "once");
    }

    #[test]
    fn three_timeouts_in_a_row_are_down() {
        let h = BackendHealth::new();
        assert!(!h.timed_out());
        assert!(!h.timed_out());
        h.answered();
        assert!(!h.timed_out());
        assert!(!h.timed_out());
        assert!(h.timed_out());
    }
}
