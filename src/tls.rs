//! TLS material: loading PEM certificates and keys, the client configuration
//! each `https://` upstream gets (webpki roots by default, or its `ca_file`;
//! an optional client certificate; ALPN by protocol), the server configuration
//! of an inbound TLS listener, and certificate failures in words.
//!
//! There is deliberately no way to skip verification. Files are read when a
//! config is loaded or reloaded, so a rotated certificate or a new CA takes
//! effect on the next reload; a fingerprint of their bytes tells whether an
//! upstream's connection pool must be rebuilt.

use crate::config::{ListenerTls, UpstreamConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

fn certs(bytes: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(bytes).collect();
    let certs =
        certs.map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

fn key(bytes: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes)
        .map_err(|e| format!("{}: not a PEM private key: {e}", path.display()))
}

/// A client configuration and the fingerprint of the files it came from.
#[derive(Debug, Clone)]
pub struct ClientTls {
    pub config: Arc<ClientConfig>,
    pub fingerprint: u64,
}

/// The TLS client configuration for an upstream (also used, unused, by plain
/// `http://` upstreams, whose connector needs one).
pub fn client_config(u: &UpstreamConfig) -> Result<ClientTls, String> {
    let mut fp = std::collections::hash_map::DefaultHasher::new();
    let tls = u.tls.as_ref();
    let mut roots = RootCertStore::empty();
    match tls.and_then(|t| t.ca_file.as_ref()) {
        Some(ca) => {
            let bytes = read(ca, "ca_file")?;
            bytes.hash(&mut fp);
            for c in certs(&bytes, ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: unusable CA certificate: {e}", ca.display()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match tls.map(|t| (&t.client_cert, &t.client_key)) {
        Some((Some(cert), Some(keyf))) => {
            let cb = read(cert, "client_cert")?;
            let kb = read(keyf, "client_key")?;
            cb.hash(&mut fp);
            kb.hash(&mut fp);
            builder
                .with_client_auth_cert(certs(&cb, cert)?, key(&kb, keyf)?)
                .map_err(|e| format!("client_cert/client_key: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    // ALPN is set by the connector from the upstream's protocol
    // (proxy::client): h2 + http/1.1, http/1.1 only, or h2 only.
    config.alpn_protocols.clear();
    Ok(ClientTls {
        config: Arc::new(config),
        fingerprint: fp.finish(),
    })
}

/// The server configuration of an inbound TLS listener.
pub fn server_config(t: &ListenerTls) -> Result<Arc<ServerConfig>, String> {
    let cb = read(&t.cert, "tls.cert")?;
    let kb = read(&t.key, "tls.key")?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs(&cb, &t.cert)?, key(&kb, &t.key)?)
        .map_err(|e| format!("{}: {e}", t.cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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
