//! Who asked (docs/reference/idempotency.md#idempotency-keys, "Keys are per
//! principal"): an idempotency key names a write *of one caller*, so a
//! record is kept under the client's key qualified by the request's
//! principal — by default its `Authorization`, `Proxy-Authorization`,
//! `Cookie`, `X-Api-Key`, `Api-Key` and `X-Auth-Token` fields and the host
//! it named: the fields that carry a credential by convention — and the
//! same key sent by another principal is a new request, never a replay of
//! someone else's response (nor a 422 for its real owner: a key another
//! principal sent first is another record). The principal is hashed (SHA-256,
//! the first 16 bytes as hex): neither the memory store nor Redis holds a
//! credential in clear.

use super::PolicyError;
use sha2::{Digest, Sha256};

/// One part of `[….idempotency] scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePart {
    /// The `Authorization` field, byte for byte.
    Authorization,
    /// The `Cookie` field: its fields joined with `; `, as RFC 9113 §8.2.3
    /// joins HTTP/2's split crumbs, so one session is one principal over
    /// either protocol.
    Cookie,
    /// The host the client named: the absolute-form target's authority,
    /// HTTP/2's `:authority`, or else `Host`; compared without case.
    Host,
    /// A named field (`header:x-tenant-id`), byte for byte; the name is
    /// kept in lower case.
    Header(String),
}

/// The default scope ([`DEFAULT_SCOPE`]): the fields that carry a
/// credential by convention — `Authorization`, `Proxy-Authorization`,
/// `Cookie` and the common API-key fields `X-Api-Key`, `Api-Key` and
/// `X-Auth-Token` — and the host the client named. An application that
/// authenticates by a field of its own lists these and adds it as
/// `header:NAME`.
pub fn default_scope() -> Vec<ScopePart> {
    let header = |n: &str| ScopePart::Header(n.to_string());
    vec![
        ScopePart::Authorization,
        header("proxy-authorization"),
        ScopePart::Cookie,
        header("x-api-key"),
        header("api-key"),
        header("x-auth-token"),
        ScopePart::Host,
    ]
}

/// The default scope as written in a config (`scope`'s default).
pub const DEFAULT_SCOPE: [&str; 7] = [
    "authorization",
    "header:proxy-authorization",
    "cookie",
    "header:x-api-key",
    "header:api-key",
    "header:x-auth-token",
    "host",
];

impl ScopePart {
    /// Whether this part names who is calling (a credential), rather than
    /// only where: `host` alone lets any caller of a host replay another's
    /// write.
    pub fn is_credential(&self) -> bool {
        !matches!(self, ScopePart::Host)
    }
}

/// Parses `scope`: `"none"` alone (keys shared by every caller, as before
/// scoping), or any of `"authorization"`, `"cookie"`, `"host"`,
/// `"header:NAME"`, each once.
pub fn parse_scope(items: &[String]) -> Result<Vec<ScopePart>, PolicyError> {
    let err = |m: String| PolicyError::new("scope", m);
    if items.iter().any(|i| i == "none") {
        return match items.len() {
            1 => Ok(Vec::new()),
            _ => Err(err("\"none\" stands alone".into())),
        };
    }
    if items.is_empty() {
        return Err(err(
            "list what qualifies a key (\"authorization\", \"cookie\", \"host\", \"header:NAME\"), or [\"none\"] to share keys between callers".into(),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let part = match item.as_str() {
            "authorization" => ScopePart::Authorization,
            "cookie" => ScopePart::Cookie,
            "host" => ScopePart::Host,
            other => match other.strip_prefix("header:") {
                Some(name) if valid_name(name) => ScopePart::Header(name.to_ascii_lowercase()),
                Some(name) => {
                    return Err(err(format!("{name:?} is not a header field name")));
                }
                None => {
                    return Err(err(format!(
                        "unknown part {other:?}: expected \"authorization\", \"cookie\", \"host\", \"header:NAME\" or \"none\""
                    )))
                }
            },
        };
        if out.contains(&part) {
            return Err(err(format!("{item:?} is listed twice")));
        }
        out.push(part);
    }
    Ok(out)
}

/// An RFC 9110 token.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The key a record is kept under: `key` unchanged with no scope, else
/// `key` and [`principal`]'s suffix.
pub fn scoped_key<'a>(
    key: &str,
    scope: &[ScopePart],
    values: impl Fn(&ScopePart) -> Vec<&'a [u8]>,
) -> String {
    match principal(scope, values) {
        None => key.to_string(),
        Some(suffix) => [key, &suffix].concat(),
    }
}

/// The suffix a request's principal adds to its key: `~` and 32 hex
/// digits (`None` with no scope). Its length is fixed, so two different
/// (key, principal) pairs never meet. `values` gives each part's values on
/// this request, every occurrence in order (none: absent, which is a
/// principal of its own, distinct from an empty value).
pub fn principal<'a>(
    scope: &[ScopePart],
    values: impl Fn(&ScopePart) -> Vec<&'a [u8]>,
) -> Option<String> {
    if scope.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    for part in scope {
        let vs = values(part);
        if *part == ScopePart::Cookie && vs.len() > 1 {
            // One `Cookie` however it was split (RFC 9113 §8.2.3).
            let joined = vs.join(&b"; "[..]);
            h.update(1u64.to_be_bytes());
            h.update((joined.len() as u64).to_be_bytes());
            h.update(&joined);
            continue;
        }
        h.update((vs.len() as u64).to_be_bytes());
        for v in vs {
            h.update((v.len() as u64).to_be_bytes());
            match part {
                ScopePart::Host => h.update(v.to_ascii_lowercase()),
                _ => h.update(v),
            }
        }
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(33);
    out.push('~');
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_parts_and_refuses_what_is_not_one() {
        assert_eq!(
            parse_scope(&s(&[
                "authorization",
                "cookie",
                "host",
                "header:X-Tenant-Id"
            ]))
            .unwrap(),
            vec![
                ScopePart::Authorization,
                ScopePart::Cookie,
                ScopePart::Host,
                ScopePart::Header("x-tenant-id".into())
            ]
        );
        assert_eq!(parse_scope(&s(&["none"])).unwrap(), vec![]);
        for bad in [
            &["none", "host"][..],
            &[],
            &["autorization"],
            &["header:"],
            &["header:a b"],
            &["host", "host"],
        ] {
            let e = parse_scope(&s(bad)).unwrap_err();
            assert_eq!(e.field, "scope", "{bad:?}");
        }
    }

    #[test]
    fn principals_are_kept_apart_and_never_in_clear() {
        let scope = default_scope();
        let key = |auth: Option<&'static str>, host: Option<&'static str>| {
            scoped_key("k-1", &scope, |p| match p {
                ScopePart::Authorization => auth.map(str::as_bytes).into_iter().collect(),
                ScopePart::Host => host.map(str::as_bytes).into_iter().collect(),
                ScopePart::Cookie | ScopePart::Header(_) => vec![],
            })
        };
        let alice = key(Some("Bearer ALICE"), Some("pay"));
        assert!(
            alice.starts_with("k-1~") && alice.len() == 4 + 32,
            "{alice}"
        );
        assert!(!alice.contains("ALICE"));
        assert_eq!(
            alice,
            key(Some("Bearer ALICE"), Some("PAY")),
            "host without case"
        );
        assert_ne!(alice, key(Some("Bearer BOB"), Some("pay")));
        assert_ne!(alice, key(Some("Bearer ALICE"), Some("tenant-b")));
        assert_ne!(key(None, Some("pay")), key(Some(""), Some("pay")));
        // Parts do not run into each other.
        assert_ne!(key(Some("ab"), Some("c")), key(Some("a"), Some("bc")));
        assert_eq!(scoped_key("k-1", &[], |_| vec![]), "k-1");
        // Every occurrence counts: a second Authorization is another caller.
        let two = scoped_key("k-1", &scope, |p| match p {
            ScopePart::Authorization => vec![&b"Bearer ALICE"[..], b"Bearer BOB"],
            _ => vec![&b"pay"[..]],
        });
        assert_ne!(alice, two);
    }

    #[test]
    fn a_cookie_is_one_principal_however_it_was_split() {
        assert_eq!(parse_scope(&s(&DEFAULT_SCOPE)).unwrap(), default_scope());
        let key = |cookies: Vec<&'static [u8]>| {
            scoped_key("k-1", &default_scope(), |p| match p {
                ScopePart::Cookie => cookies.clone(),
                _ => vec![&b"pay"[..]],
            })
        };
        let alice = key(vec![b"session=alice; theme=dark"]);
        assert_eq!(alice, key(vec![b"session=alice", b"theme=dark"]));
        assert_ne!(alice, key(vec![b"session=bob; theme=dark"]));
        assert_ne!(key(vec![]), key(vec![b""]));
        assert!(!alice.contains("alice"));
        assert!(!ScopePart::Host.is_credential());
        assert!(ScopePart::Cookie.is_credential());
        assert!(ScopePart::Header("x-api-key".into()).is_credential());
    }
}
