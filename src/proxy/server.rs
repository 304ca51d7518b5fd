//! Listeners and connections. `Proxy::start` binds every listener the config
//! names (tests bind `127.0.0.1:0`) and returns a handle that reports the
//! bound addresses, publishes new snapshots and shuts everything down.

use super::forward;
use super::guard::FramingGuard;
use super::{ListenerRole, Snapshot};
use crate::config::Config;
use crate::state::StateRegistry;
use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// State shared by every listener and connection.
#[derive(Debug)]
struct Shared {
    snapshot: ArcSwap<Snapshot>,
    states: StateRegistry,
    connections: Arc<Semaphore>,
}

/// The proxy, before it is started.
#[derive(Debug)]
pub struct Proxy;

/// A running proxy.
#[derive(Debug)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
    /// The shared listener's bound address.
    pub listen_addr: SocketAddr,
    /// Each dedicated listener's bound address, by upstream name.
    pub upstream_addrs: BTreeMap<String, SocketAddr>,
    stop: watch::Sender<bool>,
    listeners: JoinSet<()>,
}

impl Proxy {
    /// Binds the shared listener and every dedicated listener, then serves.
    pub async fn start(config: Config) -> io::Result<ProxyHandle> {
        let config = Arc::new(config);
        let states = StateRegistry::default();
        let snap = Snapshot::new(config.clone(), states.sync(&config));
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snap),
            states,
            connections: Arc::new(Semaphore::new(config.server.max_connections)),
        });
        let (stop, stop_rx) = watch::channel(false);
        let mut listeners = JoinSet::new();

        let l = bind(config.server.listen).await?;
        let listen_addr = l.local_addr()?;
        listeners.spawn(accept_loop(
            l,
            ListenerRole::Shared,
            shared.clone(),
            stop_rx.clone(),
        ));
        let mut upstream_addrs = BTreeMap::new();
        for u in &config.upstreams {
            if let Some(addr) = u.listen {
                let l = bind(addr).await?;
                upstream_addrs.insert(u.name.clone(), l.local_addr()?);
                let role = ListenerRole::Dedicated(u.name.clone());
                listeners.spawn(accept_loop(l, role, shared.clone(), stop_rx.clone()));
            }
        }
        Ok(ProxyHandle {
            shared,
            listen_addr,
            upstream_addrs,
            stop,
            listeners,
        })
    }
}

async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}

impl ProxyHandle {
    /// Publishes a new validated config; requests in flight keep theirs.
    pub fn reload(&self, config: Config) {
        let config = Arc::new(config);
        let states = self.shared.states.sync(&config);
        self.shared
            .snapshot
            .store(Arc::new(Snapshot::new(config, states)));
    }

    /// The snapshot requests are currently served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// Stops accepting, lets in-flight requests finish for up to `grace`,
    /// then drops whatever is left.
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let drained = async { while self.listeners.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(
                ?grace,
                "shutdown grace period over; closing the remaining connections"
            );
            self.listeners.abort_all();
        }
    }

    /// Resolves when every listener has stopped (after [`Self::shutdown`] or a fatal error).
    pub async fn wait(&mut self) {
        while self.listeners.join_next().await.is_some() {}
    }

    pub fn stop_accepting(&self) {
        let _ = self.stop.send(true);
    }
}

fn builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.server.header_read_timeout)
        .max_buf_size(config.server.max_header_bytes)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(config.server.max_header_bytes.min(u32::MAX as usize) as u32);
    b
}

async fn accept_loop(
    listener: TcpListener,
    role: ListenerRole,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        let permit = tokio::select! {
            p = shared.connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped(&mut stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let shared = shared.clone();
        let role = role.clone();
        let stop = stop.clone();
        conns.spawn(async move {
            serve_connection(stream, peer, role, shared, stop).await;
            drop(permit);
        });
    }
    drop(listener);
    // Draining: every connection finishes its in-flight requests.
    while conns.join_next().await.is_some() {}
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    role: ListenerRole,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (builder, max_head, head_timeout) = {
        let snap = shared.snapshot.load();
        let s = &snap.config.server;
        (
            builder(&snap.config),
            s.max_header_bytes,
            s.header_read_timeout,
        )
    };
    let svc = service_fn(move |req| {
        let snap = shared.snapshot.load_full();
        let role = role.clone();
        async move { Ok::<_, Infallible>(forward::handle(&snap, &role, req).await) }
    });
    let conn = builder.serve_connection_with_upgrades(
        TokioIo::new(FramingGuard::new(stream, max_head, head_timeout)),
        svc,
    );
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "client connection ended with an error");
            }
        }
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Resolves once the stop flag is set (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
