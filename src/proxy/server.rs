//! Listeners and connections. [`Proxy::start`] binds every listener the config
//! names (tests bind `127.0.0.1:0`) and returns a handle that reports the
//! bound addresses, publishes reloaded configs — binding listeners a reload
//! adds and draining those it removes — and shuts everything down.

use super::general::conn::{serve_io, ClientConn, OpenClient, ServeState};
use super::{ListenerRole, Snapshot};
use crate::address::Address;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::shutdown::stopped;
use crate::state::StateRegistry;
use crate::upstream::reach::ReachRegistry;
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

/// Connections the kernel may complete on a listener before weir accepts them.
const BACKLOG: i32 = 4096;
/// Connections a closing listener's backlog may add beyond the free
/// `max_connections` slots: the file descriptors a drain may spend.
const OVER_LIMIT_AT_CLOSE: usize = 64;

/// A listener is identified by what the config asked for: its configured
/// address and its role. A reload that names the same pair keeps it.
type ListenerKey = (Address, ListenerRole);

#[derive(Debug)]
struct Listening {
    /// The address bound: a TCP port 0 resolved, or the socket file.
    bound: Address,
    stop: watch::Sender<bool>,
    /// One accept loop per worker (each on its own SO_REUSEPORT socket).
    tasks: Vec<JoinHandle<()>>,
}

/// The proxy, before it is started.
#[derive(Debug)]
pub struct Proxy;

/// A running proxy.
#[derive(Debug)]
pub struct ProxyHandle {
    shared: Arc<ServeState>,
    /// Worker runtimes that run the accept loops and connections; empty:
    /// the runtime that started the proxy does.
    workers: Vec<tokio::runtime::Handle>,
    listeners: Mutex<BTreeMap<ListenerKey, Listening>>,
    /// Serialises reloads: binding, publishing and closing happen as one step.
    reloading: tokio::sync::Mutex<()>,
}

impl Proxy {
    /// Binds the shared listener and every dedicated listener, then serves.
    pub async fn start(config: Config) -> io::Result<ProxyHandle> {
        Proxy::start_with(config, Arc::new(Metrics::new())).await
    }

    /// [`Proxy::start`] recording into `metrics`.
    pub async fn start_with(config: Config, metrics: Arc<Metrics>) -> io::Result<ProxyHandle> {
        Proxy::start_on(config, metrics, Vec::new()).await
    }

    /// Starts the proxy with its listeners and connections on `workers`:
    /// one SO_REUSEPORT socket per listener per worker, so the kernel spreads
    /// connections and each connection lives on one thread, start to end.
    pub async fn start_on(
        config: Config,
        metrics: Arc<Metrics>,
        workers: Vec<tokio::runtime::Handle>,
    ) -> io::Result<ProxyHandle> {
        let config = Arc::new(config);
        let states = StateRegistry::new(metrics.clone());
        let reaches = ReachRegistry::new();
        let plan = reaches.plan(&config, &metrics).map_err(io::Error::other)?;
        let upstreams = states.sync(&config).map_err(io::Error::other)?;
        let reached = reaches.apply(plan, &config, &metrics);
        let tracing = crate::trace::Registry::default();
        let tracer = tracing
            .sync(&config.tracing, metrics.trace())
            .map_err(io::Error::other)?;
        let mut snap = Snapshot::build(config.clone(), upstreams, reached, metrics)
            .map_err(io::Error::other)?;
        snap.tracer = tracer;
        let shared = Arc::new(ServeState {
            snapshot: ArcSwap::from_pointee(snap),
            states,
            reaches,
            connections: Arc::new(Semaphore::new(config.server.max_connections)),
            draining: AtomicBool::new(false),
            tracing,
        });
        let handle = ProxyHandle {
            shared,
            workers,
            listeners: Mutex::new(BTreeMap::new()),
            reloading: tokio::sync::Mutex::new(()),
        };
        let added = handle.bind_missing(&config).await?;
        handle.listeners().extend(added);
        Ok(handle)
    }
}

fn wanted(config: &Config) -> Vec<ListenerKey> {
    let mut v = vec![(config.server.listen, ListenerRole::Shared)];
    for u in &config.upstreams {
        if let Some(l) = u.listen {
            v.push((l, ListenerRole::Dedicated(u.name.clone())));
        }
    }
    v
}

impl ProxyHandle {
    fn listeners(&self) -> std::sync::MutexGuard<'_, BTreeMap<ListenerKey, Listening>> {
        self.listeners.lock().expect("listener table lock poisoned")
    }

    /// Binds every listener `config` wants that is not bound yet. On error
    /// nothing new is kept.
    async fn bind_missing(&self, config: &Config) -> io::Result<Vec<(ListenerKey, Listening)>> {
        // An address weir itself listens on under another role (a reload
        // that renames a dedicated upstream) is not another process's.
        let (missing, ours): (Vec<ListenerKey>, Vec<Address>) = {
            let have = self.listeners();
            let missing = wanted(config)
                .into_iter()
                .filter(|k| !have.contains_key(k))
                .collect();
            (missing, have.keys().map(|(a, _)| *a).collect())
        };
        let mut bound = Vec::new();
        let mut files = Vec::new();
        let mode = config.server.socket_mode;
        for (at, role) in missing {
            let addr = match at {
                Address::Tcp(addr) => addr,
                Address::Unix(path) => {
                    files.push(((at, role), super::listen_unix::bind(path, mode)?));
                    continue;
                }
            };
            let alone = !ours.contains(&at);
            let sockets =
                bind(addr, self.workers.len().max(1), alone).map_err(|e| match e.kind() {
                    io::ErrorKind::AddrInUse => e,
                    _ => io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")),
                })?;
            bound.push(((at, role), sockets));
        }
        let mut out = Vec::new();
        for ((at, role), (listener, file)) in files {
            let (stop, stop_rx) = watch::channel(false);
            let fut = super::listen_unix::serve(
                listener,
                file,
                role.clone(),
                self.shared.clone(),
                stop_rx,
            );
            let task = match self.workers.first() {
                Some(worker) => worker.spawn(fut),
                None => tokio::spawn(fut),
            };
            tracing::info!(listen = %at, role = %role, "listening");
            out.push((
                (at, role),
                Listening {
                    bound: at,
                    stop,
                    tasks: vec![task],
                },
            ));
        }
        for ((addr, role), sockets) in bound {
            let local = Address::Tcp(sockets[0].local_addr()?);
            let (stop, stop_rx) = watch::channel(false);
            let mut tasks = Vec::new();
            for (i, socket) in sockets.into_iter().enumerate() {
                let fut = serve_socket(socket, role.clone(), self.shared.clone(), stop_rx.clone());
                tasks.push(match self.workers.get(i) {
                    Some(worker) => worker.spawn(fut),
                    None => tokio::spawn(fut),
                });
            }
            tracing::info!(listen = %local, role = %role, workers = tasks.len(), "listening");
            out.push((
                (addr, role),
                Listening {
                    bound: local,
                    stop,
                    tasks,
                },
            ));
        }
        Ok(out)
    }

    /// Publishes a new validated config: binds the listeners it adds (if one
    /// cannot be bound, nothing changes and the error is returned), swaps the
    /// snapshot, then closes the listeners it removed, letting their
    /// connections finish. Requests in flight keep the snapshot they started with.
    pub async fn reload(&self, config: Config) -> io::Result<()> {
        let _one_at_a_time = self.reloading.lock().await;
        let config = Arc::new(config);
        // Inbound TLS files first: nothing changes if one cannot be read.
        let probe = Snapshot::build(
            config.clone(),
            Vec::new(),
            Vec::new(),
            self.shared.states.metrics().clone(),
        )
        .map_err(io::Error::other)?;
        drop(probe);
        let tracer = self
            .shared
            .tracing
            .sync(&config.tracing, self.shared.states.metrics().trace())
            .map_err(io::Error::other)?;
        let metrics = self.shared.states.metrics().clone();
        // Everything that can fail, before anything changes: the upstreams'
        // TLS files, the listeners, the fleet's shared state.
        let plan = self
            .shared
            .reaches
            .plan(&config, &metrics)
            .map_err(io::Error::other)?;
        let added = self.bind_missing(&config).await?;
        let states = match self.shared.states.sync(&config) {
            Ok(s) => s,
            Err(e) => {
                for (_, l) in added {
                    let _ = l.stop.send(true);
                }
                return Err(io::Error::other(e));
            }
        };
        let reached = self.shared.reaches.apply(plan, &config, &metrics);
        let mut snap =
            Snapshot::build(config.clone(), states, reached, metrics).map_err(io::Error::other)?;
        snap.tracer = tracer;
        self.shared.snapshot.store(Arc::new(snap));
        let keep = wanted(&config);
        let mut table = self.listeners();
        table.extend(added);
        let gone: Vec<ListenerKey> = table
            .keys()
            .filter(|k| !keep.contains(k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(l) = table.remove(&k) {
                tracing::info!(listen = %l.bound, role = %k.1, "closing listener (draining its connections)");
                let _ = l.stop.send(true);
            }
        }
        Ok(())
    }

    /// The fleet's shared state in force, with `[state] backend = "redis"`.
    pub fn fleet(&self) -> Option<crate::state::fleet::Fleet> {
        self.shared.states.fleet()
    }

    /// The snapshot requests are currently served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        self.shared.states.metrics()
    }

    /// The shared listener's bound TCP address (0.0.0.0:0 when it is a
    /// Unix-domain socket: [`ProxyHandle::listen_address`]).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_address()
            .tcp()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The shared listener's bound address, of either kind.
    pub fn listen_address(&self) -> Address {
        self.listeners()
            .iter()
            .find(|((_, r), _)| *r == ListenerRole::Shared)
            .map(|(_, l)| l.bound)
            .unwrap_or(Address::Tcp(SocketAddr::from(([0, 0, 0, 0], 0))))
    }

    /// Each dedicated TCP listener's bound address, by upstream name.
    pub fn upstream_addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.listeners()
            .iter()
            .filter_map(|((_, r), l)| match r {
                ListenerRole::Dedicated(n) => Some((n.clone(), l.bound.tcp()?)),
                ListenerRole::Shared => None,
            })
            .collect()
    }

    /// Whether shutdown has begun (`/readyz` answers 503).
    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Stops accepting on every listener; connections finish what they have.
    pub fn stop_accepting(&self) {
        self.shared.draining.store(true, Ordering::Release);
        for l in self.listeners().values() {
            let _ = l.stop.send(true);
        }
    }

    /// Stops accepting, lets in-flight requests finish for up to `grace`,
    /// then closes whatever is left.
    pub async fn shutdown(&self, grace: Duration) {
        self.stop_accepting();
        let tasks: Vec<JoinHandle<()>> = {
            let mut table = self.listeners();
            std::mem::take(&mut *table)
                .into_values()
                .flat_map(|l| l.tasks)
                .collect()
        };
        let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        let drained = async {
            for t in tasks {
                let _ = t.await;
            }
        };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(
                ?grace,
                "shutdown_timeout reached; closing the remaining connections"
            );
            for a in aborts {
                a.abort();
            }
        }
    }
}

/// `n` listening sockets on `addr` (SO_REUSEPORT when more than one; port 0
/// picks one port for all of them). `alone`: first check that nothing else
/// listens there.
///
/// SO_REUSEPORT would also let a second weir (or anything else with the
/// option, same user) share the port and take part of the traffic unnoticed
/// — an old instance with an old config. So the address is first bound
/// alone, without the option: that fails while anyone is listening there,
/// and weir refuses to start (docs/reference/protocols.md#listeners).
fn bind(addr: SocketAddr, n: usize, alone: bool) -> io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let in_use = |e: io::Error| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                e.kind(),
                format!("{addr} is already in use by another process"),
            )
        } else {
            e
        }
    };
    if alone && addr.port() != 0 {
        let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into()).map_err(in_use)?;
    }
    let mut out: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    let mut at = addr;
    for _ in 0..n {
        let s = Socket::new(Domain::for_address(at), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        #[cfg(unix)]
        if n > 1 {
            s.set_reuse_port(true)?;
        }
        s.set_nonblocking(true)?;
        s.bind(&at.into()).map_err(in_use)?;
        s.listen(BACKLOG)?;
        let l: std::net::TcpListener = s.into();
        at = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

/// Turns a bound socket into a tokio listener on the runtime running this
/// future (a worker's), then accepts on it.
async fn serve_socket(
    socket: std::net::TcpListener,
    role: ListenerRole,
    shared: Arc<ServeState>,
    stop: watch::Receiver<bool>,
) {
    match TcpListener::from_std(socket) {
        Ok(l) => accept_loop(l, role, shared, stop).await,
        Err(e) => tracing::error!(error = %e, "cannot register a listening socket"),
    }
}

async fn accept_loop(
    listener: TcpListener,
    role: ListenerRole,
    shared: Arc<ServeState>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    // Idle upstream connections of the fast path: one pool per accept loop,
    // so per worker runtime.
    let pool = Arc::new(super::fast::Pool::default());
    let reaper = tokio::spawn(super::fast::Pool::reaper(Arc::downgrade(&pool)));
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
        let pool = pool.clone();
        conns.spawn(async move {
            serve_connection(stream, peer, role, shared, stop, pool).await;
            drop(permit);
        });
    }
    // Connections the kernel completed but not yet handed over would be
    // reset when the listener closes, under a client that believes it is
    // connected: they are taken now and served as draining ones, each once
    // a connection slot frees (docs/reference/shutdown.md#shutdown).
    let room = shared.connections.available_permits() + OVER_LIMIT_AT_CLOSE;
    let wait = shared.snapshot.load().config.server.header_read_timeout;
    for (stream, peer) in take_queued(listener, room) {
        let shared = shared.clone();
        let (role, stop, pool) = (role.clone(), stop.clone(), pool.clone());
        conns.spawn(async move {
            // A slot if one frees within a head's time; otherwise served
            // without one (once, being drained) rather than left waiting.
            let slot = shared.connections.clone().acquire_owned();
            let permit = tokio::time::timeout(wait, slot)
                .await
                .ok()
                .and_then(Result::ok);
            serve_connection(stream, peer, role, shared, stop, pool).await;
            drop(permit);
        });
    }
    // Draining: every connection finishes its in-flight requests.
    while conns.join_next().await.is_some() {}
    reaper.abort();
}

/// Closes `listener` after accepting what its backlog holds, up to `room`
/// connections.
fn take_queued(listener: TcpListener, room: usize) -> Vec<(TcpStream, SocketAddr)> {
    let mut queued = Vec::new();
    // Out of the reactor: its readiness may not have seen the last arrivals
    // yet, so the socket itself is asked until it has none.
    let Ok(listener) = listener.into_std() else {
        return queued;
    };
    while queued.len() < room.min(BACKLOG as usize) {
        let s = match listener.accept() {
            Ok((s, peer)) => s.set_nonblocking(true).map(|()| (s, peer)),
            // Gone before it was taken: the next one.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            // None left (`WouldBlock`), or no descriptor for one.
            Err(_) => break,
        };
        if let Ok((s, peer)) = s {
            if let Ok(stream) = TcpStream::from_std(s) {
                queued.push((stream, peer));
            }
        }
    }
    if !queued.is_empty() {
        tracing::debug!(n = queued.len(), "took the connections queued at close");
    }
    queued
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    role: ListenerRole,
    shared: Arc<ServeState>,
    stop: watch::Receiver<bool>,
    pool: Arc<super::fast::Pool>,
) {
    let _ = stream.set_nodelay(true);
    let (_open, tls, fast_path) = {
        let snap = shared.snapshot.load();
        (
            OpenClient::client(&snap.metrics),
            snap.acceptors.get(&role).cloned(),
            snap.config.server.fast_path,
        )
    };
    let conn = ClientConn::new(Address::Tcp(peer), role, shared, stop, pool.clone());
    let head_timeout = conn.head_timeout;
    match tls {
        None if fast_path => super::fast::serve(stream, conn, pool).await,
        None => serve_io(stream, conn).await,
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            // The handshake gets the same bound as a request head.
            match tokio::time::timeout(head_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_io(tls, conn).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "inbound TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "inbound TLS handshake timed out"),
            }
        }
    }
}
