//! The write endpoints: their paths, shared by the router and the layers that count
//! refused writes, and the `endpoint` label of the ingest metrics. A leaf module, so the
//! router, the listener and the RPC layer all depend on it and not on each other.

use axum::http::Method;

pub const PYROSCOPE_PATHS: [&str; 2] = ["/ingest", "/pyroscope/ingest"];
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
pub const PROFEFE_PATH: &str = "/api/0/profiles";
/// OTLP/HTTP's profiles path.
pub const OTLP_HTTP_PATH: &str = "/v1development/profiles";
pub const OTLP_GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// The `endpoint` labels of the ingest metrics.
pub const PYROSCOPE: &str = "ingest";
pub const PUSH: &str = "push";
pub const PROFEFE: &str = "profefe";
pub const OTLP: &str = "otlp";

/// The `endpoint` label of a write; `None` for reads (a profefe listing shares its path
/// with profefe's write).
pub fn endpoint_of(method: &Method, path: &str) -> Option<&'static str> {
    if method != Method::POST {
        return None;
    }
    match path {
        path if PYROSCOPE_PATHS.contains(&path) => Some(PYROSCOPE),
        PUSH_PATH => Some(PUSH),
        PROFEFE_PATH => Some(PROFEFE),
        OTLP_HTTP_PATH | OTLP_GRPC_PATH => Some(OTLP),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_are_counted_as_ingest() {
        assert_eq!(
            endpoint_of(&Method::POST, "/api/0/profiles"),
            Some("profefe")
        );
        assert_eq!(endpoint_of(&Method::GET, "/api/0/profiles"), None);
        assert_eq!(endpoint_of(&Method::POST, "/ingest"), Some("ingest"));
        assert_eq!(
            endpoint_of(&Method::POST, "/pyroscope/ingest"),
            Some("ingest")
        );
        assert_eq!(endpoint_of(&Method::POST, OTLP_GRPC_PATH), Some("otlp"));
        assert_eq!(
            endpoint_of(&Method::POST, "/querier.v1.QuerierService/Series"),
            None
        );
    }
}
