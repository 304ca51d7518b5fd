//! gRPC's part of the policy (docs/guide/tls-and-grpc.md#grpc-policies): the
//! status codes by name, the methods an upstream declares safe to retry
//! (`[upstreams.NAME.grpc] idempotent_methods`), and which outcomes say a
//! call was not processed (so that no idempotency record keeps them).

/// Every gRPC status code: its number, the name `retry_on` and
/// `failure_statuses` take (lower case, `-` between words), and the name
/// metrics carry in `grpc_code` (as gRPC's libraries print a code, the
/// convention of go-grpc-prometheus).
pub const CODES: [(u8, &str, &str); 17] = [
    (0, "ok", "OK"),
    (1, "cancelled", "Canceled"),
    (2, "unknown", "Unknown"),
    (3, "invalid-argument", "InvalidArgument"),
    (4, "deadline-exceeded", "DeadlineExceeded"),
    (5, "not-found", "NotFound"),
    (6, "already-exists", "AlreadyExists"),
    (7, "permission-denied", "PermissionDenied"),
    (8, "resource-exhausted", "ResourceExhausted"),
    (9, "failed-precondition", "FailedPrecondition"),
    (10, "aborted", "Aborted"),
    (11, "out-of-range", "OutOfRange"),
    (12, "unimplemented", "Unimplemented"),
    (13, "internal", "Internal"),
    (14, "unavailable", "Unavailable"),
    (15, "data-loss", "DataLoss"),
    (16, "unauthenticated", "Unauthenticated"),
];

/// The codes `retry_on` may list: those a retry can change.
pub const RETRYABLE: [u8; 7] = [1, 2, 4, 8, 10, 13, 14];

/// `UNAVAILABLE`.
pub const UNAVAILABLE: u8 = 14;
/// `RESOURCE_EXHAUSTED`.
pub const RESOURCE_EXHAUSTED: u8 = 8;

/// The code a config names: `unavailable`, `UNAVAILABLE`,
/// `deadline_exceeded`, `Deadline-Exceeded` all name the same one.
pub fn code_named(name: &str) -> Option<u8> {
    let wanted = name.replace('_', "-");
    CODES
        .iter()
        .find(|(_, n, _)| n.eq_ignore_ascii_case(&wanted))
        .map(|(c, _, _)| *c)
}

/// The config's name of a code (`unavailable`), or its number.
pub fn config_name(code: u8) -> std::borrow::Cow<'static, str> {
    match CODES.get(usize::from(code)) {
        Some((_, n, _)) => std::borrow::Cow::Borrowed(n),
        None => std::borrow::Cow::Owned(code.to_string()),
    }
}

/// The `grpc_code` label of a code: gRPC's name (`Unavailable`); a code
/// outside gRPC's seventeen is `Unknown`, as gRPC's clients take it.
pub fn label(code: u8) -> &'static str {
    CODES
        .get(usize::from(code))
        .map_or("Unknown", |(_, _, l)| l)
}

/// Whether an answer with this code says the server did not process the
/// call, so that a record of it would only repeat a refusal: `UNAVAILABLE`
/// (the server, or a proxy before it, could not take the call) and
/// `RESOURCE_EXHAUSTED` (a quota or a load shed refused it).
pub fn not_processed(code: u8) -> bool {
    matches!(code, UNAVAILABLE | RESOURCE_EXHAUSTED)
}

/// The HTTP status a gRPC code stands for (as gRPC's HTTP mapping and
/// `google.rpc.Code` give it): what the idempotency record judges a gRPC
/// answer by, as it judges an HTTP one.
pub fn http_equivalent(code: u8) -> u16 {
    match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    }
}

/// The code a gRPC client takes an HTTP answer without a `grpc-status`
/// for (gRPC's HTTP-to-gRPC status mapping).
pub fn from_http(status: u16) -> u8 {
    match status {
        200 => 2,
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => 2,
    }
}

/// The methods an upstream declares safe to retry: exact paths
/// (`/pkg.Svc/Get`) and whole services (`/pkg.Svc/*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdempotentMethods {
    exact: Vec<String>,
    /// Services, each with its slashes (`/pkg.Svc/`).
    services: Vec<String>,
}

impl IdempotentMethods {
    /// Compiles the patterns, or says what is wrong with the first bad one.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, String> {
        let mut m = IdempotentMethods::default();
        for p in patterns {
            let p = p.as_ref();
            let bad = |why: &str| {
                Err(format!(
                    "{p:?} is not a gRPC method: {why} (expected \"/package.Service/Method\" or \"/package.Service/*\")"
                ))
            };
            let Some(rest) = p.strip_prefix('/') else {
                return bad("it must start with `/`");
            };
            let Some((service, method)) = rest.split_once('/') else {
                return bad("it names no method");
            };
            if service.is_empty() || method.is_empty() {
                return bad("the service and the method must not be empty");
            }
            let odd = |s: &str| {
                s.chars()
                    .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            };
            if odd(service) {
                return bad("a service name has letters, digits, `.`, `_` and `-` only");
            }
            if method == "*" {
                m.services.push(format!("/{service}/"));
            } else if method.contains('*') {
                return bad("`*` stands only for every method of a service");
            } else if odd(method) {
                return bad("a method name has letters, digits, `.`, `_` and `-` only");
            } else {
                m.exact.push(p.to_string());
            }
        }
        Ok(m)
    }

    /// Whether none is declared.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.services.is_empty()
    }

    /// Whether a call to `path` (the request's path, no query) is declared
    /// safe to retry.
    pub fn contains(&self, path: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        self.exact.iter().any(|e| e == path)
            || self.services.iter().any(|s| {
                path.strip_prefix(s.as_str())
                    .is_some_and(|m| !m.is_empty() && !m.contains('/'))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert_eq!(code_named("unavailable"), Some(14));
        assert_eq!(code_named("UNAVAILABLE"), Some(14));
        assert_eq!(code_named("deadline_exceeded"), Some(4));
        assert_eq!(code_named("resource-exhausted"), Some(8));
        assert_eq!(code_named("nope"), None);
        assert_eq!(label(14), "Unavailable");
        assert_eq!(label(0), "OK");
        assert_eq!(label(99), "Unknown");
        for (i, (c, _, _)) in CODES.iter().enumerate() {
            assert_eq!(usize::from(*c), i);
        }
    }

    #[test]
    fn methods_match_exactly_or_by_service() {
        let m = IdempotentMethods::parse(&["/pkg.Svc/Get", "/other.Read/*"]).expect("valid");
        assert!(m.contains("/pkg.Svc/Get"));
        assert!(!m.contains("/pkg.Svc/Put"));
        assert!(!m.contains("/pkg.Svc/Get/x"));
        assert!(m.contains("/other.Read/Anything"));
        assert!(!m.contains("/other.Read/"));
        assert!(!m.contains("/other.Read/a/b"));
        assert!(!m.contains("/other.ReadMore/A"));
        assert!(!IdempotentMethods::default().contains("/pkg.Svc/Get"));
    }

    #[test]
    fn bad_patterns_are_named() {
        for bad in [
            "pkg.Svc/Get",
            "/pkg.Svc",
            "//Get",
            "/pkg.Svc/",
            "/pkg.Svc/G*",
            "/*/Get",
            "/p kg/Get",
        ] {
            let e = IdempotentMethods::parse(&[bad]).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }
}
