//! Config errors that say where: file, line, column and field path.
//!
//! serde errors carry a byte span; validation errors carry a field path. A
//! [`SpanIndex`] built from the same source with `toml_edit` maps each to the
//! other, so every error names both.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the position is unknown (e.g. a missing file).
    pub line: usize,
    pub column: usize,
    /// Dotted field path, e.g. `upstreams.payments.retry.max_attempts`.
    pub field: String,
    pub message: String,
    /// For an unknown field with no close name: the names valid at its
    /// place. `weir check` and `POST /reload` list them after the message
    /// ([`fmt::Display`]); a rejected reload's log lines leave them out.
    pub expected: Vec<String>,
}

impl ConfigError {
    /// The message, its credentials masked, without the list of expected
    /// names (a "did you mean" hint stays: it is part of the message).
    pub fn brief(&self) -> std::borrow::Cow<'_, str> {
        redact_credentials(&self.message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": `{}`", self.field)?;
        }
        write!(f, ": {}", self.brief())?;
        if !self.expected.is_empty() {
            let names: Vec<String> = self.expected.iter().map(|n| format!("`{n}`")).collect();
            write!(f, ": expected one of {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// `text` with the credentials of every URL in it shown as `***`, as
/// `/config` shows them (docs/reference/configuration.md#configuration-and-defaults):
/// a URL's userinfo (`user:***@`, or `***@` for a lone user part, which is
/// often a token) and its query (`?***`). For messages that quote what a
/// config says — `weir check`, a rejected reload's log line and `POST
/// /reload` body — even when the URL is too broken to parse: a URL ends at
/// white space, a quote, a backtick, a backslash or an angle bracket, and
/// its userinfo at the last `@` before that, so a password with a stray `/`,
/// `#` or `?` in it is masked too.
pub fn redact_credentials(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || "\"'`\\<>".contains(c))
            .unwrap_or(tail.len());
        let (url, after) = tail.split_at(end);
        let host_part = match url.rfind('@') {
            Some(at) => {
                if let Some((user, _)) = url[..at].split_once(':') {
                    out.push_str(user);
                    out.push(':');
                }
                out.push_str("***@");
                &url[at + 1..]
            }
            None => url,
        };
        match host_part.split_once('?') {
            Some((before, _)) => {
                out.push_str(before);
                out.push_str("?***");
            }
            None => out.push_str(host_part),
        }
        rest = after;
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Every error found in one config file (at least one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Every key path in a document with the byte span of its key and value.
#[derive(Debug, Default)]
pub struct SpanIndex {
    entries: Vec<(String, Range<usize>, Range<usize>)>,
    /// Each path's first entry: validation asks [`SpanIndex::has`] for
    /// every field of every upstream, so a scan of `entries` per question
    /// made `weir check` quadratic in the number of upstreams.
    by_path: std::collections::HashMap<String, usize>,
    line_starts: Vec<usize>,
}

impl SpanIndex {
    pub fn new(src: &str) -> Self {
        let mut idx = SpanIndex {
            entries: Vec::new(),
            by_path: std::collections::HashMap::new(),
            line_starts: std::iter::once(0)
                .chain(src.match_indices('\n').map(|(i, _)| i + 1))
                .collect(),
        };
        if let Ok(doc) = toml_edit::Document::parse(src) {
            if let Some(t) = doc.as_item().as_table() {
                idx.walk_table(t, "");
            }
        }
        idx
    }

    fn add(&mut self, path: String, key: Option<Range<usize>>, value: Option<Range<usize>>) {
        let key = key.or_else(|| value.clone()).unwrap_or(0..0);
        let value = value.unwrap_or_else(|| key.clone());
        self.by_path
            .entry(path.clone())
            .or_insert(self.entries.len());
        self.entries.push((path, key, value));
    }

    fn walk_table(&mut self, t: &toml_edit::Table, prefix: &str) {
        for (k, _) in t.iter() {
            if let Some((key, item)) = t.get_key_value(k) {
                let path = join(prefix, k);
                self.add(path.clone(), key.span(), item.span());
                self.walk_item(item, &path);
            }
        }
    }

    fn walk_item(&mut self, item: &toml_edit::Item, path: &str) {
        match item {
            toml_edit::Item::Table(t) => self.walk_table(t, path),
            toml_edit::Item::Value(v) => self.walk_value(v, path),
            toml_edit::Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    let p = format!("{path}[{i}]");
                    self.add(p.clone(), t.span(), t.span());
                    self.walk_table(t, &p);
                }
            }
            toml_edit::Item::None => {}
        }
    }

    fn walk_value(&mut self, v: &toml_edit::Value, path: &str) {
        match v {
            toml_edit::Value::InlineTable(t) => {
                for (k, _) in t.iter() {
                    if let Some((key, item)) = t.get_key_value(k) {
                        let p = join(path, k);
                        self.add(p.clone(), key.span(), item.span());
                        self.walk_item(item, &p);
                    }
                }
            }
            toml_edit::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    let p = format!("{path}[{i}]");
                    self.add(p.clone(), v.span(), v.span());
                    self.walk_value(v, &p);
                }
            }
            _ => {}
        }
    }

    /// Whether the document sets this exact path.
    pub fn has(&self, path: &str) -> bool {
        self.by_path.contains_key(path)
    }

    /// Line and column (1-based) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let line = self.line_starts.partition_point(|&s| s <= offset).max(1);
        let start = self.line_starts.get(line - 1).copied().unwrap_or(0);
        (line, offset - start + 1)
    }

    /// Where a field's value starts; for a missing field, its nearest present parent.
    pub fn locate(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some((_, key, value)) = self.by_path.get(p).and_then(|&i| self.entries.get(i)) {
                // A value's position is more useful than its key's, except for
                // tables, whose "value" span is the whole table.
                return Some(if value.start >= key.start {
                    value.start
                } else {
                    key.start
                });
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return None,
            }
        }
    }

    /// The innermost field whose key or value span holds `offset`.
    pub fn path_at(&self, offset: usize) -> Option<&str> {
        self.entries
            .iter()
            .filter(|(_, k, v)| k.contains(&offset) || v.contains(&offset) || k.start == offset)
            .min_by_key(|(_, k, v)| {
                let kv = k.start.min(v.start)..k.end.max(v.end);
                kv.end - kv.start
            })
            .map(|(p, _, _)| p.as_str())
    }

    pub fn error_at_path(&self, file: &Path, field: &str, message: String) -> ConfigError {
        let (line, column) = self
            .locate(field)
            .map(|o| self.line_col(o))
            .unwrap_or((0, 0));
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            field: field.to_string(),
            message,
            expected: Vec::new(),
        }
    }
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    let key = if key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if prefix.is_empty() {
        key
    } else {
        format!("{prefix}.{key}")
    }
}

/// serde's "unknown field `timout`, expected one of `a`, `b`" (or "unknown
/// variant …, expected …") with "; did you mean `timeout`?" added when one
/// of the expected names is a slip away. For an unknown field the expected
/// names are split off (returned, for [`ConfigError::expected`]), or
/// dropped when a hint names the one meant.
pub(super) fn with_suggestion(message: &str) -> (String, Vec<String>) {
    let field = message.strip_prefix("unknown field `");
    let unknown = field
        .or_else(|| message.strip_prefix("unknown variant `"))
        .and_then(|r| r.split('`').next());
    let expected = message.split_once("expected").map(|(_, r)| r);
    let (Some(word), Some(expected)) = (unknown, expected) else {
        return (message.to_string(), Vec::new());
    };
    let names: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    let hint = crate::policy::suggest::closest(word, names.iter().map(String::as_str));
    match (field.is_some(), hint) {
        (true, Some(c)) => (
            format!("unknown field `{word}`: did you mean `{c}`?"),
            Vec::new(),
        ),
        (true, None) => (format!("unknown field `{word}`"), names),
        (false, Some(c)) => (format!("{message}; did you mean `{c}`?"), Vec::new()),
        (false, None) => (message.to_string(), Vec::new()),
    }
}

/// Turns a toml/serde error into a located [`ConfigError`].
pub fn from_toml(file: &Path, src: &str, idx: &SpanIndex, e: &toml::de::Error) -> ConfigError {
    let offset = e.span().map(|s| s.start);
    let (line, column) = offset.map(|o| idx.line_col(o)).unwrap_or((0, 0));
    let mut field = offset
        .and_then(|o| idx.path_at(o))
        .unwrap_or_default()
        .to_string();
    let (message, expected) = with_suggestion(e.message().trim());
    // For an unknown field, the path is the field itself; name it even when the
    // span index could not (e.g. the document did not parse at all).
    if field.is_empty() {
        if let Some(name) = message
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            field = name.to_string();
        }
    }
    let _ = src;
    ConfigError {
        file: file.to_path_buf(),
        line,
        column,
        field,
        message,
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::redact_credentials as r;

    #[test]
    fn credentials_in_quoted_urls_are_masked() {
        for (text, want) in [
            (
                "invalid url \"redis://weir:hunter2@cache:6379/x\": the path",
                "invalid url \"redis://weir:***@cache:6379/x\": the path",
            ),
            (
                "\"https://tok3n@api.example\"",
                "\"https://***@api.example\"",
            ),
            ("http://u:p/ss#w@h:1/a x", "http://u:***@h:1/a x"),
            (
                "http://c:4318/v1?key=s3cret and",
                "http://c:4318/v1?*** and",
            ),
            (
                "e.g. \"http://127.0.0.1:4317\"",
                "e.g. \"http://127.0.0.1:4317\"",
            ),
            ("a:b@c, no url", "a:b@c, no url"),
            (
                "two: redis://:pw@a/0 and http://x:y@b",
                "two: redis://:***@a/0 and http://x:***@b",
            ),
        ] {
            assert_eq!(r(text), want, "{text}");
        }
    }
}
