//! weir listening on a Unix-domain socket (docs/reference/protocols.md#unix-socket-listeners):
//! `listen = "unix:/run/weir/weir.sock"` (the shared listener, a dedicated
//! one, or the admin listener). [`bind`] makes the socket file with
//! `[server] socket_mode`, replacing one a crashed weir left behind and
//! refusing one another live process answers on; [`SocketFile`] removes it
//! again when its listener closes. A connection on it is served by the
//! general path (hyper's server: HTTP/1.1 or h2c); the fast path reads
//! TCP sockets only.

use super::general::conn::{serve_io, ClientConn, OpenClient, ServeState};
use super::ListenerRole;
use crate::address::Address;
use crate::shutdown::stopped;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The socket file a listener made: removed when the listener is done
/// (dropped), unless another process has put its own there since.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the file as made.
    id: (u64, u64),
}

impl SocketFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Listens on the socket file `path`, made with `mode`. A file already
/// there is replaced when it is a socket nobody answers on (a crashed
/// weir's); a socket someone answers on, or a file that is no socket, is an
/// error naming it. The listener is non-blocking, for tokio.
pub(crate) fn bind(
    path: &Path,
    mode: u32,
) -> io::Result<(std::os::unix::net::UnixListener, SocketFile)> {
    let named = |e: io::Error, what: &str| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on unix:{} ({what}): {e}", path.display()),
        )
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "cannot listen on unix:{}: a file that is not a socket is there",
                    path.display()
                ),
            ));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "unix:{} is already in use by another process",
                        path.display()
                    ),
                ));
            }
            // Nobody answers: a socket a process that is gone left behind.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(|e| named(e, "removing a stale socket"))?;
                tracing::info!(socket = %path.display(), "replaced a stale socket file");
            }
            Err(e) => return Err(named(e, "probing the socket file there")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, "reading what is there")),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| named(e, "binding"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| named(e, "setting socket_mode"))?;
    listener.set_nonblocking(true)?;
    let m = std::fs::symlink_metadata(path)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    };
    Ok((listener, file))
}

/// Accepts on `listener` until `stop`, serving each connection on the
/// general path; then lets them finish and removes the socket file.
pub(super) async fn serve(
    listener: std::os::unix::net::UnixListener,
    file: SocketFile,
    role: ListenerRole,
    shared: Arc<ServeState>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register a listening socket");
            return;
        }
    };
    let peer = Address::unix(&file.path);
    let mut conns = JoinSet::new();
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
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let conn = ClientConn::new(
            peer,
            role.clone(),
            shared.clone(),
            stop.clone(),
            pool.clone(),
        );
        let open = OpenClient::client(&shared.snapshot.load().metrics);
        conns.spawn(async move {
            serve_io(stream, conn).await;
            drop(open);
            drop(permit);
        });
    }
    // No new connection from here on: the file goes now, and those
    // accepted finish what they have.
    drop(listener);
    drop(file);
    while conns.join_next().await.is_some() {}
    reaper.abort();
}
