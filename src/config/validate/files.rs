//! The files a config's TLS tables name, loaded with the config
//! (docs/reference/configuration.md#configuration-and-defaults): every one that cannot be
//! read, or is not what its field says (a PEM certificate, CA bundle or
//! private key; a key that goes with its certificate), is an error at the
//! field that names it.

use super::super::files::{self, FileErrors};
use super::ErrorSink;
use crate::config::{ListenerTls, UpstreamTls};

fn report(cx: &mut ErrorSink, table: &str, errors: FileErrors) {
    for e in errors.0 {
        cx.err(format!("{table}.{}", e.field), e.message);
    }
}

/// `[server] tls` or an upstream's `listen_tls`, at `table`.
pub(super) fn listener(cx: &mut ErrorSink, table: &str, t: &ListenerTls) {
    if let Err(e) = files::server_config(t) {
        report(cx, table, e);
    }
}

/// An upstream's `tls` table, at `table`.
pub(super) fn upstream(cx: &mut ErrorSink, table: &str, t: &UpstreamTls) {
    if let Some(n) = &t.server_name {
        if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
            cx.err(
                format!("{table}.server_name"),
                format!("{n:?} is not a DNS name or an IP address"),
            );
        }
    }
    if let Err(e) = files::client_config(Some(t)) {
        report(cx, table, e);
    }
}
