//! Prometheus metrics of the edge, served at `/metrics` in the text format.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub endpoint: String,
    pub reason: String,
}

#[derive(Clone, Default)]
pub struct ServerMetrics {
    pub received_bytes: Family<EndpointLabels, Counter>,
    pub received_profiles: Family<EndpointLabels, Counter>,
    pub rejected: Family<RejectionLabels, Counter>,
    pub ready: Gauge,
    pub connections_open: Gauge,
    pub connections_refused: Counter,
    pub cuts: Family<CutLabels, Counter>,
    pub duplicates: Family<EndpointLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CutLabels {
    pub what: &'static str,
}

impl ServerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_ingest_received_bytes",
            "Request body bytes received by ingest endpoints",
            self.received_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_received_profiles",
            "Profiles accepted by ingest endpoints",
            self.received_profiles.clone(),
        );
        registry.register(
            "kiln_ingest_rejected",
            "Ingest requests refused, by endpoint and reason",
            self.rejected.clone(),
        );
        registry.register(
            "kiln_http_connections_open",
            "Client connections open now",
            self.connections_open.clone(),
        );
        registry.register(
            "kiln_http_connections_refused",
            "Connections answered 429 and closed because max_connections were open",
            self.connections_refused.clone(),
        );
        registry.register(
            "kiln_ingest_cut",
            "What the shape limits cut from accepted profiles: samples dropped past limits.max_samples_per_profile, stacks cut at limits.max_stack_depth, names cut at 4 KiB",
            self.cuts.clone(),
        );
        registry.register(
            "kiln_ingest_duplicates",
            "Profiles acknowledged without being stored again: a copy was stored within limits.dedup_window_ms (a client's retry)",
            self.duplicates.clone(),
        );
        registry.register(
            "kiln_ready",
            "1 once the server accepts writes",
            self.ready.clone(),
        );
    }

    pub fn reject(&self, endpoint: &str, reason: &str) {
        self.rejected
            .get_or_create(&RejectionLabels {
                endpoint: endpoint.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn accept(&self, endpoint: &str, bytes: usize, profiles: usize) {
        let labels = EndpointLabels {
            endpoint: endpoint.to_string(),
        };
        self.received_bytes
            .get_or_create(&labels)
            .inc_by(bytes as u64);
        self.received_profiles
            .get_or_create(&labels)
            .inc_by(profiles as u64);
    }

    pub fn duplicates(&self, endpoint: &str, count: usize) {
        if count > 0 {
            self.duplicates
                .get_or_create(&EndpointLabels {
                    endpoint: endpoint.to_string(),
                })
                .inc_by(count as u64);
        }
    }

    pub fn cut(&self, cuts: &kiln_ingest::Cuts) {
        for (what, count) in [
            ("samples", cuts.samples),
            ("stacks", cuts.stacks),
            ("names", cuts.names),
        ] {
            if count > 0 {
                self.cuts
                    .get_or_create(&CutLabels { what })
                    .inc_by(count as u64);
            }
        }
    }
}
