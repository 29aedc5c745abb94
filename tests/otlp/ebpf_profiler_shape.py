"""Sends native frames to Kiln as the OpenTelemetry eBPF profiler reports them.

Built with the `opentelemetry-proto` package (PyPI) and sent over gRPC, as the profiler's
OTLP reporter does. What makes its profiles unlike a pprof converted to OTLP:

- a native frame it could not name is a location with no lines: its mapping, an address
  in the ELF file's own virtual address space (not the process's), and the attribute
  `profile.frame.type: native`;
- its mapping is given in that space too: `memory_start`/`memory_limit` span the
  executable segment's addresses in the file and `file_offset` is the segment's offset;
- the mapping carries the GNU build id with the profiler's own file hash
  (`process.executable.build_id.htlhash`) beside it. The order of a mapping's
  attributes is not promised, so here the hash comes first;
- interpreted frames come named (a function and a line) with their own frame type, and
  the process is told by resource attributes (`process.pid`, `process.executable.*`).

Usage: ebpf_profiler_shape.py HOST:PORT REQUEST_JSON
REQUEST_JSON: {"service": ..., "binary": path, "build_id": hex, "htlhash": hex,
"segment": [start, limit, offset], "stacks": [[[address, ...] leaf first, value], ...],
"python": [function, file, line]} with the Python frame, when given, at each stack's root.
Prints the export response as JSON.
"""

import json
import sys
import time

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as service,
    profiles_service_pb2_grpc as service_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2 as common
from opentelemetry.proto.profiles.v1development import profiles_pb2 as profiles
from opentelemetry.proto.resource.v1 import resource_pb2 as resource


def build_request(spec):
    strings = [""]
    index = {"": 0}

    def string(text):
        if text not in index:
            index[text] = len(strings)
            strings.append(text)
        return index[text]

    d = profiles.ProfilesDictionary()
    d.mapping_table.add()  # [0]: no mapping
    d.function_table.add()  # [0]: unknown function
    d.location_table.add()
    d.attribute_table.add()
    d.stack_table.add()

    def attribute(key, value):
        d.attribute_table.add(key_strindex=string(key),
                              value=common.AnyValue(string_value=value))
        return len(d.attribute_table) - 1

    native = attribute("profile.frame.type", "native")
    start, limit, offset = spec["segment"]
    d.mapping_table.add(
        memory_start=start, memory_limit=limit, file_offset=offset,
        filename_strindex=string(spec["binary"]),
        attribute_indices=[
            attribute("process.executable.build_id.htlhash", spec["htlhash"]),
            attribute("process.executable.build_id.gnu", spec["build_id"]),
        ])
    locations = {}

    def native_location(address):
        if address not in locations:
            d.location_table.add(mapping_index=1, address=address,
                                 attribute_indices=[native])
            locations[address] = len(d.location_table) - 1
        return locations[address]

    root = []
    if spec.get("python"):
        function, file, line = spec["python"]
        d.function_table.add(name_strindex=string(function),
                             system_name_strindex=string(function),
                             filename_strindex=string(file))
        d.location_table.add(
            lines=[profiles.Line(function_index=len(d.function_table) - 1, line=line)],
            attribute_indices=[attribute("profile.frame.type", "cpython")])
        root = [len(d.location_table) - 1]

    now = time.time_ns()
    profile = profiles.Profile(
        sample_type=profiles.ValueType(type_strindex=string("samples"),
                                       unit_strindex=string("count")),
        period_type=profiles.ValueType(type_strindex=string("cpu"),
                                       unit_strindex=string("nanoseconds")),
        period=50_000_000,
        time_unix_nano=now - 5_000_000_000,
        duration_nano=5_000_000_000,
        profile_id=bytes(range(16)),
    )
    thread = attribute("thread.name", "kiln-otlp-ebpf")
    for addresses, value in spec["stacks"]:
        d.stack_table.add(
            location_indices=[native_location(a) for a in addresses] + root)
        profile.samples.add(stack_index=len(d.stack_table) - 1,
                            attribute_indices=[thread], values=[value])
    d.string_table.extend(strings)

    request = service.ExportProfilesServiceRequest(dictionary=d)
    rp = request.resource_profiles.add()
    name = spec["binary"].rsplit("/", 1)[-1]
    rp.resource.CopyFrom(resource.Resource(attributes=[
        common.KeyValue(key="service.name", value=common.AnyValue(string_value=spec["service"])),
        common.KeyValue(key="process.pid", value=common.AnyValue(int_value=4343)),
        common.KeyValue(key="process.executable.name", value=common.AnyValue(string_value=name)),
        common.KeyValue(key="process.executable.path",
                        value=common.AnyValue(string_value=spec["binary"])),
    ]))
    sp = rp.scope_profiles.add()
    sp.scope.name = "go.opentelemetry.io/ebpf-profiler"
    sp.profiles.append(profile)
    return request


def main():
    address, spec = sys.argv[1], json.loads(sys.argv[2])
    with grpc.insecure_channel(address) as channel:
        stub = service_grpc.ProfilesServiceStub(channel)
        response = stub.Export(build_request(spec), timeout=30)
    print(json_format.MessageToJson(response))


if __name__ == "__main__":
    main()
