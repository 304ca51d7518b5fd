//! Connections and bytes (docs/reference/metrics.md#metrics): client
//! connections open now, and each upstream's open connections and the
//! bytes it was sent and sent back, counted at the socket
//! (`metrics::meter`).

use crate::metrics::meter::Meter;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The families, registered once.
#[derive(Debug, Clone)]
pub(super) struct WireFamilies {
    clients: IntGauge,
    open: IntGaugeVec,
    bytes: IntCounterVec,
}

impl WireFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        let defined = "static metric definition";
        let clients = IntGauge::with_opts(Opts::new(
            "weir_client_connections_open",
            "Client connections open now, on every listener (the admin listener's aside).",
        ))
        .expect(defined);
        let open = IntGaugeVec::new(
            Opts::new(
                "weir_upstream_connections_open",
                "Connections to the upstream open now, idle in a pool or carrying a request (tunnels not included).",
            ),
            &["upstream"],
        )
        .expect(defined);
        let bytes = IntCounterVec::new(
            Opts::new(
                "weir_upstream_bytes_total",
                "Bytes on the upstream's connections as they crossed the socket (TLS records included), by direction: sent to it, received from it.",
            ),
            &["upstream", "direction"],
        )
        .expect(defined);
        for c in [
            Box::new(clients.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(open.clone()),
            Box::new(bytes.clone()),
        ] {
            r.register(c).expect("metric registered once");
        }
        WireFamilies {
            clients,
            open,
            bytes,
        }
    }

    /// One upstream's meter, its series created at zero.
    pub(super) fn upstream(&self, name: &str) -> Meter {
        Meter::new(
            self.open.with_label_values(&[name]),
            self.bytes.with_label_values(&[name, "sent"]),
            self.bytes.with_label_values(&[name, "received"]),
        )
    }

    /// `weir_client_connections_open`.
    pub(super) fn clients(&self) -> &IntGauge {
        &self.clients
    }

    pub(super) fn forget(&self, name: &str) {
        self.open.remove_label_values(&[name]).ok();
        for d in ["sent", "received"] {
            self.bytes.remove_label_values(&[name, d]).ok();
        }
    }
}
