//! Reloading the config file into the running proxy (docs/behaviour.md#reload):
//! read and validate it in full, swap the snapshot, count and log the
//! outcome; an invalid file leaves the running config in place. The
//! triggers (SIGHUP, the file watch, `POST /reload`) live with what starts
//! them (`runtime`, `admin`) and all call [`Reloader::reload`].

use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::ProxyHandle;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Reloads the config file into the running proxy.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    proxy: Arc<ProxyHandle>,
    metrics: Arc<Metrics>,
    /// Hash of the content last tried, so the watch does not reload a file
    /// that an explicit reload has already applied.
    last: Mutex<Option<u64>>,
}

fn fingerprint(s: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

impl Reloader {
    /// A reloader for the file at `path` (read now, so an unchanged file is
    /// not reloaded by the first watch event).
    pub fn new(path: PathBuf, proxy: Arc<ProxyHandle>, metrics: Arc<Metrics>) -> Self {
        let src = std::fs::read_to_string(&path).ok();
        Reloader {
            path,
            proxy,
            metrics,
            last: Mutex::new(src.as_deref().map(fingerprint)),
        }
    }

    pub fn proxy(&self) -> &Arc<ProxyHandle> {
        &self.proxy
    }

    /// Reloads from the file now. `why` names the trigger in the log.
    pub async fn reload(&self, why: &str) -> Result<(), String> {
        let src = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("{}: cannot read the config file: {e}", self.path.display()));
        let src = match src {
            Ok(s) => s,
            Err(e) => return self.failed(why, e),
        };
        *self.last.lock().expect("reload lock poisoned") = Some(fingerprint(&src));
        let config = match Config::parse(&self.path, &src) {
            Ok(c) => c,
            Err(e) => return self.failed(why, e.to_string()),
        };
        let upstreams = config.upstreams.len();
        if let Err(e) = self.proxy.reload(config).await {
            return self.failed(why, e.to_string());
        }
        self.metrics.reload(true);
        tracing::info!(trigger = why, config = %self.path.display(), upstreams, "config reloaded");
        Ok(())
    }

    /// Reloads only if the file's content differs from the last one tried.
    pub async fn reload_if_changed(&self, why: &str) -> Result<(), String> {
        let Ok(src) = std::fs::read_to_string(&self.path) else {
            // Mid-swap, or removed: the next event will tell.
            return Ok(());
        };
        if *self.last.lock().expect("reload lock poisoned") == Some(fingerprint(&src)) {
            return Ok(());
        }
        self.reload(why).await
    }

    fn failed(&self, why: &str, e: String) -> Result<(), String> {
        self.metrics.reload(false);
        tracing::error!(trigger = why, error = %e, "config reload rejected; the running config stays");
        Err(e)
    }
}
