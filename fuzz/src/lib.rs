//! What the fuzz targets share: the strict RFC 9112 reference (the same
//! file `tests/framing_reference.rs` uses), a routing snapshot for the fast
//! path, and a way to cut an input into reads.

#[path = "../../tests/reference/rfc9112.rs"]
pub mod reference;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use weir::config::Config;
use weir::metrics::Metrics;
use weir::proxy::{ListenerRole, Snapshot};
use weir::state::StateRegistry;
use weir::upstream::reach::ReachRegistry;

/// The largest request head weir takes by default (`max_header_bytes`).
pub const MAX_HEAD: usize = 64 * 1024;

/// A snapshot with one upstream that every request on its dedicated
/// listener ([`role`]) routes to, built once.
pub fn snapshot() -> &'static Snapshot {
    static SNAP: OnceLock<Snapshot> = OnceLock::new();
    SNAP.get_or_init(|| {
        let src = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
                   [upstreams.svc]\nurl = \"http://127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\n";
        let config =
            Arc::new(Config::parse(Path::new("fuzz.toml"), src).expect("the fuzz config parses"));
        let metrics = Arc::new(Metrics::new());
        let states = StateRegistry::new(metrics.clone())
            .sync(&config)
            .expect("the fuzz config's state");
        let reaches = ReachRegistry::new();
        let plan = reaches
            .plan(&config, &metrics)
            .expect("the fuzz config's reach");
        let reached = reaches.apply(plan, &config, &metrics);
        Snapshot::build(config, states, reached, metrics).expect("the fuzz snapshot")
    })
}

/// The listener the fast path reads from: the upstream's own.
pub fn role() -> ListenerRole {
    ListenerRole::Dedicated("svc".into())
}

/// Splits an input into read sizes (its first bytes, one size each, up to
/// a zero) and the bytes themselves.
pub fn reads(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let n = data.iter().take(8).take_while(|b| **b != 0).count();
    let pieces = data[..n].iter().map(|b| usize::from(*b)).collect();
    (pieces, data.get(n + 1..).unwrap_or_default())
}
