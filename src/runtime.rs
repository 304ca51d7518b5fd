//! A running weir: the proxy, the admin listener, and the reload triggers
//! (SIGHUP, a change of the config file or of a certificate, key or CA file
//! it names, `POST /reload`).
//!
//! Every reload reads and validates the file in full before anything
//! changes; an invalid file is logged and counted and the running config
//! stays. Each file is watched through its directory, so an atomic rename or
//! a Kubernetes ConfigMap's or Secret's `..data` symlink swap is seen; bursts
//! of events are debounced, and nothing is reloaded when neither the config
//! nor any file it names changed (docs/reference/reload.md#reload).

use crate::admin::reload::Reloader;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyHandle};
use crate::shutdown::stopped;
use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long the file watch waits for a burst of events to settle.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// What to run besides the proxy.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Watch the config file for changes.
    pub watch: bool,
    /// Reload on SIGHUP.
    pub sighup: bool,
    /// Worker threads, each with a current-thread runtime and its own
    /// SO_REUSEPORT sockets; 0 runs the proxy on the calling runtime.
    pub workers: usize,
}

/// The worker threads: one current-thread runtime each. A connection lives
/// on one worker from accept to close, so nothing it touches crosses threads
/// (measured: a multi-thread runtime cost more CPU per request, see
/// bench/RESULTS.md#how-it-got-there).
#[derive(Debug)]
struct Workers {
    handles: Vec<tokio::runtime::Handle>,
    done: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn start(n: usize) -> io::Result<Workers> {
        let mut w = Workers {
            handles: Vec::new(),
            done: Vec::new(),
            threads: Vec::new(),
        };
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (done, wait) = tokio::sync::oneshot::channel::<()>();
            w.handles.push(rt.handle().clone());
            w.done.push(done);
            w.threads.push(
                std::thread::Builder::new()
                    .name(format!("weir-worker-{i}"))
                    .spawn(move || {
                        rt.block_on(async {
                            let _ = wait.await;
                        });
                        // Dropping the runtime cancels what is left.
                    })?,
            );
        }
        Ok(w)
    }

    fn stop(self) {
        drop(self.done);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A running weir.
#[derive(Debug)]
pub struct Runtime {
    pub proxy: Arc<ProxyHandle>,
    pub reloader: Arc<Reloader>,
    /// The admin listener's TCP address (0.0.0.0:0 on a socket file).
    pub admin_addr: SocketAddr,
    /// The admin listener, of either kind.
    pub admin_address: crate::address::Address,
    stop: watch::Sender<bool>,
    workers: Mutex<Option<Workers>>,
}

impl Runtime {
    /// Starts weir from a validated config loaded from `config.path`.
    pub async fn start(config: Config, opts: Options) -> io::Result<Runtime> {
        let path = config.path.clone();
        let admin = config.server.admin;
        let metrics = Arc::new(Metrics::new());
        let admin_listener =
            crate::admin::AdminListener::bind(admin, config.server.socket_mode).await?;
        let admin_address = admin_listener.local()?;
        let admin_addr = admin_address
            .tcp()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let workers = Workers::start(opts.workers)?;
        let proxy =
            Arc::new(Proxy::start_on(config, metrics.clone(), workers.handles.clone()).await?);
        metrics.reload(true);
        let reloader = Arc::new(Reloader::new(path.clone(), proxy.clone(), metrics));
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(crate::admin::serve(
            admin_listener,
            reloader.clone(),
            stop_rx.clone(),
        ));
        if opts.sighup {
            spawn_sighup(reloader.clone(), stop_rx.clone());
        }
        if opts.watch {
            // The watch lives in its task, until `stop` is set or dropped.
            if let Err(e) = watch_files(&path, reloader.clone(), stop_rx) {
                tracing::warn!(error = %e, config = %path.display(), "cannot watch the config file; reload with SIGHUP or POST /reload");
            }
        }
        Ok(Runtime {
            proxy,
            reloader,
            admin_addr,
            admin_address,
            stop,
            workers: Mutex::new(Some(workers)),
        })
    }

    /// Graceful shutdown: `/readyz` turns 503 at once, listeners stop
    /// accepting, in-flight requests get up to `grace`. The admin listener
    /// stays up until the end so probes see the draining state.
    pub async fn shutdown(&self, grace: Duration) {
        self.proxy.shutdown(grace).await;
        let _ = self.stop.send(true);
        let workers = self.workers.lock().expect("workers lock poisoned").take();
        if let Some(w) = workers {
            let _ = tokio::task::spawn_blocking(move || w.stop()).await;
        }
    }
}

fn spawn_sighup(reloader: Arc<Reloader>, mut stop: watch::Receiver<bool>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP");
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => { let _ = reloader.reload("SIGHUP").await; }
                _ = stopped(&mut stop) => break,
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (reloader, stop);
}

/// The directory holding `p` (`.` for a bare file name).
fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The directories whose entries decide what `file` reads as: its own
/// (where an editor renames over it, or a ConfigMap or Secret swaps the
/// `..data` link it goes through), the one holding each symlinked directory
/// on its way (`live/cert.pem` with `live` repointed), and the one it
/// finally resolves to (a file rewritten in place behind a link).
fn dirs_of(file: &Path) -> BTreeSet<PathBuf> {
    let mut dirs = BTreeSet::from([parent(file)]);
    for a in file.ancestors().skip(1) {
        if std::fs::symlink_metadata(a).is_ok_and(|m| m.file_type().is_symlink()) {
            dirs.insert(parent(a));
        }
    }
    if let Ok(real) = std::fs::canonicalize(file) {
        dirs.insert(parent(&real));
    }
    dirs
}

/// Brings the watched directories up to date: those of the config file
/// and of every TLS file the reloader last saw it name.
fn rewatch(
    watcher: &mut notify::RecommendedWatcher,
    watched: &mut BTreeSet<PathBuf>,
    config: &Path,
    files: &[PathBuf],
) {
    use notify::Watcher;
    let mut want = dirs_of(config);
    for f in files {
        want.extend(dirs_of(f));
    }
    for gone in watched.difference(&want) {
        // A directory already removed (a Secret's old one) is unwatched.
        let _ = watcher.unwatch(gone);
    }
    watched.retain(|d| want.contains(d));
    for d in want {
        if watched.contains(&d) {
            continue;
        }
        match watcher.watch(&d, notify::RecursiveMode::NonRecursive) {
            Ok(()) => {
                watched.insert(d);
            }
            Err(e) => tracing::warn!(dir = %d.display(), error = %e,
                "cannot watch a directory of the config or of a file it names; after changing a file there, reload with SIGHUP or POST /reload"),
        }
    }
}

/// Watches the directories of the config file and of the certificate, key
/// and CA files it names; any event there may be a swap of one of them
/// (editors and Kubernetes replace files rather than write them). After
/// each look the set is brought up to date: a reload may name other files,
/// and a Secret's swap moves where its files really are.
fn watch_files(
    path: &Path,
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) -> notify::Result<()> {
    use notify::Watcher;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok() {
            let _ = tx.send(());
        }
    })?;
    // The config file's own directory must be watchable; the rest are
    // watched as they can be.
    let dir = parent(path);
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    let mut watched = BTreeSet::from([dir.clone()]);
    let config = path.to_path_buf();
    rewatch(&mut watcher, &mut watched, &config, &reloader.files());
    let dirs: Vec<String> = watched.iter().map(|d| d.display().to_string()).collect();
    tracing::info!(dirs = %dirs.join(","), "watching the config and the files it names for changes");
    tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = rx.recv() => if ev.is_none() { break },
                _ = stopped(&mut stop) => break,
            }
            // Debounce: wait until the directories have been quiet for a moment.
            loop {
                match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let _ = reloader.reload_if_changed("file change").await;
            rewatch(&mut watcher, &mut watched, &config, &reloader.files());
        }
    });
    Ok(())
}

/// A multi-threaded runtime for a command (`weir chaos`, `weir run`); `None`
/// (said on stderr) when it cannot be built.
pub fn build() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            None
        }
    }
}
