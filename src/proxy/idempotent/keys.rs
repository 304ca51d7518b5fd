//! A keyed request's key (docs/behaviour.md#idempotency-keys): the one
//! key field, 1–255 bytes of text, and the principal it is scoped to.

use super::super::error::ProxyError;
use crate::config::UpstreamConfig;
use crate::policy::idempotency::{parse_key, ScopePart, MAX_KEY_BYTES};

/// The key of a request the upstream's store applies to; `Ok(None)` when it
/// applies to none (no store, another method, no key); an empty or
/// over-long key is a 400.
pub(crate) fn key_of<'v>(
    cfg: &UpstreamConfig,
    method: &str,
    value: Option<&'v [u8]>,
) -> Result<Option<&'v str>, ProxyError> {
    match key_bytes_of(cfg, method, value)? {
        Some(v) => key_text(cfg, v).map(Some),
        None => Ok(None),
    }
}

/// [`key_of`] but for the text check, which the fast path makes once, when
/// it reads the key back from its buffer ([`key_text`]).
pub(crate) fn key_bytes_of<'v>(
    cfg: &UpstreamConfig,
    method: &str,
    value: Option<&'v [u8]>,
) -> Result<Option<&'v [u8]>, ProxyError> {
    let (Some(params), Some(v)) = (&cfg.idempotency, value) else {
        return Ok(None);
    };
    if !params.applies_to(method) {
        return Ok(None);
    }
    match v.len() {
        1..=MAX_KEY_BYTES => Ok(Some(v)),
        _ => Err(bad_key(cfg)),
    }
}

/// A key [`key_bytes_of`] let through, as text; not text: a 400.
pub(crate) fn key_text<'v>(cfg: &UpstreamConfig, key: &'v [u8]) -> Result<&'v str, ProxyError> {
    parse_key(key).ok_or_else(|| bad_key(cfg))
}

/// The general path's key: the request's one key field (two are a 400:
/// which one did the client mean?), as [`key_of`] takes it.
pub(crate) fn key_in<'v>(
    cfg: &UpstreamConfig,
    method: &str,
    headers: &'v http::HeaderMap,
) -> Result<Option<&'v str>, ProxyError> {
    let mut values = headers.get_all(&cfg.idempotency_header).iter();
    let first = values.next();
    let key = key_of(cfg, method, first.map(|v| v.as_bytes()))?;
    if key.is_some() && values.next().is_some() {
        return Err(ProxyError::BadRequest(format!(
            "more than one {} header",
            cfg.idempotency_header
        )));
    }
    Ok(key)
}

/// The key the store keeps a general-path request's record under: the
/// client's key qualified by who asked (`[….idempotency] scope`;
/// docs/behaviour.md#idempotency-keys). The fast path reads the same parts
/// from its own fields (`fast::head`).
pub(crate) fn scoped(
    cfg: &UpstreamConfig,
    key: &str,
    uri: &http::Uri,
    h: &http::HeaderMap,
) -> String {
    let Some(params) = &cfg.idempotency else {
        return key.to_string();
    };
    let all = |name: &str| -> Vec<&[u8]> { h.get_all(name).iter().map(|v| v.as_bytes()).collect() };
    crate::policy::idempotency::scoped_key(key, &params.scope, |part| match part {
        ScopePart::Authorization => all("authorization"),
        ScopePart::Host => match uri.authority() {
            Some(a) => vec![a.as_str().as_bytes()],
            None => all("host"),
        },
        ScopePart::Header(name) => all(name),
    })
}

fn bad_key(cfg: &UpstreamConfig) -> ProxyError {
    ProxyError::BadRequest(format!(
        "the {} header must be 1 to 255 bytes of text",
        cfg.idempotency_header
    ))
}
