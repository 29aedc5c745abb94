"""Sends OTLP profiles to Kiln with the official OpenTelemetry definitions.

The request is built with the `opentelemetry-proto` package (PyPI), an implementation
independent of Kiln's, and sent over gRPC (`grpcio`) and OTLP/HTTP (protobuf and JSON).

Usage: otlp_client.py HOST:PORT TRANSPORT SERVICE
TRANSPORT is grpc, http-protobuf or http-json. Prints the export response as JSON.
"""

import gzip
import json
import sys
import time
import urllib.request

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as service,
    profiles_service_pb2_grpc as service_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2 as common
from opentelemetry.proto.profiles.v1development import profiles_pb2 as profiles
from opentelemetry.proto.resource.v1 import resource_pb2 as resource

TRACE_ID = bytes(range(1, 17))
SPAN_ID = bytes(range(1, 9))


def build_request(service_name):
    strings = ["", "samples", "count", "cpu", "nanoseconds", "main", "handle_request",
               "kiln_otlp_hot_loop", "app.py", "/usr/lib/libkilnfoo.so",
               "process.executable.build_id.gnu", "thread.name", "worker-1"]
    s = {text: index for index, text in enumerate(strings)}
    d = profiles.ProfilesDictionary(string_table=strings)
    d.mapping_table.add()  # [0]: no mapping
    d.function_table.add()  # [0]: unknown function
    d.location_table.add()
    d.link_table.add()
    d.attribute_table.add()
    d.stack_table.add()
    for name in ["main", "handle_request", "kiln_otlp_hot_loop"]:
        d.function_table.add(name_strindex=s[name], system_name_strindex=s[name],
                             filename_strindex=s["app.py"], start_line=1)
    # mapping 1 carries a build id, for the unsymbolized frame
    d.attribute_table.add(key_strindex=s["process.executable.build_id.gnu"],
                          value=common.AnyValue(string_value="abc123"))
    d.mapping_table.add(memory_start=0x7f0000000000, memory_limit=0x7f0000100000,
                        file_offset=0x1000, filename_strindex=s["/usr/lib/libkilnfoo.so"],
                        attribute_indices=[1])
    # locations 1..3: main, handle_request, hot loop (lines 10, 20, 30); 4: unsymbolized
    for function, line in [(1, 10), (2, 20), (3, 30)]:
        d.location_table.add(lines=[profiles.Line(function_index=function, line=line)])
    d.location_table.add(mapping_index=1, address=0x7f0000000000 + 0x2345)
    # stacks, leaf first: 1 = hot loop <- handle_request <- main; 2 = libkilnfoo <- main
    d.stack_table.add(location_indices=[3, 2, 1])
    d.stack_table.add(location_indices=[4, 1])
    d.link_table.add(trace_id=TRACE_ID, span_id=SPAN_ID)
    d.attribute_table.add(key_strindex=s["thread.name"],
                          value=common.AnyValue(string_value_strindex=s["worker-1"]))

    now = time.time_ns()
    second = now - now % 1_000_000_000
    good = profiles.Profile(
        sample_type=profiles.ValueType(type_strindex=s["samples"], unit_strindex=s["count"]),
        period_type=profiles.ValueType(type_strindex=s["cpu"], unit_strindex=s["nanoseconds"]),
        period=10_000_000,
        time_unix_nano=second - 2_000_000_000,
        duration_nano=3_000_000_000,
        profile_id=bytes(range(16)),
    )
    # 60 hot-loop samples over two seconds, linked to the span, per-sample thread name
    good.samples.add(stack_index=1, link_index=1, attribute_indices=[2],
                     values=[10, 20, 30],
                     timestamps_unix_nano=[second - 2_000_000_000 + 1,
                                           second - 2_000_000_000 + 2,
                                           second - 1_000_000_000 + 5])
    # 5 samples in the shared library, no timestamps: at the profile's time
    good.samples.add(stack_index=2, values=[5])
    # a profile that refers past the stack table: refused alone (partial success)
    bad = profiles.Profile(
        sample_type=profiles.ValueType(type_strindex=s["samples"], unit_strindex=s["count"]),
        time_unix_nano=second,
    )
    bad.samples.add(stack_index=99, values=[1])

    request = service.ExportProfilesServiceRequest(dictionary=d)
    rp = request.resource_profiles.add()
    rp.resource.CopyFrom(resource.Resource(attributes=[
        common.KeyValue(key="service.name", value=common.AnyValue(string_value=service_name)),
        common.KeyValue(key="host.name", value=common.AnyValue(string_value="kiln-otlp-host")),
        common.KeyValue(key="process.pid", value=common.AnyValue(int_value=4242)),
    ]))
    sp = rp.scope_profiles.add()
    sp.scope.name = "kiln-otlp-test"
    sp.scope.attributes.add(key="scope.kind", value=common.AnyValue(string_value="e2e"))
    sp.profiles.append(good)
    sp.profiles.append(bad)
    return request


def main():
    address, transport, service_name = sys.argv[1], sys.argv[2], sys.argv[3]
    request = build_request(service_name)
    if transport == "grpc":
        with grpc.insecure_channel(address) as channel:
            stub = service_grpc.ProfilesServiceStub(channel)
            response = stub.Export(request, timeout=30)
        print(json_format.MessageToJson(response))
        return
    if transport == "http-protobuf":
        body = gzip.compress(request.SerializeToString())
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    else:
        # OTLP/JSON: lowerCamelCase names, ids as hex (protobuf's printer writes base64)
        document = json_format.MessageToDict(request)
        for link in document["dictionary"]["linkTable"]:
            if "traceId" in link:
                link["traceId"] = TRACE_ID.hex()
                link["spanId"] = SPAN_ID.hex()
        body = json.dumps(document).encode()
        headers = {"Content-Type": "application/json"}
    http = urllib.request.Request(f"http://{address}/v1development/profiles", data=body,
                                  headers=headers, method="POST")
    with urllib.request.urlopen(http, timeout=30) as answer:
        payload = answer.read()
        if transport == "http-json":
            print(payload.decode())
        else:
            response = service.ExportProfilesServiceResponse.FromString(payload)
            print(json_format.MessageToJson(response))


if __name__ == "__main__":
    main()
