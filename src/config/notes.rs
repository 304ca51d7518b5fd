//! What `weir check` says about a valid config besides printing it: a
//! setting that works but probably does not do what its operator means,
//! such as a field it set whose neighbour's default changed. A default that
//! changed under a config that set nothing is said in CHANGELOG.md, not on
//! every check. Notes are advice: they never make a config invalid.

use super::Config;

impl Config {
    /// One line per note, each starting `warning:` or `note:`.
    pub fn notes(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .field_notes
            .iter()
            .map(|n| format!("note: {n}"))
            .collect();
        for u in &self.upstreams {
            // What `weir schedule` warns about, said by `weir check` too.
            let report = crate::policy::schedule_report_with(
                &u.name,
                &u.retry,
                u.timeout,
                u.per_try_timeout,
            );
            for w in report
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("warning: "))
            {
                out.push(format!(
                    "warning: upstream `{}`: {w} (`weir schedule` shows every retry's delay; docs/reference/retries.md#backoff)",
                    u.name
                ));
            }
        }
        // Settings an operator set whose meaning changed (CHANGELOG.md,
        // 2026-12-07): said where they are set, not on every config.
        for u in &self.upstreams {
            if u.throttle.is_some() {
                out.push(format!(
                    "note: upstream `{}`: client-side throttling counts a 429 or gRPC RESOURCE_EXHAUSTED against the caller it names (refused 429 `rate_limited` on its own account), no longer against the upstream; 503 and UNAVAILABLE still raise the shared probability (changed 2026-12-07; docs/reference/admission.md#client-side-throttling)",
                    u.name
                ));
            }
            if u.protocol == super::Protocol::Grpc
                && u.breaker.enabled
                && u.breaker.failure_grpc.is_empty()
            {
                out.push(format!(
                    "note: upstream `{}`: its `breaker.failure_statuses` names no gRPC code, so a call that ends UNAVAILABLE (HTTP 200, grpc-status 14) counts as a success; the default now adds \"unavailable\", \"internal\" and \"deadline-exceeded\" (changed 2026-12-07; docs/reference/breaker.md#what-counts-as-a-failure)",
                    u.name
                ));
            }
            if u.protocol == super::Protocol::Grpc && u.idempotency.is_some() {
                out.push(format!(
                    "note: upstream `{}`: a keyed gRPC call is recorded by its grpc-status: UNAVAILABLE and RESOURCE_EXHAUSTED are no longer kept (a repeat is forwarded), and a completed call is kept with its trailers and replayed whole (changed 2026-12-07; docs/reference/idempotency.md#grpc)",
                    u.name
                ));
            }
            if u.concurrency.adaptive.is_some() {
                out.push(format!(
                    "note: upstream `{}`: the adaptive limit now counts only requests waiting for the upstream's answer (not a slow client's upload or download), and its slow start doubles a window from `initial_limit` (default 4, was 12) (changed 2026-12-07; docs/reference/admission.md#adaptive-limit)",
                    u.name
                ));
            }
        }
        for u in &self.upstreams {
            let Some(store) = &u.idempotency else {
                continue;
            };
            if !store.scope.iter().any(|p| p.is_credential()) {
                out.push(format!(
                    "warning: upstream `{}`: its idempotency `scope` names no credential, so a caller that sends another caller's {} gets that caller's recorded response, and can make the real owner's write fail with 422: add the field your application authenticates with (\"authorization\", \"cookie\" or \"header:NAME\") (docs/reference/idempotency.md)",
                    u.name, u.idempotency_header
                ));
            }
        }
        out
    }
}
