//! What the command line sets over a config: `--listen`, `--admin` and
//! `--upstream NAME=URL` of `weir run` and `weir check`
//! (docs/reference/cli.md#config-from-the-command-line). They are applied to
//! the raw model before validation, so a config made of them is checked,
//! printed and reloaded like one read from a file, and an error in one
//! names the flag instead of a line of the file.

use super::error::ConfigError;
use super::raw::{RawConfig, RawUpstream};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings from the command line, kept with the config so that every
/// reload applies them again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen`: `[server] listen`.
    pub listen: Option<SocketAddr>,
    /// `--admin`: `[server] admin`.
    pub admin: Option<SocketAddr>,
    /// `--upstream NAME=URL`, in the order given: sets `upstreams.NAME.url`,
    /// adding the upstream with `hosts = ["NAME"]` when the config has none
    /// of that name.
    pub upstreams: Vec<(String, String)>,
    /// The config is the built-in default: the `--upstream`s, when there
    /// are any, replace its example upstream `app` instead of joining it.
    pub replace_upstreams: bool,
}

/// `NAME=URL`, for clap.
pub fn parse_upstream(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, url)) if !name.is_empty() && !url.is_empty() => {
            Ok((name.to_string(), url.to_string()))
        }
        _ => Err(format!(
            "expected NAME=URL, e.g. app=http://127.0.0.1:8080, got {s:?}"
        )),
    }
}

impl Overrides {
    pub fn is_empty(&self) -> bool {
        self.listen.is_none() && self.admin.is_none() && self.upstreams.is_empty()
    }

    /// Sets what the command line says in `raw`; returns the upstreams it
    /// added (the config had none of that name).
    pub(super) fn apply(&self, raw: &mut RawConfig) -> Vec<String> {
        if let Some(l) = self.listen {
            raw.server.listen = Some(l.to_string());
        }
        if let Some(a) = self.admin {
            raw.server.admin = Some(a.to_string());
        }
        if self.replace_upstreams && !self.upstreams.is_empty() {
            raw.upstreams.clear();
        }
        let mut added = Vec::new();
        for (name, url) in &self.upstreams {
            if !raw.upstreams.contains_key(name) {
                added.push(name.clone());
            }
            let up = raw
                .upstreams
                .entry(name.clone())
                .or_insert_with(|| RawUpstream {
                    hosts: Some(vec![name.clone()]),
                    ..RawUpstream::default()
                });
            up.url = Some(url.clone());
        }
        added
    }

    /// The flag that set `field`, as it would be typed; `None` when the
    /// command line did not set it (or anything it rests on).
    fn flag_for(&self, field: &str, added: &[String]) -> Option<String> {
        let within = |table: &str| {
            field
                .strip_prefix(table)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        if let Some(l) = self.listen.filter(|_| within("server.listen")) {
            return Some(format!("--listen {l}"));
        }
        if let Some(a) = self.admin.filter(|_| within("server.admin")) {
            return Some(format!("--admin {a}"));
        }
        self.upstreams
            .iter()
            .rev()
            .find(|(name, _)| {
                let q = super::validate::quote(name);
                within(&format!("upstreams.{q}.url"))
                    || (added.contains(name) && within(&format!("upstreams.{q}")))
            })
            .map(|(name, url)| format!("--upstream {name}={url}"))
    }

    /// `e` placed on the flag that set its field, when one did: the file's
    /// line and column would point at a value the command line replaced.
    pub(super) fn locate(&self, added: &[String], mut e: ConfigError) -> ConfigError {
        if let Some(flag) = self.flag_for(&e.field, added) {
            e.file = PathBuf::from(flag);
            e.line = 0;
            e.column = 0;
        }
        e
    }
}
