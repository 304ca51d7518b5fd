//! A running weir: the proxy, the admin listener, and the reload triggers
//! (SIGHUP, a change of the config file, `POST /reload`).
//!
//! Every reload reads and validates the file in full before anything
//! changes; an invalid file is logged and counted and the running config
//! stays. The file is watched through its directory, so an atomic rename or a
//! Kubernetes ConfigMap's `..data` symlink swap is seen; bursts of events are
//! debounced, and a file whose content did not change is not reloaded.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyHandle};
use crate::reload::Reloader;
use crate::shutdown::stopped;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
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
    pub admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    workers: Mutex<Option<Workers>>,
    // Kept alive for as long as the runtime runs.
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Runtime {
    /// Starts weir from a validated config loaded from `config.path`.
    pub async fn start(config: Config, opts: Options) -> io::Result<Runtime> {
        let path = config.path.clone();
        let admin = config.server.admin;
        let metrics = Arc::new(Metrics::new());
        let admin_listener = TcpListener::bind(admin).await.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on {admin} (admin): {e}"))
        })?;
        let admin_addr = admin_listener.local_addr()?;
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
        let watcher = if opts.watch {
            match watch_file(&path, reloader.clone(), stop_rx) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, config = %path.display(), "cannot watch the config file; reload with SIGHUP or POST /reload");
                    None
                }
            }
        } else {
            None
        };
        Ok(Runtime {
            proxy,
            reloader,
            admin_addr,
            stop,
            workers: Mutex::new(Some(workers)),
            _watcher: watcher,
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

/// Watches the config file's directory; any event there may be a swap of
/// our file (editors and Kubernetes replace files rather than write them).
fn watch_file(
    path: &Path,
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok() {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = rx.recv() => if ev.is_none() { break },
                _ = stopped(&mut stop) => break,
            }
            // Debounce: wait until the directory has been quiet for a moment.
            loop {
                match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let _ = reloader.reload_if_changed("file change").await;
        }
    });
    tracing::info!(dir = %dir.display(), "watching the config directory for changes");
    Ok(watcher)
}
