//! Where stage two's errors go: located in the file by field path, and
//! left out when they rest on a value stage one already rejected
//! (docs/reference/configuration.md#configuration-and-defaults).

use super::super::error::{ConfigError, SpanIndex};
use super::super::notes::Severity;
use crate::policy::{PolicyError, PolicyErrors};
use std::path::Path;

/// Stage two's errors, each located in the file as it is added.
pub(in crate::config) struct ErrorSink<'a> {
    file: &'a Path,
    idx: &'a SpanIndex,
    /// What stage one rejected or took an unknown field to mean
    /// (`schema::Read::removed`): stage two saw a default in its place.
    removed: &'a [String],
    pub(super) errors: Vec<ConfigError>,
    /// What a config does that its author may not expect: `weir check`
    /// prints each as a `warning:` or `note:`, with the errors or without
    /// (docs/reference/cli.md#command-line).
    pub(super) notes: Vec<(Severity, ConfigError)>,
}

/// `path` is `table` or a field under it (`a.b`, `a.b.c`, `a.b[0]`).
fn within(path: &str, table: &str) -> bool {
    path.strip_prefix(table)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// A policy error judged with other fields than its own: the field (relative
/// to the policy) and those it was compared with. When one of those was
/// rejected by stage one, the comparison was with a default, not with what
/// the user wrote, and the error is left out.
const JUDGED_WITH: &[(&str, &[&str])] = &[
    ("retry.backoff.max", &["retry.backoff.base"]),
    ("breaker.min_samples", &["breaker.window"]),
    ("breaker.max_open", &["breaker.open"]),
    ("idempotency.max_response_bytes", &["idempotency.max_bytes"]),
    ("cache.max_object_bytes", &["cache.max_bytes"]),
    ("rate_limit.rps", &["rate_limit.window", "rate_limit.burst"]),
    ("rate_limit.burst", &["rate_limit.rps"]),
    (
        "rate_limit.scope",
        &["rate_limit.rps", "rate_limit.window", "rate_limit.key"],
    ),
];

impl<'a> ErrorSink<'a> {
    pub(super) fn new(file: &'a Path, idx: &'a SpanIndex, removed: &'a [String]) -> Self {
        ErrorSink {
            file,
            idx,
            removed,
            errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Whether stage one rejected this field, or a table it is in.
    fn is_removed(&self, field: &str) -> bool {
        self.removed.iter().any(|r| within(field, r))
    }

    /// Whether the document sets this field and stage one kept it.
    pub(super) fn has(&self, field: &str) -> bool {
        self.idx.has(field) && !self.is_removed(field)
    }

    /// An error at `field`; none when stage one rejected the field (it
    /// already has its error).
    pub(super) fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.err_given(field, &[], message);
    }

    /// An error at `field` found by looking at `given` too (a rule across
    /// fields); none when stage one rejected any of them, or any field in
    /// them: the rule then saw a default in its place.
    pub(super) fn err_given(
        &mut self,
        field: impl Into<String>,
        given: &[String],
        message: impl Into<String>,
    ) {
        let field = field.into();
        let rests_on_removed = given
            .iter()
            .any(|g| self.is_removed(g) || self.removed.iter().any(|r| within(r, g)));
        if self.is_removed(&field) || rests_on_removed {
            return;
        }
        self.errors
            .push(self.idx.error_at_path(self.file, &field, message.into()));
    }

    /// A note at `field`, located like an error.
    pub(super) fn note(&mut self, field: &str, message: impl Into<String>) {
        let at = self.idx.error_at_path(self.file, field, message.into());
        self.notes.push((Severity::Note, at));
    }

    /// A warning at `field`: a setting that does not do what it says.
    pub(super) fn warn(&mut self, field: &str, message: impl Into<String>) {
        let at = self.idx.error_at_path(self.file, field, message.into());
        self.notes.push((Severity::Warning, at));
    }

    /// Whether the user wrote an upstream's policy field, in its table or
    /// in `[defaults]`.
    pub(super) fn policy_set(&self, upstream: &str, rel: &str) -> bool {
        self.has(&format!("upstreams.{}.{rel}", quote(upstream)))
            || self.has(&format!("defaults.{rel}"))
    }

    /// The path of an upstream's policy field as the user wrote it: in the
    /// upstream's table when set there, else in `[defaults]`.
    pub(super) fn policy_path(&self, upstream: &str, rel: &str) -> String {
        let own = format!("upstreams.{}.{rel}", quote(upstream));
        if self.has(&own) {
            return own;
        }
        // Walk up: a table set in the upstream owns its fields' errors.
        let mut p = rel;
        while let Some(i) = p.rfind('.') {
            p = &p[..i];
            if self.has(&format!("upstreams.{}.{p}", quote(upstream))) {
                return own;
            }
        }
        let def = format!("defaults.{rel}");
        if self.has(&def) {
            def
        } else {
            own
        }
    }

    /// A policy field's error (`field` relative to the policy, e.g.
    /// `rate_limit.burst`), in the upstream's table or `[defaults]`, where
    /// the value came from; `others` are the fields it was judged with.
    pub(super) fn policy_err_given(
        &mut self,
        upstream: &str,
        field: &str,
        others: &[&str],
        message: impl Into<String>,
    ) {
        let path = self.policy_path(upstream, field);
        let mut given = Vec::new();
        for rel in others {
            given.push(format!("upstreams.{}.{rel}", quote(upstream)));
            given.push(format!("defaults.{rel}"));
        }
        self.err_given(path, &given, message);
    }

    /// Each of a table's errors, as [`ErrorSink::policy_err`] does one.
    pub(super) fn policy_errs(&mut self, upstream: &str, table: &str, e: PolicyErrors) {
        for one in e.0 {
            self.policy_err(upstream, table, one);
        }
    }

    pub(super) fn policy_err(&mut self, upstream: &str, table: &str, e: PolicyError) {
        let rel = if table.is_empty() {
            e.field.to_string()
        } else {
            format!("{table}.{}", e.field)
        };
        let others = JUDGED_WITH
            .iter()
            .find(|(f, _)| *f == rel)
            .map_or(&[][..], |(_, o)| o);
        self.policy_err_given(upstream, &rel, others, e.message);
    }
}

pub(in crate::config) fn quote(name: &str) -> String {
    if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn within_a_table_is_by_whole_names() {
        assert!(within("upstreams.api.url", "upstreams.api.url"));
        assert!(within("upstreams.api.url", "upstreams.api"));
        assert!(within("upstreams.api.hosts[1]", "upstreams.api.hosts"));
        assert!(!within("upstreams.api2.url", "upstreams.api"));
        assert!(!within("upstreams.api", "upstreams.api.url"));
    }
}
