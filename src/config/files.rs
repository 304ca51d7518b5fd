//! The files a config names — CA bundles, certificates, keys — read, parsed
//! and built into the rustls configurations they are for, when the config is
//! loaded (docs/reference/configuration.md#configuration-and-defaults). `weir check`,
//! `weir run` and every reload go through this one loader, so none of them
//! accepts a file another refuses, and a failure is reported like any config
//! error: at the field that names the file. `crate::tls` builds its client
//! and server configurations with the same functions.

use super::{ListenerTls, UpstreamTls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Larger files are refused unread: no PEM bundle is this big, and a path
/// like `/dev/zero` must not hang a config load.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// A file that could not be loaded: the field (of its table) that names it,
/// and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// `ca_file`, `client_cert`, `client_key`, `cert` or `key`.
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All the errors of one table, each with its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileErrors(pub Vec<FileError>);

impl fmt::Display for FileErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An I/O error in words, without the `(os error N)` suffix.
fn words(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Reads a file a config names: a regular file of at most 16 MiB.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    let cannot = |why: String| format!("cannot read {path:?}: {why}");
    let meta = std::fs::metadata(path).map_err(|e| cannot(words(&e)))?;
    if !meta.is_file() {
        return Err(cannot("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(cannot(format!(
            "{} bytes is too large for a PEM file (at most 16 MiB)",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(|e| cannot(words(&e)))?;
    Ok(bytes)
}

/// The PEM certificates in a file (at least one).
pub fn certs(bytes: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(bytes).collect();
    let certs = certs.map_err(|e| format!("{path:?} is not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{path:?} holds no PEM certificate (no `-----BEGIN CERTIFICATE-----` block)"
        ));
    }
    Ok(certs)
}

/// The PEM private key in a file.
pub fn key(bytes: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("{path:?} holds no PEM private key (no `-----BEGIN … PRIVATE KEY-----` block)")
        }
        e => format!("{path:?} is not a PEM private key: {e}"),
    })
}

/// A file read and parsed as certificates; its bytes feed the fingerprint.
fn cert_file(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
    let bytes = read(path)?;
    let certs = certs(&bytes, path)?;
    Ok((bytes, certs))
}

fn key_file(path: &Path) -> Result<(Vec<u8>, PrivateKeyDer<'static>), String> {
    let bytes = read(path)?;
    let key = key(&bytes, path)?;
    Ok((bytes, key))
}

fn roots(path: &Path) -> Result<(Vec<u8>, RootCertStore), String> {
    let (bytes, certs) = cert_file(path)?;
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("{path:?}: unusable CA certificate: {e}"))?;
    }
    Ok((bytes, roots))
}

/// A client configuration and the fingerprint of the files it came from.
#[derive(Debug, Clone)]
pub struct ClientTls {
    pub config: Arc<ClientConfig>,
    pub fingerprint: u64,
}

/// The TLS client configuration for an upstream's `tls` table (none: the
/// webpki roots, no client certificate). Every file is loaded, and every one
/// that fails is reported.
pub fn client_config(tls: Option<&UpstreamTls>) -> Result<ClientTls, FileErrors> {
    let mut errors = Vec::new();
    let mut fail = |field: &'static str, message: String| {
        errors.push(FileError { field, message });
    };
    let ca = tls.and_then(|t| t.ca_file.as_deref()).map(roots);
    let cert = tls.and_then(|t| t.client_cert.as_deref()).map(cert_file);
    let key = tls.and_then(|t| t.client_key.as_deref()).map(key_file);
    let mut fp = std::collections::hash_map::DefaultHasher::new();
    let roots = match ca {
        Some(Ok((bytes, roots))) => {
            bytes.hash(&mut fp);
            roots
        }
        Some(Err(e)) => {
            fail("ca_file", e);
            RootCertStore::empty()
        }
        None => {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            roots
        }
    };
    let identity = match (cert, key) {
        (Some(Ok((cb, certs))), Some(Ok((kb, key)))) => {
            cb.hash(&mut fp);
            kb.hash(&mut fp);
            Some((certs, key))
        }
        (cert, key) => {
            if let Some(Err(e)) = cert {
                fail("client_cert", e);
            }
            if let Some(Err(e)) = key {
                fail("client_key", e);
            }
            None
        }
    };
    if !errors.is_empty() {
        return Err(FileErrors(errors));
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            FileErrors(vec![FileError {
                field: "ca_file",
                message: e.to_string(),
            }])
        })?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((certs, key)) => builder.with_client_auth_cert(certs, key).map_err(|e| {
            let cert = tls.and_then(|t| t.client_cert.as_deref());
            FileErrors(vec![FileError {
                field: "client_key",
                message: format!("this key cannot be used with client_cert {cert:?}: {e}"),
            }])
        })?,
        None => builder.with_no_client_auth(),
    };
    // ALPN is set by the connector from the upstream's protocol
    // (upstream::client): h2 + http/1.1, http/1.1 only, or h2 only.
    config.alpn_protocols.clear();
    Ok(ClientTls {
        config: Arc::new(config),
        fingerprint: fp.finish(),
    })
}

/// The server configuration of an inbound TLS listener (`cert`, `key`).
pub fn server_config(t: &ListenerTls) -> Result<Arc<ServerConfig>, FileErrors> {
    let cert = cert_file(&t.cert);
    let key = key_file(&t.key);
    let (certs, key) = match (cert, key) {
        (Ok((_, certs)), Ok((_, key))) => (certs, key),
        (cert, key) => {
            let mut errors = Vec::new();
            if let Err(message) = cert {
                errors.push(FileError {
                    field: "cert",
                    message,
                });
            }
            if let Err(message) = key {
                errors.push(FileError {
                    field: "key",
                    message,
                });
            }
            return Err(FileErrors(errors));
        }
    };
    let one = |field, message| FileErrors(vec![FileError { field, message }]);
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| one("cert", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            one(
                "key",
                format!("this key cannot be used with cert {:?}: {e}", t.cert),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
