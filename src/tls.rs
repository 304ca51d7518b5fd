//! TLS material: loading PEM certificates and keys, the client configuration
//! each `https://` upstream gets (webpki roots by default, or its `ca_file`;
//! an optional client certificate; ALPN by protocol), the server configuration
//! of an inbound TLS listener, and certificate failures in words.
//!
//! There is deliberately no way to skip verification. Files are read and
//! parsed by the config loader (`config::files`, docs/reference/reload.md#reload)
//! when a config is loaded or reloaded, so a rotated certificate or a new CA
//! takes effect on the next reload — which the file watch starts when one of
//! them changes ([`files_named`]); a fingerprint of their bytes tells
//! whether an upstream's connection pool must be rebuilt.

use crate::config::raw::RawConfig;
use crate::config::{ListenerTls, UpstreamConfig};
use rustls::ServerConfig;
use std::path::PathBuf;
use std::sync::Arc;

/// Every certificate, key and CA file a config names, as written: `[server]
/// tls`, and each upstream's `listen_tls` and `tls` (`ca_file`,
/// `client_cert`, `client_key`). Read from the raw model, so a config need
/// not validate to say which files it would load.
pub fn files_named(raw: &RawConfig) -> Vec<PathBuf> {
    let mut out: Vec<&str> = Vec::new();
    if let Some(t) = &raw.server.tls {
        out.extend([t.cert.as_str(), t.key.as_str()]);
    }
    for u in raw.upstreams.values() {
        if let Some(t) = &u.listen_tls {
            out.extend([t.cert.as_str(), t.key.as_str()]);
        }
        if let Some(t) = &u.tls {
            out.extend(
                [&t.ca_file, &t.client_cert, &t.client_key]
                    .into_iter()
                    .filter_map(|f| f.as_deref()),
            );
        }
    }
    let mut out: Vec<PathBuf> = out.into_iter().map(PathBuf::from).collect();
    out.sort();
    out.dedup();
    out
}

pub use crate::config::files::ClientTls;

/// The TLS client configuration for an upstream (also used, unused, by plain
/// `http://` upstreams, whose connector needs one). Its files are loaded as
/// the config loader loads them (`config::files`), so a config that passed
/// `weir check` builds here unless a file changed in between.
pub fn client_config(u: &UpstreamConfig) -> Result<ClientTls, String> {
    crate::config::files::client_config(u.tls.as_ref()).map_err(|e| format!("tls: {e}"))
}

/// The server configuration of an inbound TLS listener.
pub fn server_config(t: &ListenerTls) -> Result<Arc<ServerConfig>, String> {
    crate::config::files::server_config(t).map_err(|e| e.to_string())
}

/// The TLS failure in an error chain, in words ("unknown issuer",
/// "certificate expired", "certificate not valid for name …").
pub fn describe_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut depth = 0;
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<rustls::Error>() {
            return Some(describe(r));
        }
        depth += 1;
        if depth > 16 {
            return None;
        }
        // io::Error hides its payload from `source()`: look inside it
        // (TLS errors arrive wrapped in one io::Error or two).
        cur = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

fn describe(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "TLS certificate verification failed: unknown issuer (not signed by a trusted CA; set tls.ca_file for a private CA)".into(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                format!("TLS certificate verification failed: name mismatch ({c:?}); set tls.server_name if the certificate names another host")
            }
            C::Expired | C::ExpiredContext { .. } => "TLS certificate verification failed: certificate expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => "TLS certificate verification failed: certificate not valid yet".into(),
            C::Revoked => "TLS certificate verification failed: certificate revoked".into(),
            other => format!("TLS certificate verification failed: {other:?}"),
        },
        rustls::Error::AlertReceived(a) => format!("TLS handshake failed: the upstream sent alert {a:?} (does it require a client certificate?)"),
        other => format!("TLS handshake failed: {other}"),
    }
}
