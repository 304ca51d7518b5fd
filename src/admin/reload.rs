//! Reloading the config file into the running proxy (docs/reference/reload.md#reload):
//! read and validate it in full, swap the snapshot, count and log the
//! outcome; an invalid file leaves the running config in place. The
//! triggers (SIGHUP, the file watch, `POST /reload`) live with what starts
//! them (`runtime`, `admin`) and all call [`Reloader::reload`]. What a
//! reload reads — the config's text and the certificate, key and CA files
//! it names — is fingerprinted, so the watch reloads when any of it changed
//! and never when none did.

use crate::config::{Config, ConfigError, ConfigErrors};
use crate::metrics::Metrics;
use crate::proxy::ProxyHandle;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What `/status.json` says of reloads, as `.reload`
/// (docs/reference/admin.md#status-page).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadReport {
    /// The last reload tried since weir started; `None` before one.
    pub last: Option<LastReload>,
    /// SHA-256 of the text the running config was read from.
    pub running_sha256: String,
    /// SHA-256 of the config file on disk now; `None` when it cannot be read.
    pub file_sha256: Option<String>,
    /// Why the file cannot be read, when it cannot.
    pub file_error: Option<String>,
    /// Whether the file on disk is the text of the config that runs.
    pub file_is_running: bool,
}

/// One reload: when, what started it, whether it was applied, and why not.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LastReload {
    pub at_unix_ms: u64,
    /// `admin` (`POST /reload`), `SIGHUP` or `file change` (the watch).
    pub trigger: String,
    pub applied: bool,
    /// Every error of a rejected reload, in file order.
    pub errors: Vec<ReloadError>,
}

/// One error of a rejected reload, located when it has a place in the file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadError {
    /// The file, or the command-line flag that set the field.
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub field: Option<String>,
    /// What is wrong (a URL's credentials shown as `***`; a "did you
    /// mean" hint kept, the list of every valid name left out).
    pub message: String,
}

impl From<&ConfigError> for ReloadError {
    fn from(e: &ConfigError) -> Self {
        let located = e.line > 0;
        ReloadError {
            file: e.file.display().to_string(),
            line: located.then_some(e.line),
            column: located.then_some(e.column),
            field: (!e.field.is_empty()).then(|| e.field.clone()),
            message: e.brief().into_owned(),
        }
    }
}

/// Reloads the config file into the running proxy.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    proxy: Arc<ProxyHandle>,
    metrics: Arc<Metrics>,
    /// The fingerprint of what the last reload tried read, so the watch
    /// does not reload what an explicit reload has already applied.
    last: Mutex<Option<u64>>,
    /// The TLS files the config file named when last read.
    files: Mutex<Vec<PathBuf>>,
    /// The last reload tried, for `/status.json`.
    tried: Mutex<Option<LastReload>>,
}

impl Reloader {
    /// A reloader for the file at `path` (read now, so an unchanged file is
    /// not reloaded by the first watch event).
    pub fn new(path: PathBuf, proxy: Arc<ProxyHandle>, metrics: Arc<Metrics>) -> Self {
        let r = Reloader {
            path,
            proxy,
            metrics,
            last: Mutex::new(None),
            files: Mutex::new(Vec::new()),
            tried: Mutex::new(None),
        };
        if let Ok(src) = r.read() {
            let fp = r.fingerprint(&src);
            *r.last.lock().expect("reload lock poisoned") = Some(fp);
        }
        r
    }

    /// The certificate, key and CA files the config file named when last
    /// read (those of the running config while it names none it can parse):
    /// the file watch watches their directories too.
    pub fn files(&self) -> Vec<PathBuf> {
        self.files.lock().expect("reload lock poisoned").clone()
    }

    /// The fingerprint of the config text `src` and of the bytes of every
    /// TLS file it names (read as the loader reads them; one that cannot be
    /// read counts by its error), and those files kept for [`Self::files`].
    fn fingerprint(&self, src: &str) -> u64 {
        let files = match toml::from_str::<crate::config::raw::RawConfig>(src) {
            Ok(raw) => crate::tls::files_named(&raw),
            Err(_) => crate::tls::files_named(&self.proxy.snapshot().config.effective),
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        src.hash(&mut h);
        for f in &files {
            f.hash(&mut h);
            crate::config::files::read(f).hash(&mut h);
        }
        *self.files.lock().expect("reload lock poisoned") = files;
        h.finish()
    }

    /// The config's text: the file's, or the built-in default's when the
    /// running config is that.
    fn read(&self) -> std::io::Result<String> {
        if self.path == std::path::Path::new(crate::config::BUILTIN_NAME) {
            return Ok(crate::config::BUILTIN.to_string());
        }
        std::fs::read_to_string(&self.path)
    }

    pub fn proxy(&self) -> &Arc<ProxyHandle> {
        &self.proxy
    }

    /// Reloads from the file now. `why` names the trigger in the log.
    pub async fn reload(&self, why: &str) -> Result<(), String> {
        let src = match self.read() {
            Ok(s) => s,
            Err(e) => {
                let e = self.unlocated(format!("cannot read the config file: {e}"));
                return self.failed(why, vec![e]);
            }
        };
        // Before the files are loaded: a file that changes in between is
        // seen changed by the next watch event.
        let fp = self.fingerprint(&src);
        *self.last.lock().expect("reload lock poisoned") = Some(fp);
        // What the command line set over the file is set again.
        let overrides = self.proxy.snapshot().config.overrides.clone();
        let config = match Config::parse_with(&self.path, &src, &overrides) {
            Ok(c) => c,
            Err(ConfigErrors(errors)) => return self.failed(why, errors),
        };
        let upstreams = config.upstreams.len();
        if let Some(e) = fixed_fields_changed(&self.proxy.snapshot().config, &config, &src) {
            return self.failed(why, vec![e]);
        }
        let changes = Changes::between(&self.proxy.snapshot().config, &config);
        let warnings: Vec<String> = config.warnings().map(str::to_string).collect();
        if let Err(e) = self.proxy.reload(config).await {
            return self.failed(why, vec![self.unlocated(e.to_string())]);
        }
        self.metrics.reload(true);
        self.remember(why, true, &[]);
        tracing::info!(
            trigger = why,
            config = %self.path.display(),
            upstreams,
            added = %changes.added.join(","),
            removed = %changes.removed.join(","),
            changed = %changes.changed.join(","),
            server_changed = changes.server,
            "config reloaded"
        );
        for w in warnings {
            tracing::warn!(config = %self.path.display(), "{w}");
        }
        Ok(())
    }

    /// What `/status.json` says of reloads: the last one, and whether the
    /// file on disk now is the text the running config was read from.
    pub fn report(&self) -> ReloadReport {
        let running = self.proxy.snapshot().config.source_sha256.clone();
        let (file_sha256, file_error) = match self.read() {
            Ok(text) => (Some(crate::config::text_sha256(&text)), None),
            Err(e) => (None, Some(format!("{}: {e}", self.path.display()))),
        };
        ReloadReport {
            last: self.tried.lock().expect("reload lock poisoned").clone(),
            file_is_running: file_sha256.as_deref() == Some(running.as_str()),
            running_sha256: running,
            file_sha256,
            file_error,
        }
    }

    /// A reload's outcome, kept for [`Self::report`].
    fn remember(&self, why: &str, applied: bool, errors: &[ConfigError]) {
        let at_unix_ms = crate::clock::Clock::default()
            .wall()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        *self.tried.lock().expect("reload lock poisoned") = Some(LastReload {
            at_unix_ms,
            trigger: why.to_string(),
            applied,
            errors: errors.iter().map(ReloadError::from).collect(),
        });
    }

    /// An error with no place in the file (it cannot be read; a listener
    /// cannot be bound).
    fn unlocated(&self, message: String) -> ConfigError {
        ConfigError {
            file: self.path.clone(),
            line: 0,
            column: 0,
            field: String::new(),
            message,
            expected: Vec::new(),
        }
    }

    /// Reloads only if the file's content, or that of a TLS file it names,
    /// differs from what the last reload tried.
    pub async fn reload_if_changed(&self, why: &str) -> Result<(), String> {
        let Ok(src) = self.read() else {
            // Mid-swap, or removed: the next event will tell.
            return Ok(());
        };
        let fp = self.fingerprint(&src);
        if *self.last.lock().expect("reload lock poisoned") == Some(fp) {
            return Ok(());
        }
        self.reload(why).await
    }

    /// A rejected reload: counted, kept for `/status.json`, and logged as
    /// one event saying so and one event per error, each with its place in
    /// the file as fields of its own and its message on one line, never the
    /// list of every valid name (docs/reference/reload.md#reload). The
    /// answer (`POST /reload`'s 422 body) is every error, one a line. Both
    /// mask the credentials of any URL they quote: every message that comes
    /// here says why a config was refused, and may quote it.
    fn failed(&self, why: &str, errors: Vec<ConfigError>) -> Result<(), String> {
        self.metrics.reload(false);
        self.remember(why, false, &errors);
        tracing::error!(
            trigger = why,
            config = %self.path.display(),
            errors = errors.len(),
            "config reload rejected; the running config stays"
        );
        for e in &errors {
            let located = e.line > 0;
            tracing::error!(
                trigger = why,
                file = %e.file.display(),
                line = located.then_some(e.line),
                column = located.then_some(e.column),
                field = (!e.field.is_empty()).then_some(e.field.as_str()),
                error = %e.brief(),
                "config reload rejected: why"
            );
        }
        Err(ConfigErrors(errors).to_string())
    }
}

/// `[server]` fields a reload cannot apply to the running process: the
/// admin listener (the socket a reload may be arriving on) and the
/// connection limit (a semaphore sized at start). A reload that changes
/// one is refused, naming it where the new file sets it — never reported
/// as applied while the old value still serves (docs/reference/reload.md#reload).
/// Everything else in `[server]` applies: listeners are bound and the old
/// ones drained, and the rest is read per connection.
const FIXED: [&str; 2] = ["admin", "max_connections"];

fn fixed_fields_changed(
    old: &Config,
    new: &Config,
    src: &str,
) -> Option<crate::config::ConfigError> {
    let (o, n) = (&old.server, &new.server);
    let changed = FIXED.into_iter().find(|f| match *f {
        "admin" => o.admin != n.admin,
        _ => o.max_connections != n.max_connections,
    })?;
    let (was, now) = match changed {
        "admin" => (o.admin.to_string(), n.admin.to_string()),
        _ => (o.max_connections.to_string(), n.max_connections.to_string()),
    };
    let idx = crate::config::error::SpanIndex::new(src);
    Some(idx.error_at_path(
        &new.path,
        &format!("server.{changed}"),
        format!(
            "cannot change on reload ({was} → {now}): restart weir to apply it; the running config stays"
        ),
    ))
}

/// What a reload changed, for its log line: upstreams by name, and whether
/// `[server]` changed. Compared on the effective configs (every default
/// filled in), so a field written out with its default value is no change.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub server: bool,
}

impl Changes {
    pub fn between(old: &Config, new: &Config) -> Changes {
        let table =
            |c: &Config| toml::from_str::<toml::Table>(&c.effective_toml()).unwrap_or_default();
        let (old_t, new_t) = (table(old), table(new));
        let section = |t: &toml::Table, key: &str| t.get(key).cloned();
        let ups = |t: &toml::Table| match t.get("upstreams") {
            Some(toml::Value::Table(u)) => u.clone(),
            _ => toml::Table::new(),
        };
        let (old_u, new_u) = (ups(&old_t), ups(&new_t));
        let mut c = Changes {
            server: section(&old_t, "server") != section(&new_t, "server"),
            ..Changes::default()
        };
        for (name, v) in &new_u {
            match old_u.get(name) {
                None => c.added.push(name.clone()),
                Some(o) if o != v => c.changed.push(name.clone()),
                Some(_) => {}
            }
        }
        c.removed = old_u
            .keys()
            .filter(|n| !new_u.contains_key(*n))
            .cloned()
            .collect();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(extra: &str) -> Config {
        let src = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n\
             [upstreams.b]\nurl = \"http://127.0.0.1:2\"\nhosts = [\"b\"]\n{extra}"
        );
        Config::parse(Path::new("t.toml"), &src).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_reload_names_what_it_changed() {
        let old = config("");
        assert_eq!(Changes::between(&old, &old), Changes::default());
        let new = config(
            "[upstreams.b.retry]\nmax_attempts = 5\n\
             [upstreams.c]\nurl = \"http://127.0.0.1:3\"\nhosts = [\"c\"]\n",
        );
        let c = Changes::between(&old, &new);
        assert_eq!(c.added, ["c"]);
        assert_eq!(c.changed, ["b"]);
        assert!(c.removed.is_empty() && !c.server);
        let c = Changes::between(&new, &old);
        assert_eq!(c.removed, ["c"]);
        // A default written out is no change.
        let same = config("[upstreams.a.retry]\nmax_attempts = 3\n");
        assert!(Changes::between(&old, &same).changed.is_empty());
    }
}
