//! TLS origination against real TLS upstreams with certificates made here
//! (rcgen): private CAs, name checks, mTLS, ALPN, rotation through a reload
//! and through the file watch (a Kubernetes Secret's symlink swap), and
//! inbound TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Issuer = CertifiedIssuer<'static, KeyPair>;

fn ca(name: &str) -> Issuer {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate for `names`, signed by `issuer`: (cert PEM, key PEM).
fn leaf(issuer: &Issuer, names: &[&str]) -> (String, String) {
    let p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(
    cert: &str,
    key: &str,
    alpn: &[&str],
    client_ca: Option<&Issuer>,
) -> Arc<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let b = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der().clone()).unwrap();
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .unwrap();
            b.with_client_cert_verifier(v)
        }
        None => b.with_no_client_auth(),
    };
    let mut c = b.with_single_cert(certs, key).unwrap();
    c.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    Arc::new(c)
}

/// A TLS upstream whose certificate can be swapped; records the HTTP version
/// of each request and closes every connection after one response.
struct TlsUpstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    /// TLS connections accepted.
    accepted: Arc<AtomicUsize>,
    versions: Arc<Mutex<Vec<http::Version>>>,
    config: Arc<Mutex<Arc<rustls::ServerConfig>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tls_upstream(config: Arc<rustls::ServerConfig>) -> TlsUpstream {
    tls_upstream_with(config, true).await
}

/// A TLS upstream answering "secure"; `close`: with `Connection: close`.
async fn tls_upstream_with(config: Arc<rustls::ServerConfig>, close: bool) -> TlsUpstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let versions = Arc::new(Mutex::new(Vec::new()));
    let config = Arc::new(Mutex::new(config));
    let (h, v, c, a) = (
        hits.clone(),
        versions.clone(),
        config.clone(),
        accepted.clone(),
    );
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let acceptor = tokio_rustls::TlsAcceptor::from(c.lock().unwrap().clone());
            let (h, v) = (h.clone(), v.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    h.fetch_add(1, Ordering::SeqCst);
                    v.lock().unwrap().push(req.version());
                    async move {
                        let mut b = Response::builder();
                        if close {
                            b = b.header("connection", "close");
                        }
                        Ok::<_, std::convert::Infallible>(b.body(body("secure")).unwrap())
                    }
                });
                let b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = b.serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    TlsUpstream {
        addr,
        hits,
        accepted,
        versions,
        config,
        task,
    }
}

/// A running weir on the config at `path`, watching its files when `watch`.
async fn start(path: &Path, watch: bool) -> weir::runtime::Runtime {
    let config = weir::config::Config::load(path).unwrap();
    let options = weir::runtime::Options {
        watch,
        sighup: false,
        workers: 0,
    };
    weir::runtime::Runtime::start(config, options)
        .await
        .unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn through(weir: &Weir) -> (u16, String, String) {
    let (parts, b) = read_body(get(&client(), &weir.url("/"), "svc").await).await;
    (
        parts.status.as_u16(),
        header(&parts, "x-weir-error"),
        String::from_utf8_lossy(&b).into_owned(),
    )
}

#[tokio::test]
async fn private_ca_via_ca_file_and_alpn_h2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("private");
    let (cert, key) = leaf(&ca, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["h2", "http/1.1"], None)).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let weir = Weir::single(
        &format!("https://localhost:{}", up.addr.port()),
        &format!(
            "[upstreams.svc.tls]\nca_file = {:?}\n",
            ca_file.display().to_string()
        ),
    )
    .await;
    assert_eq!(through(&weir).await, (200, String::new(), "secure".into()));
    assert_eq!(
        up.versions.lock().unwrap().clone(),
        vec![http::Version::HTTP_2]
    );
}

#[tokio::test]
async fn alpn_without_h2_gives_http1() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("private");
    let (cert, key) = leaf(&ca, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["http/1.1"], None)).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let weir = Weir::single(
        &format!("https://localhost:{}", up.addr.port()),
        &format!(
            "[upstreams.svc.tls]\nca_file = {:?}\n",
            ca_file.display().to_string()
        ),
    )
    .await;
    assert_eq!(through(&weir).await.0, 200);
    assert_eq!(
        up.versions.lock().unwrap().clone(),
        vec![http::Version::HTTP_11]
    );
}

#[tokio::test]
async fn an_unknown_issuer_is_502_naming_the_cause_and_nothing_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (real, other) = (ca("real"), ca("other"));
    let (cert, key) = leaf(&real, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["h2", "http/1.1"], None)).await;
    let ca_file = write(dir.path(), "ca.pem", &other.pem());
    let weir = Weir::single(
        &format!("https://localhost:{}", up.addr.port()),
        &format!(
            "[upstreams.svc.tls]\nca_file = {:?}\n",
            ca_file.display().to_string()
        ),
    )
    .await;
    let (status, code, json) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!((status, code.as_str()), (502, "connect_failed"));
    assert!(
        json["message"].as_str().unwrap().contains("unknown issuer"),
        "{json}"
    );
    assert_eq!(
        up.hits.load(Ordering::SeqCst),
        0,
        "the upstream handler ran"
    );
}

#[tokio::test]
async fn a_name_mismatch_is_refused_unless_server_name_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("private");
    let (cert, key) = leaf(&ca, &["api.internal.example"]);
    let up = tls_upstream(server_config(&cert, &key, &["http/1.1"], None)).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let url = format!("https://localhost:{}", up.addr.port());
    let tls = format!(
        "[upstreams.svc.tls]\nca_file = {:?}\n",
        ca_file.display().to_string()
    );
    let weir = Weir::single(&url, &tls).await;
    let (status, code, json) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!((status, code.as_str()), (502, "connect_failed"));
    assert!(
        json["message"].as_str().unwrap().contains("name mismatch"),
        "{json}"
    );
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);

    let weir = Weir::single(
        &url,
        &format!("{tls}server_name = \"api.internal.example\"\n"),
    )
    .await;
    assert_eq!(through(&weir).await.0, 200);
}

#[tokio::test]
async fn mtls_works_with_a_client_certificate_and_is_refused_without() {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (ca("servers"), ca("clients"));
    let (cert, key) = leaf(&server_ca, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["http/1.1"], Some(&client_ca))).await;
    let ca_file = write(dir.path(), "ca.pem", &server_ca.pem());
    let (ccert, ckey) = leaf(&client_ca, &["weir.client"]);
    let cc = write(dir.path(), "client.pem", &ccert);
    let ck = write(dir.path(), "client.key", &ckey);
    let url = format!("https://localhost:{}", up.addr.port());
    let tls = format!(
        "[upstreams.svc.tls]\nca_file = {:?}\n",
        ca_file.display().to_string()
    );

    let without = Weir::single(
        &url,
        &format!("{tls}[upstreams.svc.retry]\nmax_attempts = 1\n"),
    )
    .await;
    let (status, code, _) = through(&without).await;
    assert_eq!((status, code.as_str()), (502, "connect_failed"));
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);

    let with = Weir::single(
        &url,
        &format!(
            "{tls}client_cert = {:?}\nclient_key = {:?}\n",
            cc.display().to_string(),
            ck.display().to_string()
        ),
    )
    .await;
    assert_eq!(through(&with).await, (200, String::new(), "secure".into()));
    assert_eq!(up.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_new_ca_file_takes_effect_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (ca("old"), ca("new"));
    let (cert, key) = leaf(&old, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["http/1.1"], None)).await;
    let ca_file = write(dir.path(), "ca.pem", &old.pem());
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.svc]\nurl = \"https://localhost:{}\"\nhosts = [\"svc\"]\n[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.tls]\nca_file = {:?}\n",
        up.addr.port(),
        ca_file.display().to_string()
    );
    let path = write(dir.path(), "weir.toml", &cfg);
    let rt = start(&path, false).await;
    let url = format!("http://{}/", rt.proxy.listen_addr());
    let status = || async { get(&client(), &url, "svc").await.status().as_u16() };
    assert_eq!(status().await, 200);

    // The upstream rotates to a certificate from the new CA: weir refuses it...
    let (cert, key) = leaf(&new, &["localhost"]);
    *up.config.lock().unwrap() = server_config(&cert, &key, &["http/1.1"], None);
    assert_eq!(status().await, 502);
    // ...until the new CA is in ca_file and the config is reloaded.
    std::fs::write(&ca_file, new.pem()).unwrap();
    rt.reloader.reload("test").await.unwrap();
    assert_eq!(status().await, 200);
    rt.shutdown(std::time::Duration::from_secs(1)).await;
}

/// The certificate weir's listener at `addr` presents to a client that
/// trusts `ca`; `None` when the handshake fails.
async fn served_certificate(addr: SocketAddr, ca: &Issuer) -> Option<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let s = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .ok()?;
    let certs = s.get_ref().1.peer_certificates()?;
    Some(certs[0].as_ref().to_vec())
}

/// DER of the first certificate in PEM text.
fn der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .as_ref()
        .to_vec()
}

/// A Secret volume as the kubelet lays it out and updates it: the files of
/// each version in a directory of their own (`..2026_12_02_a`), a `..data`
/// link to the current one, and `tls.crt`, `tls.key` linking through
/// `..data`. An update writes the new directory, points `..data_tmp` at it,
/// renames that over `..data` (atomic) and removes the old directory.
struct SecretVolume {
    dir: PathBuf,
    version: usize,
}

impl SecretVolume {
    fn new(dir: &Path, cert: &str, key: &str) -> SecretVolume {
        std::fs::create_dir_all(dir).unwrap();
        let mut v = SecretVolume {
            dir: dir.to_path_buf(),
            version: 0,
        };
        v.update(cert, key);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
        v
    }

    fn update(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let name = format!("..2026_12_02_{}", self.version);
        let new = self.dir.join(&name);
        std::fs::create_dir(&new).unwrap();
        write(&new, "tls.crt", cert);
        write(&new, "tls.key", key);
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if self.version > 1 {
            let old = format!("..2026_12_02_{}", self.version - 1);
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }

    fn cert(&self) -> String {
        self.dir.join("tls.crt").display().to_string()
    }

    fn key(&self) -> String {
        self.dir.join("tls.key").display().to_string()
    }
}

/// Issue 32, item 8: a certificate rotated the way Kubernetes rotates a
/// Secret (outside the config's directory) is served within seconds,
/// through the same reload a config change takes — no SIGHUP, no `POST
/// /reload`; a second rotation too (the watch follows the moved files).
#[tokio::test]
async fn a_certificate_swapped_like_a_kubernetes_secret_is_served_without_a_signal() {
    let root = tempfile::tempdir().unwrap();
    let ca = ca("inbound");
    let (cert1, key1) = leaf(&ca, &["localhost"]);
    let mut secret = SecretVolume::new(&root.path().join("tls"), &cert1, &key1);
    let up = TestUpstream::text("plain upstream").await;
    let conf = root.path().join("config");
    std::fs::create_dir(&conf).unwrap();
    let path = write(
        &conf,
        "weir.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             tls = {{ cert = {:?}, key = {:?} }}\n\
             [upstreams.svc]\nurl = \"{}\"\nhosts = [\"localhost\"]\n",
            secret.cert(),
            secret.key(),
            up.url()
        ),
    );
    let rt = start(&path, true).await;
    let addr = rt.proxy.listen_addr();
    assert_eq!(served_certificate(addr, &ca).await, Some(der(&cert1)));
    let reloads = |result: &str| {
        let text = rt.proxy.snapshot().metrics.render();
        let line = format!("weir_config_reloads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .map_or(0.0, |v| v.parse::<f64>().unwrap())
    };

    for round in 0..2 {
        let (cert, key) = leaf(&ca, &["localhost"]);
        let before = reloads("ok");
        secret.update(&cert, &key);
        let mut served = None;
        for _ in 0..100 {
            served = served_certificate(addr, &ca).await;
            if served.as_deref() == Some(&der(&cert)[..]) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(
            served,
            Some(der(&cert)),
            "round {round}: the new certificate is not served 5 s after the swap"
        );
        assert_eq!(reloads("ok"), before + 1.0, "round {round}: one reload");
        assert_eq!(reloads("error"), 0.0);
    }
    rt.shutdown(std::time::Duration::from_secs(1)).await;
}

/// A CA file replaced in its own directory (written aside, renamed over)
/// takes effect without a signal; a change elsewhere in that directory that
/// leaves every file weir reads as it was reloads nothing.
#[tokio::test]
async fn a_replaced_ca_file_takes_effect_without_a_signal() {
    let root = tempfile::tempdir().unwrap();
    let pki = root.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let (old, new) = (ca("old"), ca("new"));
    let (cert, key) = leaf(&old, &["localhost"]);
    let up = tls_upstream(server_config(&cert, &key, &["http/1.1"], None)).await;
    let ca_file = write(&pki, "ca.pem", &old.pem());
    let path = write(
        root.path(),
        "weir.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[upstreams.svc]\nurl = \"https://localhost:{}\"\nhosts = [\"svc\"]\n[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.tls]\nca_file = {:?}\n",
            up.addr.port(),
            ca_file.display().to_string()
        ),
    );
    let rt = start(&path, true).await;
    let url = format!("http://{}/", rt.proxy.listen_addr());
    let status = || async { get(&client(), &url, "svc").await.status().as_u16() };
    assert_eq!(status().await, 200);
    let reloads = || {
        let text = rt.proxy.snapshot().metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix("weir_config_reloads_total{result=\"ok\"} "))
            .map_or(0.0, |v| v.parse::<f64>().unwrap())
    };

    // Something else in the directory changes: nothing weir reads did.
    let started = reloads();
    write(&pki, "unrelated.txt", "x");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(
        reloads(),
        started,
        "no reload for a file weir does not read"
    );

    let (cert, key) = leaf(&new, &["localhost"]);
    *up.config.lock().unwrap() = server_config(&cert, &key, &["http/1.1"], None);
    assert_eq!(status().await, 502);
    write(&pki, "ca.pem.tmp", &new.pem());
    std::fs::rename(pki.join("ca.pem.tmp"), &ca_file).unwrap();
    let mut got = 0;
    for _ in 0..100 {
        got = status().await;
        if got == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(got, 200, "the new CA is not in use 5 s after the rename");
    assert_eq!(reloads(), started + 1.0);
    rt.shutdown(std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn inbound_tls_on_the_shared_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("inbound");
    let (cert, key) = leaf(&ca, &["localhost"]);
    let c = write(dir.path(), "weir.pem", &cert);
    let k = write(dir.path(), "weir.key", &key);
    let up = TestUpstream::text("plain upstream").await;
    let weir = Weir::with_server(
        &format!(
            "tls = {{ cert = {:?}, key = {:?} }}",
            c.display().to_string(),
            k.display().to_string()
        ),
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"localhost\"]\n",
            up.url()
        ),
    )
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .build();
    let c: hyper_util::client::legacy::Client<_, TestBody> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let req = Request::get(format!("https://localhost:{}/", weir.addr.port()))
        .body(body(""))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2, "ALPN should pick h2");
    let (parts, b) = read_body(resp).await;
    assert_eq!(
        (parts.status.as_u16(), &b[..]),
        (200, &b"plain upstream"[..])
    );
}

#[tokio::test]
async fn inbound_tls_on_a_dedicated_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("inbound");
    let (cert, key) = leaf(&ca, &["localhost"]);
    let c = write(dir.path(), "weir.pem", &cert);
    let k = write(dir.path(), "weir.key", &key);
    let up = TestUpstream::text("dedicated").await;
    let weir = Weir::start(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nlisten = \"127.0.0.1:0\"\nlisten_tls = {{ cert = {:?}, key = {:?} }}\n",
        up.url(),
        c.display().to_string(),
        k.display().to_string()
    ))
    .await;
    let port = weir.dedicated("svc").port();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let c: hyper_util::client::legacy::Client<_, TestBody> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let req = Request::get(format!("https://localhost:{port}/"))
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(c.request(req).await.unwrap()).await;
    assert_eq!((parts.status.as_u16(), &b[..]), (200, &b"dedicated"[..]));
    // Plain HTTP on the TLS port gets no answer.
    let plain = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        client().request(
            Request::get(format!("http://127.0.0.1:{port}/"))
                .body(body(""))
                .unwrap(),
        ),
    )
    .await;
    assert!(
        !matches!(plain, Ok(Ok(ref r)) if r.status() == 200),
        "plain HTTP was served on a TLS listener"
    );
}

// An `https://` upstream pinned to `protocol = "http1"` is reached by the
// fast path's own TLS connections (and by hyper's on the general path):
// the same verification, the same answers, connections kept and reused.

const HTTP1: &str = "protocol = \"http1\"\n";

both_paths!(
    #[tokio::test]
    http1_over_tls_keeps_one_connection_for_many_requests
);
async fn http1_over_tls_keeps_one_connection_for_many_requests(path: DataPath) {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("private");
    let (cert, key) = leaf(&ca, &["localhost"]);
    let up = tls_upstream_with(server_config(&cert, &key, &["h2", "http/1.1"], None), false).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    // An IP literal: a name would send the first request through hyper's
    // pool while the resolver has not answered yet.
    let weir = Weir::single_on(
        path,
        &format!("https://127.0.0.1:{}", up.addr.port()),
        &format!(
            "{HTTP1}[upstreams.svc.tls]\nca_file = {:?}\nserver_name = \"localhost\"\n",
            ca_file.display().to_string()
        ),
    )
    .await;
    for _ in 0..10 {
        assert_eq!(through(&weir).await, (200, String::new(), "secure".into()));
    }
    let req = Request::post(weir.url("/"))
        .header("host", "svc")
        .body(body("x".repeat(20_000)))
        .unwrap();
    assert_eq!(client().request(req).await.unwrap().status(), 200);
    assert_eq!(up.hits.load(Ordering::SeqCst), 11);
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        1,
        "the connection was not reused"
    );
    assert!(up
        .versions
        .lock()
        .unwrap()
        .iter()
        .all(|v| *v == http::Version::HTTP_11));
}

both_paths!(
    #[tokio::test]
    http1_over_tls_verifies_like_the_general_path
);
async fn http1_over_tls_verifies_like_the_general_path(path: DataPath) {
    let dir = tempfile::tempdir().unwrap();
    let (real, other) = (ca("real"), ca("other"));
    let (cert, key) = leaf(&real, &["api.internal.example"]);
    let up = tls_upstream_with(server_config(&cert, &key, &["http/1.1"], None), false).await;
    let url = format!("https://localhost:{}", up.addr.port());
    let tls = |ca: &Issuer, extra: &str| {
        let f = write(dir.path(), "ca.pem", &ca.pem());
        format!(
            "{HTTP1}[upstreams.svc.tls]\nca_file = {:?}\n{extra}",
            f.display().to_string()
        )
    };
    for (ca, extra, cause) in [
        (
            &other,
            "server_name = \"api.internal.example\"\n",
            "unknown issuer",
        ),
        (&real, "", "name mismatch"),
    ] {
        let weir = Weir::single_on(path, &url, &tls(ca, extra)).await;
        let (status, code, json) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
        assert_eq!((status, code.as_str()), (502, "connect_failed"));
        assert!(json["message"].as_str().unwrap().contains(cause), "{json}");
    }
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    let weir = Weir::single_on(
        path,
        &url,
        &tls(&real, "server_name = \"api.internal.example\"\n"),
    )
    .await;
    assert_eq!(through(&weir).await, (200, String::new(), "secure".into()));
}

both_paths!(
    #[tokio::test]
    http1_over_tls_presents_the_client_certificate
);
async fn http1_over_tls_presents_the_client_certificate(path: DataPath) {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (ca("servers"), ca("clients"));
    let (cert, key) = leaf(&server_ca, &["localhost"]);
    let config = server_config(&cert, &key, &["http/1.1"], Some(&client_ca));
    let up = tls_upstream_with(config, false).await;
    let ca_file = write(dir.path(), "ca.pem", &server_ca.pem());
    let (ccert, ckey) = leaf(&client_ca, &["weir.client"]);
    let cc = write(dir.path(), "client.pem", &ccert);
    let ck = write(dir.path(), "client.key", &ckey);
    let url = format!("https://localhost:{}", up.addr.port());
    let tls = format!(
        "{HTTP1}[upstreams.svc.tls]\nca_file = {:?}\n",
        ca_file.display().to_string()
    );
    let without = Weir::single_on(
        path,
        &url,
        &format!("{tls}[upstreams.svc.retry]\nmax_attempts = 1\n"),
    )
    .await;
    let (status, code, _) = through(&without).await;
    assert_eq!((status, code.as_str()), (502, "connect_failed"));
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    let with = Weir::single_on(
        path,
        &url,
        &format!(
            "{tls}client_cert = {:?}\nclient_key = {:?}\n",
            cc.display().to_string(),
            ck.display().to_string()
        ),
    )
    .await;
    assert_eq!(through(&with).await, (200, String::new(), "secure".into()));
    assert_eq!(up.hits.load(Ordering::SeqCst), 1);
}
