use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kiln_ingest::push::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use prost::Message;

use crate::common::*;
use crate::pyroscope::{ticks, url_escape};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

pub fn request(service: &str, profile: &[u8], id: &str) -> PushRequest {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: vec![
                LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
                LabelPair {
                    name: "service_name".into(),
                    value: service.into(),
                },
                LabelPair {
                    name: "otel.scope.name".into(),
                    value: "pyroscope".into(),
                },
            ],
            samples: vec![RawSample {
                raw_profile: profile.to_vec(),
                id: id.into(),
            }],
        }],
    }
}

/// CPU of `service` over all time, from the flame graph.
pub fn cpu_total(server: &TestServer, service: &str) -> i64 {
    let query = url_escape(&format!("{CPU}{{service_name=\"{service}\"}}"));
    ticks(&server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now%2B1h"),
        &[],
    ))
}

pub fn expected_total() -> i64 {
    pprof_total(&fixture("profefe-collector_cpu_1.prof"), 1)
}

#[test]
fn connect_proto_gzip_and_json() {
    let server = TestServer::start();
    // As the Python SDK sends it: gzip over the request, an uncompressed pprof inside.
    let raw =
        kiln_model::compress::gunzip_bounded(&fixture("profefe-collector_cpu_1.prof"), 1 << 30)
            .unwrap();
    let body =
        gzip(&request("pyapp", &raw, "8f1e2d3c-0000-4000-8000-000000000001").encode_to_vec());
    let (status, text) = server.post_with(
        "/push.v1.PusherService/Push",
        &body,
        &[
            ("Content-Type", "application/proto"),
            ("Content-Encoding", "gzip"),
            ("Connect-Protocol-Version", "1"),
        ],
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(cpu_total(&server, "pyapp"), expected_total());
    // The SDK's labels are kept, dots and all.
    let query = url_escape(&format!(
        "{CPU}{{service_name=\"pyapp\", otel.scope.name=\"pyroscope\"}}"
    ));
    assert_eq!(
        ticks(&server.json(
            &format!("/pyroscope/render?query={query}&from=0&until=now%2B1h"),
            &[]
        )),
        expected_total()
    );

    let json = serde_json::json!({"series": [{
        "labels": [{"name": "service_name", "value": "jsonapp"}, {"name": "__name__", "value": "process_cpu"}],
        "samples": [{"rawProfile": base64::engine::general_purpose::STANDARD.encode(&raw), "ID": "x1"}]
    }]});
    let (status, text) = server.post_with(
        "/push.v1.PusherService/Push",
        json.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    assert_eq!((status, text.as_str()), (200, "{}"));
    assert_eq!(cpu_total(&server, "jsonapp"), expected_total());

    // Errors follow the Connect protocol: a JSON body with a code.
    let (status, text) = server.post_with(
        "/push.v1.PusherService/Push",
        b"\xff\xff",
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 400);
    let error: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["code"], "invalid_argument");
    let (status, _) = server.post_with(
        "/push.v1.PusherService/Push",
        b"x",
        &[("Content-Type", "text/plain")],
    );
    assert_eq!(status, 415);
}

pub fn grpc_frame(message: &[u8], compressed: bool) -> Vec<u8> {
    let payload = if compressed {
        gzip(message)
    } else {
        message.to_vec()
    };
    let mut frame = vec![compressed as u8];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// Sends one unary gRPC call over HTTP/2 cleartext; returns (grpc-status, grpc-message).
fn grpc_call(server: &TestServer, body: Vec<u8>, compressed: bool) -> (String, String) {
    let url = format!("{}/push.v1.PusherService/Push", server.url);
    server.runtime().block_on(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<Full<Bytes>>();
        let mut builder = hyper::Request::post(url)
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if compressed {
            builder = builder.header("grpc-encoding", "gzip");
        }
        let response = client
            .request(builder.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("h2c request");
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        let headers = response.headers().clone();
        let collected = response.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let pick = |name: &str| {
            trailers
                .get(name)
                .or(headers.get(name))
                .map(|v| v.to_str().unwrap_or("").to_string())
                .unwrap_or_default()
        };
        (pick("grpc-status"), pick("grpc-message"))
    })
}

#[test]
fn grpc_over_h2c_on_the_same_port() {
    let server = TestServer::start();
    let profile = fixture("profefe-collector_cpu_1.prof");
    let message = request("grpcapp", &profile, "").encode_to_vec();
    assert_eq!(
        grpc_call(&server, grpc_frame(&message, false), false).0,
        "0"
    );
    assert_eq!(cpu_total(&server, "grpcapp"), expected_total());
    let message = request("grpcgzip", &profile, "").encode_to_vec();
    assert_eq!(grpc_call(&server, grpc_frame(&message, true), true).0, "0");
    assert_eq!(cpu_total(&server, "grpcgzip"), expected_total());
    // A bad profile inside is INVALID_ARGUMENT (3) with a message.
    let bad = request("grpcbad", b"not a profile", "").encode_to_vec();
    let (status, message) = grpc_call(&server, grpc_frame(&bad, false), false);
    assert_eq!(status, "3");
    assert!(message.contains("pprof"), "{message}");
    let (status, _) = grpc_call(&server, vec![0, 0, 0], false);
    assert_eq!(status, "3");
}
