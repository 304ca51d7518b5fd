//! Connection upgrades (WebSocket and friends) pass through, without retries:
//! the upgrade request goes to the upstream as one attempt with `Upgrade` and
//! `Connection: upgrade` kept; when the upstream answers 101, the client's and
//! the upstream's connections are joined byte for byte until either closes.

use http::header::{self, HeaderMap, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// The `Upgrade` value of a request asking for one (`Connection: upgrade`).
pub(crate) fn requested(h: &HeaderMap) -> Option<HeaderValue> {
    let asks = h
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| crate::h1::has_token(v.as_bytes(), b"upgrade"));
    if asks {
        h.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

/// Puts the upgrade headers back after hop-by-hop stripping.
pub(crate) fn restore(h: &mut HeaderMap, upgrade: HeaderValue) {
    h.insert(header::UPGRADE, upgrade);
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// Joins the two upgraded connections in the background.
pub(crate) fn tunnel(client: OnUpgrade, upstream: OnUpgrade, name: String) {
    tokio::spawn(async move {
        let (c, u) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(upstream = %name, error = %e, "upgrade did not complete");
                return;
            }
        };
        let mut c = TokioIo::new(c);
        let mut u = TokioIo::new(u);
        match tokio::io::copy_bidirectional(&mut c, &mut u).await {
            Ok((up, down)) => {
                tracing::debug!(upstream = %name, bytes_up = up, bytes_down = down, "upgraded connection closed")
            }
            Err(e) => tracing::debug!(upstream = %name, error = %e, "upgraded connection ended"),
        }
    });
}
