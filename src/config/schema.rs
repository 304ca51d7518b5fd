//! Stage one's check (docs/reference/configuration.md#configuration-and-defaults): the
//! parsed document is walked against the raw model table by table, so that
//! **every** unknown field and every value of the wrong type is reported in
//! one pass — serde, given the whole file, stops at the first.
//!
//! The raw structs stay the one schema: each field is checked by serde
//! deserializing its table's struct from that field alone (all but a few
//! fields are optional), with the spans toml keeps, so messages and
//! positions are serde's and toml's own. The field names valid at each place
//! come from the derive (`deny_unknown_fields` structs name them to serde),
//! and feed the "did you mean" hints ([`suggest`]). The only thing written
//! down here is which fields are tables of their own, walked in turn.
//!
//! The walk keeps the fields that pass, so that stage two validates them
//! even when others failed ([`Read`]); it also says which fields it left
//! out, so that stage two reports nothing that rests on them.

use super::error::{from_toml, join, with_suggestion, ConfigError, ConfigErrors, SpanIndex};
use super::raw::*;
use crate::policy::suggest::distance;
use serde::de::{self, DeserializeOwned, Visitor};
use std::ops::Range;
use std::path::Path;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

/// Deserializes a table's struct from (part of) the table.
type Check = fn(Spanned<DeValue<'_>>) -> Result<(), toml::de::Error>;

/// One table of the raw model.
struct Schema {
    check: Check,
    /// The field names serde accepts here.
    fields: fn() -> &'static [&'static str],
    /// Fields that are tables of their own, walked field by field too.
    nested: &'static [(&'static str, Nested)],
}

enum Nested {
    /// A table of this schema (when the value is a table at all).
    Table(&'static Schema),
    /// A table of named tables of this schema (`[upstreams.NAME]`).
    MapOf(&'static Schema),
}

fn check<T: DeserializeOwned>(v: Spanned<DeValue<'_>>) -> Result<(), toml::de::Error> {
    T::deserialize(ValueDeserializer::from(v)).map(drop)
}

/// The field names a `deny_unknown_fields` struct gives serde.
fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// A deserializer that only records the field names of the struct asked for.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("field names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

macro_rules! schema {
    ($name:ident: $ty:ty { $($field:literal => $nested:expr),* $(,)? }) => {
        static $name: Schema = Schema {
            check: check::<$ty>,
            fields: fields::<$ty>,
            nested: &[$(($field, $nested)),*],
        };
    };
}

schema!(CONFIG: RawConfig {
    "server" => Nested::Table(&SERVER),
    "defaults" => Nested::Table(&POLICY),
    "upstreams" => Nested::MapOf(&UPSTREAM),
    "tracing" => Nested::Table(&TRACING),
    // Last: a policy field written at the top (`timeout`) is pointed to
    // `defaults`, not to `state`'s field of the same name.
    "state" => Nested::Table(&STATE),
});
schema!(SERVER: RawServer { "tls" => Nested::Table(&LISTENER_TLS) });
schema!(LISTENER_TLS: RawListenerTls {});
schema!(STATE: RawState {});
schema!(TRACING: RawTracing {});
schema!(POLICY: RawPolicy {
    "retry" => Nested::Table(&RETRY),
    "breaker" => Nested::Table(&BREAKER),
    "concurrency" => Nested::Table(&CONCURRENCY),
    "rate_limit" => Nested::Table(&RATE_LIMIT),
    "idempotency" => Nested::Table(&IDEMPOTENCY),
    "cache" => Nested::Table(&CACHE),
    "hedge" => Nested::Table(&HEDGE),
    "throttle" => Nested::Table(&THROTTLE),
});
schema!(RETRY: RawRetry {
    "backoff" => Nested::Table(&BACKOFF),
    "budget" => Nested::Table(&BUDGET),
});
schema!(BACKOFF: RawBackoff { "jitter" => Nested::Table(&PROPORTIONAL) });
schema!(PROPORTIONAL: RawProportional {});
schema!(BUDGET: RawBudget {});
schema!(BREAKER: RawBreaker {});
schema!(CONCURRENCY: RawConcurrency {});
schema!(RATE_LIMIT: RawRateLimit { "window" => Nested::Table(&WINDOW) });
schema!(WINDOW: RawWindow {});
schema!(IDEMPOTENCY: RawIdempotency {});
schema!(CACHE: RawCache {});
schema!(HEDGE: RawHedge {});
schema!(THROTTLE: RawThrottle {});
schema!(UPSTREAM_TLS: RawUpstreamTls {});
schema!(EJECTION: RawEjection {});
schema!(GRPC: RawGrpc {});
schema!(UPSTREAM: RawUpstream {
    "listen_tls" => Nested::Table(&LISTENER_TLS),
    "ejection" => Nested::Table(&EJECTION),
    "tls" => Nested::Table(&UPSTREAM_TLS),
    "retry" => Nested::Table(&RETRY),
    "breaker" => Nested::Table(&BREAKER),
    "concurrency" => Nested::Table(&CONCURRENCY),
    "rate_limit" => Nested::Table(&RATE_LIMIT),
    "idempotency" => Nested::Table(&IDEMPOTENCY),
    "cache" => Nested::Table(&CACHE),
    "hedge" => Nested::Table(&HEDGE),
    "throttle" => Nested::Table(&THROTTLE),
    "grpc" => Nested::Table(&GRPC),
});

/// Every field of the config file, table by table: for each table of the
/// raw model, the places it stands (`server.tls`, `upstreams.NAME.retry`,
/// `defaults.retry`, …) and the names of its fields that are not tables of
/// their own. The configuration reference is checked against it
/// (`tests/docs.rs`).
pub fn catalogue() -> Vec<(Vec<String>, Vec<&'static str>)> {
    fn walk(
        schema: &'static Schema,
        path: String,
        out: &mut Vec<(&'static Schema, Vec<String>, Vec<&'static str>)>,
    ) {
        let leaves: Vec<&'static str> = (schema.fields)()
            .iter()
            .copied()
            .filter(|f| !schema.nested.iter().any(|(n, _)| n == f))
            .collect();
        match out.iter_mut().find(|(s, _, _)| std::ptr::eq(*s, schema)) {
            Some((_, paths, _)) => paths.push(path.clone()),
            None => out.push((schema, vec![path.clone()], leaves)),
        }
        for (name, nested) in schema.nested {
            let at = |p: &str| {
                if path.is_empty() {
                    p.to_string()
                } else {
                    format!("{path}.{p}")
                }
            };
            match nested {
                Nested::Table(s) => walk(s, at(name), out),
                Nested::MapOf(s) => walk(s, at(&format!("{name}.NAME")), out),
            }
        }
    }
    let mut out = Vec::new();
    walk(&CONFIG, String::new(), &mut out);
    out.into_iter()
        .map(|(_, paths, fields)| (paths, fields))
        .collect()
}

/// What stage one makes of a document: every unknown field and every value
/// of the wrong type, in file order, and the raw model built from the rest.
pub(super) struct Read {
    /// The fields that passed (a table without a field it requires left out).
    pub raw: RawConfig,
    pub errors: Vec<ConfigError>,
    /// Where a value was left out of `raw` (wrong type, a table that cannot
    /// be built) or meant (an unknown field's "did you mean"): stage two
    /// reports nothing that rests on them, since these errors already
    /// stand for it.
    pub removed: Vec<String>,
}

/// Parses config text and walks it against the raw model. Only a syntax
/// error stops here; everything else is in the [`Read`].
pub(super) fn read(file: &Path, src: &str, idx: &SpanIndex) -> Result<Read, ConfigErrors> {
    let syntax = |e: toml::de::Error| ConfigErrors(vec![from_toml(file, src, idx, &e)]);
    let doc = DeTable::parse(src).map_err(syntax)?;
    let mut walk = Walk {
        file,
        idx,
        errors: Vec::new(),
        removed: Vec::new(),
    };
    let span = doc.span();
    let good = walk
        .table(&CONFIG, "", doc.get_ref(), span.clone())
        .unwrap_or_default();
    walk.errors.sort_by_key(|e| (e.line, e.column));
    // The one deserialization kept: of the fields that passed.
    let root = Spanned::new(span, DeValue::Table(good));
    let raw = match <RawConfig as serde::Deserialize>::deserialize(ValueDeserializer::from(root)) {
        Ok(raw) => raw,
        Err(e) if walk.errors.is_empty() => return Err(syntax(e)),
        Err(_) => return Err(ConfigErrors(walk.errors)),
    };
    Ok(Read {
        raw,
        errors: walk.errors,
        removed: walk.removed,
    })
}

struct Walk<'a> {
    file: &'a Path,
    idx: &'a SpanIndex,
    errors: Vec<ConfigError>,
    removed: Vec<String>,
}

/// `{ key = value }` alone, to check one field.
fn alone<'i>(
    key: &Spanned<toml::de::DeString<'i>>,
    value: &Spanned<DeValue<'i>>,
    span: Range<usize>,
) -> Spanned<DeValue<'i>> {
    let mut t = DeTable::new();
    t.insert(key.clone(), value.clone());
    Spanned::new(span, DeValue::Table(t))
}

/// The field serde found missing, from its message.
fn missing_field(e: &toml::de::Error) -> Option<&str> {
    e.message()
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
}

impl Walk<'_> {
    fn push(&mut self, offset: usize, field: String, message: String) {
        self.push_expecting(offset, field, message, Vec::new());
    }

    fn push_expecting(
        &mut self,
        offset: usize,
        field: String,
        message: String,
        expected: Vec<String>,
    ) {
        let (line, column) = self.idx.line_col(offset);
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line,
            column,
            field,
            message,
            expected,
        });
    }

    /// A serde error for the field at `path`: at the span toml gives, named
    /// by the innermost field there (an array element, an inline table's key).
    fn serde_error(&mut self, path: &str, fallback: usize, e: &toml::de::Error) {
        let offset = e.span().map_or(fallback, |s| s.start);
        let field = match self.idx.path_at(offset) {
            Some(p) if p.len() > path.len() && p.starts_with(path) => p.to_string(),
            _ => path.to_string(),
        };
        let (message, expected) = with_suggestion(e.message().trim());
        self.push_expecting(offset, field, message, expected);
    }

    /// Checks a table field by field; returns the fields that passed (the
    /// nested tables among them pruned likewise), or `None` when those lack
    /// a field the table requires.
    fn table<'i>(
        &mut self,
        schema: &Schema,
        path: &str,
        t: &DeTable<'i>,
        span: Range<usize>,
    ) -> Option<DeTable<'i>> {
        let known = (schema.fields)();
        let mut good = DeTable::new();
        // Hints given here: a required field one of them names is not
        // reported missing as well.
        let mut meant = Vec::new();
        for (k, v) in t.iter() {
            let name: &str = k.get_ref();
            let p = join(path, name);
            let nested = schema.nested.iter().find(|(n, _)| *n == name);
            match (nested.map(|(_, n)| n), v.get_ref()) {
                (Some(Nested::Table(s)), DeValue::Table(inner)) => {
                    match self.table(s, &p, inner, v.span()) {
                        Some(kept) => {
                            good.insert(k.clone(), Spanned::new(v.span(), DeValue::Table(kept)));
                        }
                        None => self.removed.push(p),
                    }
                    continue;
                }
                (Some(Nested::MapOf(s)), DeValue::Table(inner)) => {
                    let mut entries = DeTable::new();
                    for (n, entry) in inner.iter() {
                        let q = join(&p, n.get_ref());
                        let kept = match entry.get_ref() {
                            DeValue::Table(e) => self.table(s, &q, e, entry.span()),
                            _ => {
                                let one = alone(k, &alone(n, entry, v.span()), span.clone());
                                if let Err(e) = (schema.check)(one) {
                                    self.serde_error(&q, entry.span().start, &e);
                                }
                                None
                            }
                        };
                        match kept {
                            Some(kept) => {
                                let kept = Spanned::new(entry.span(), DeValue::Table(kept));
                                entries.insert(n.clone(), kept);
                            }
                            None => self.removed.push(q),
                        }
                    }
                    good.insert(k.clone(), Spanned::new(v.span(), DeValue::Table(entries)));
                    continue;
                }
                _ => {}
            }
            if !known.contains(&name) {
                let mut expected = Vec::new();
                let message = match suggest(schema, name) {
                    Some(s) => {
                        let m = format!("unknown field `{name}`: did you mean `{s}`?");
                        // Meant, unless written as well: then it stands alone.
                        let at = if path.is_empty() {
                            s.clone()
                        } else {
                            format!("{path}.{s}")
                        };
                        if !self.idx.has(&at) {
                            self.removed.push(at);
                        }
                        meant.push(s);
                        m
                    }
                    None => {
                        expected = known.iter().map(|f| f.to_string()).collect();
                        format!("unknown field `{name}`")
                    }
                };
                self.push_expecting(k.span().start, p, message, expected);
                continue;
            }
            match (schema.check)(alone(k, v, span.clone())) {
                Err(e) if missing_field(&e).is_none_or(|m| m == name) => {
                    self.serde_error(&p, v.span().start, &e);
                    self.removed.push(p);
                }
                _ => {
                    good.insert(k.clone(), v.clone());
                }
            }
        }
        // A required field absent (serde names the first), checked on the
        // fields that passed so that a bad one is not reported twice.
        let Err(e) = (schema.check)(Spanned::new(span.clone(), DeValue::Table(good.clone())))
        else {
            return Some(good);
        };
        let reported = |m: &str| t.contains_key(m) || meant.iter().any(|s| s == m);
        match missing_field(&e) {
            Some(m) if reported(m) => {}
            Some(m) => {
                let at = self.idx.locate(path).unwrap_or(span.start);
                self.push(at, path.to_string(), format!("missing field `{m}`"));
            }
            None => self.serde_error(path, span.start, &e),
        }
        None
    }
}

/// The field meant by an unknown `name`, among those valid at this place:
/// one of a nested table's fields by that exact name (`retry.max_attempts`
/// written in the upstream's own table), else the closest by edit distance
/// (at most 2, and at most half the name), else the one field the name is a
/// clear prefix of or extends.
fn suggest(schema: &Schema, name: &str) -> Option<String> {
    for (table, nested) in schema.nested {
        let (Nested::Table(s) | Nested::MapOf(s)) = nested;
        if (s.fields)().contains(&name) && !matches!(nested, Nested::MapOf(_)) {
            return Some(format!("{table}.{name}"));
        }
    }
    let known = (schema.fields)();
    let close = known
        .iter()
        .map(|k| (distance(name, k), *k))
        .filter(|(d, _)| *d <= 2 && *d <= name.chars().count() / 2)
        .min_by_key(|(d, _)| *d);
    if let Some((_, k)) = close {
        return Some(k.to_string());
    }
    let prefixed: Vec<&str> = known
        .iter()
        .copied()
        .filter(|k| {
            (name.len() >= 3 && k.starts_with(name)) || (k.len() >= 3 && name.starts_with(k))
        })
        .collect();
    match prefixed.as_slice() {
        [one] => Some(one.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("timout", "timeout"), 1);
        assert_eq!(distance("max_atempts", "max_attempts"), 1);
        assert_eq!(distance("rsp", "rps"), 1);
        assert_eq!(distance("", "abc"), 3);
    }

    #[test]
    fn suggestions_come_from_the_fields_valid_at_that_place() {
        assert_eq!(suggest(&POLICY, "timout").as_deref(), Some("timeout"));
        assert_eq!(
            suggest(&RETRY, "max_atempts").as_deref(),
            Some("max_attempts")
        );
        assert_eq!(
            suggest(&UPSTREAM, "max_attempts").as_deref(),
            Some("retry.max_attempts")
        );
        assert_eq!(suggest(&POLICY, "timeout_ms").as_deref(), Some("timeout"));
        assert_eq!(suggest(&RATE_LIMIT, "rsp").as_deref(), Some("rps"));
        assert_eq!(suggest(&RETRY, "frobnicate"), None);
        // `max` is a prefix of two rate_limit fields: no clear one.
        assert_eq!(suggest(&RATE_LIMIT, "max"), None);
        assert_eq!(suggest(&RETRY, "max").as_deref(), Some("backoff.max"));
        assert_eq!(suggest(&BREAKER, "max").as_deref(), Some("max_open"));
    }

    /// Every table written as nested here is a field serde knows there.
    #[test]
    fn nested_tables_are_real_fields() {
        let all = [
            &CONFIG,
            &SERVER,
            &POLICY,
            &RETRY,
            &BACKOFF,
            &RATE_LIMIT,
            &IDEMPOTENCY,
            &CACHE,
            &HEDGE,
            &UPSTREAM,
        ];
        for s in all {
            for (name, _) in s.nested {
                assert!((s.fields)().contains(name), "{name}");
            }
        }
        assert!((fields::<RawRetry>)().contains(&"max_attempts"));
    }
}
