//! What `weir check` says about a valid config besides printing it: a
//! setting that works but probably does not do what its operator means, and
//! a default that changed under a config that did not set it. Notes are
//! advice: they never make a config invalid.

use super::Config;
use crate::policy::idempotency::{default_scope, DEFAULT_SCOPE};

impl Config {
    /// One line per note, each starting `warning:` or `note:`.
    pub fn notes(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .field_notes
            .iter()
            .map(|n| format!("note: {n}"))
            .collect();
        let mut on_default = Vec::new();
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
            if store.scope == default_scope() {
                on_default.push(format!("`{}`", u.name));
            }
        }
        if !on_default.is_empty() {
            out.push(format!(
                "note: idempotency `scope` defaults to {DEFAULT_SCOPE:?} (it was [\"authorization\", \"host\"]): on {}, the same key sent with another Cookie is now another caller's write, forwarded rather than answered from the record; set `scope` to choose (docs/reference/idempotency.md)",
                on_default.join(", ")
            ));
        }
        out
    }
}
