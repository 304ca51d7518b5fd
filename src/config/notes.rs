//! What `weir check` says about a config besides its errors
//! (docs/reference/cli.md#command-line): a `warning:` for a setting that
//! does not do what it says (`weir check --strict` fails on one), a `note:`
//! for one that works but probably not as its operator means, such as a
//! field it set whose neighbour's default changed. A default that changed
//! under a config that set nothing is said in CHANGELOG.md, not on every
//! check. Advice never makes a config invalid, and it is found for every
//! upstream that validated, so a file with errors gets its warnings in the
//! same pass.

use super::{ConfigError, UpstreamConfig};
use std::fmt;

/// How much a piece of [`Advice`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// A setting that does not do what it says: logged as a warning at
    /// start and on every reload; `weir check --strict` exits 1.
    Warning,
    /// A setting that works, said for its author's sake.
    Note,
}

/// One warning or note, as `weir check` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub severity: Severity,
    /// Where and what (a located field's `file:line:col: \`field\`: …`, or
    /// `upstream \`NAME\`: …`), without the severity.
    pub text: String,
}

impl Advice {
    pub fn warning(text: impl Into<String>) -> Self {
        Advice {
            severity: Severity::Warning,
            text: text.into(),
        }
    }

    pub fn note(text: impl Into<String>) -> Self {
        Advice {
            severity: Severity::Note,
            text: text.into(),
        }
    }

    /// A located field's advice.
    pub fn at(severity: Severity, e: &ConfigError) -> Self {
        Advice {
            severity,
            text: e.to_string(),
        }
    }

    pub fn is_warning(&self) -> bool {
        self.severity == Severity::Warning
    }
}

impl fmt::Display for Advice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.severity {
            Severity::Warning => write!(f, "warning: {}", self.text),
            Severity::Note => write!(f, "note: {}", self.text),
        }
    }
}

/// The advice about one validated upstream that no single field carries.
pub(super) fn upstream_advice(u: &UpstreamConfig) -> Vec<Advice> {
    let mut out = Vec::new();
    // What `weir schedule` warns about, said by `weir check` too; a
    // `per_try_timeout` past `timeout` never applies (its own warning).
    let per_try = u.per_try_timeout.filter(|t| *t <= u.timeout);
    let report = crate::policy::schedule_report_with(&u.name, &u.retry, u.timeout, per_try);
    for w in report
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("warning: "))
    {
        out.push(Advice::warning(format!(
            "upstream `{}`: {w} (`weir schedule` shows every retry's delay; docs/reference/retries.md#backoff)",
            u.name
        )));
    }
    // Settings an operator set whose meaning changed (CHANGELOG.md,
    // 2026-12-07): said where they are set, not on every config.
    if u.throttle.is_some() {
        out.push(Advice::note(format!(
            "upstream `{}`: client-side throttling counts a 429 or gRPC RESOURCE_EXHAUSTED against the caller it names (refused 429 `rate_limited` on its own account), no longer against the upstream; 503 and UNAVAILABLE still raise the shared probability (changed 2026-12-07; docs/reference/admission.md#client-side-throttling)",
            u.name
        )));
    }
    if u.protocol == super::Protocol::Grpc && u.breaker.enabled && u.breaker.failure_grpc.is_empty()
    {
        out.push(Advice::note(format!(
            "upstream `{}`: its `breaker.failure_statuses` names no gRPC code, so a call that ends UNAVAILABLE (HTTP 200, grpc-status 14) counts as a success; the default now adds \"unavailable\", \"internal\" and \"deadline-exceeded\" (changed 2026-12-07; docs/reference/breaker.md#what-counts-as-a-failure)",
            u.name
        )));
    }
    if u.protocol == super::Protocol::Grpc && u.idempotency.is_some() {
        out.push(Advice::note(format!(
            "upstream `{}`: a keyed gRPC call is recorded by its grpc-status: UNAVAILABLE and RESOURCE_EXHAUSTED are no longer kept (a repeat is forwarded), and a completed call is kept with its trailers and replayed whole (changed 2026-12-07; docs/reference/idempotency.md#grpc)",
            u.name
        )));
    }
    if u.concurrency.adaptive.is_some() {
        out.push(Advice::note(format!(
            "upstream `{}`: the adaptive limit now counts only requests waiting for the upstream's answer (not a slow client's upload or download), and its slow start doubles a window from `initial_limit` (default 4, was 12) (changed 2026-12-07; docs/reference/admission.md#adaptive-limit)",
            u.name
        )));
    }
    if let Some(store) = &u.idempotency {
        if !store.scope.iter().any(|p| p.is_credential()) {
            out.push(Advice::warning(format!(
                "upstream `{}`: its idempotency `scope` names no credential, so a caller that sends another caller's {} gets that caller's recorded response, and can make the real owner's write fail with 422: add the field your application authenticates with (\"authorization\", \"cookie\" or \"header:NAME\") (docs/reference/idempotency.md)",
                u.name, u.idempotency_header
            )));
        }
    }
    out
}
