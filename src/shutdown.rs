//! The stop signal every long-running task watches: a `watch` channel whose
//! value turns `true` once, when weir begins to drain. A leaf: it depends on
//! nothing in the crate, so the listeners, the admin server and the reload
//! triggers can all wait on it without depending on each other.

use tokio::sync::watch;

/// Resolves once the stop flag is set (or its sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// SIGTERM or Ctrl-C.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
