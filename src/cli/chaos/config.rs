//! The weir config a `weir chaos` scenario runs with: weir's defaults, the
//! scenario's own settings, and `--config`'s `[defaults]` over them.

use super::Scenario;
use crate::config::Config;
use std::path::{Path, PathBuf};

/// `user`'s `[defaults]` table, alone in a table (empty without a file).
pub(super) fn user_defaults(user: Option<&Path>) -> Result<toml::Table, String> {
    let mut t = toml::Table::new();
    let Some(p) = user else { return Ok(t) };
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    if let Some(d) = table.get("defaults") {
        t.insert("defaults".into(), d.clone());
    }
    Ok(t)
}

/// The weir config for a scenario: weir's defaults, the scenario's settings,
/// `user`'s `[defaults]` merged over those, and one upstream pointed at `addr`.
pub(super) fn weir_config(
    scenario: Scenario,
    addr: std::net::SocketAddr,
    user: Option<&Path>,
) -> Result<Config, String> {
    let mut policy: toml::Table =
        toml::from_str(scenario.settings()).map_err(|e| format!("scenario settings: {e}"))?;
    merge(&mut policy, user_defaults(user)?);
    let mut src = String::from("[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n");
    src.push_str(&toml::to_string(&policy).map_err(|e| e.to_string())?);
    src.push_str(&format!(
        "\n[upstreams.chaos]\nurl = \"http://{addr}\"\nhosts = [\"chaos\"]\n"
    ));
    let path = match user {
        Some(p) => PathBuf::from(format!(
            "<chaos {} merged with {}>",
            scenario.name(),
            p.display()
        )),
        None => PathBuf::from(format!("<chaos {}>", scenario.name())),
    };
    Config::parse(&path, &src).map_err(|e| e.to_string())
}

/// Merges `over` into `base`: tables field by field, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}
