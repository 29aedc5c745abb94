#!/usr/bin/env python3
"""Writes small, valid JFR recordings as seeds for the `jfr_parse` fuzz target.

A JDK recording is 100 KB or more, almost all of it metadata for event types Kiln never
reads, so libFuzzer spends its time copying bytes it cannot change usefully. These
recordings follow the same chunk format (docs: the JDK's jdk.jfr.internal reader and
Kiln's own kiln-model/src/jfr.rs) with only the types the reader uses: a metadata event,
checkpoint events holding the constant pools (threads, stack traces, methods, classes,
symbols), and CPU, allocation and lock events. Both integer encodings (compressed varints
and fixed big-endian) and a two-chunk file with chained checkpoints are written.

Usage: jfr_seeds.py OUTPUT_DIR
"""

import struct
import sys
from pathlib import Path

# Type ids, as the metadata declares them.
LONG, INT, BOOLEAN, STRING = 1, 2, 3, 4
THREAD, CLASS, SYMBOL, METHOD, FRAME, STACK = 20, 21, 22, 23, 24, 25
EXECUTION_SAMPLE, ALLOCATION_SAMPLE, MONITOR_ENTER, THREAD_PARK = 101, 102, 103, 104

# (id, name, [(field, type, pooled, array)])
TYPES = [
    (LONG, "long", []),
    (INT, "int", []),
    (BOOLEAN, "boolean", []),
    (STRING, "java.lang.String", []),
    (THREAD, "java.lang.Thread", [("javaName", STRING, False, False), ("javaThreadId", LONG, False, False)]),
    (SYMBOL, "jdk.types.Symbol", [("string", STRING, False, False)]),
    (CLASS, "java.lang.Class", [("name", SYMBOL, True, False), ("modifiers", INT, False, False)]),
    (METHOD, "jdk.types.Method", [
        ("type", CLASS, True, False),
        ("name", SYMBOL, True, False),
        ("descriptor", SYMBOL, True, False),
        ("hidden", BOOLEAN, False, False),
    ]),
    (FRAME, "jdk.types.StackFrame", [
        ("method", METHOD, True, False),
        ("lineNumber", INT, False, False),
        ("bytecodeIndex", INT, False, False),
    ]),
    (STACK, "jdk.types.StackTrace", [("truncated", BOOLEAN, False, False), ("frames", FRAME, False, True)]),
    (EXECUTION_SAMPLE, "jdk.ExecutionSample", [
        ("startTime", LONG, False, False),
        ("sampledThread", THREAD, True, False),
        ("stackTrace", STACK, True, False),
        ("contextId", LONG, False, False),
    ]),
    (ALLOCATION_SAMPLE, "jdk.ObjectAllocationSample", [
        ("startTime", LONG, False, False),
        ("eventThread", THREAD, True, False),
        ("stackTrace", STACK, True, False),
        ("objectClass", CLASS, True, False),
        ("weight", LONG, False, False),
    ]),
    (MONITOR_ENTER, "jdk.JavaMonitorEnter", [
        ("startTime", LONG, False, False),
        ("duration", LONG, False, False),
        ("eventThread", THREAD, True, False),
        ("stackTrace", STACK, True, False),
        ("monitorClass", CLASS, True, False),
    ]),
    (THREAD_PARK, "jdk.ThreadPark", [
        ("startTime", LONG, False, False),
        ("duration", LONG, False, False),
        ("eventThread", THREAD, True, False),
        ("stackTrace", STACK, True, False),
    ]),
]

SYMBOLS = {1: "com/example/Shop", 2: "checkout", 3: "price", 4: "()V", 5: "java/lang/Object", 6: "main"}
CLASSES = {1: 1, 2: 5}  # class key -> symbol key of its name
METHODS = {1: (1, 2), 2: (1, 3), 3: (1, 6)}  # method key -> (class key, name symbol key)
STACKS = {1: [(2, 42), (1, 17), (3, 5)], 2: [(1, 18), (3, 5)]}  # leaf first: (method, line)


def varint(value):
    value &= (1 << 64) - 1
    out = bytearray()
    for _ in range(8):
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value & 0xFF)
    return bytes(out)


class Writer:
    def __init__(self, compressed):
        self.compressed = compressed

    def int(self, value, width):
        if self.compressed:
            return varint(value)
        return value.to_bytes(width, "big", signed=True)

    def size(self, value):
        """An event size: a varint padded to four bytes, or a big-endian i32."""
        if self.compressed:
            return bytes([(value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, ((value >> 14) & 0x7F) | 0x80, (value >> 21) & 0x7F])
        return struct.pack(">i", value)

    def string(self, text):
        data = text.encode()
        return b"\x03" + varint(len(data)) + data

    def event(self, body):
        return self.size(len(body) + 4) + body


def metadata_event(writer):
    strings = []

    def index(text):
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    def element(name, attributes, children):
        out = varint(index(name)) + varint(len(attributes))
        for key, value in attributes:
            out += varint(index(key)) + varint(index(value))
        out += varint(len(children))
        for child in children:
            out += child
        return out

    classes = []
    for type_id, name, fields in TYPES:
        children = []
        for field, field_type, pooled, array in fields:
            attributes = [("name", field), ("class", str(field_type))]
            if pooled:
                attributes.append(("constantPool", "true"))
            if array:
                attributes.append(("dimension", "1"))
            children.append(element("field", attributes, []))
        attributes = [("id", str(type_id)), ("name", name)]
        if type_id > 100:
            attributes.append(("superType", "jdk.jfr.Event"))
        if type_id > 4:
            attributes.append(("simpleType", "false"))
        classes.append(element("class", attributes, children))
    root = element("root", [], [element("metadata", [], classes), element("region", [("gmtOffset", "0")], [])])
    body = varint(0) + varint(0) + varint(0) + varint(1) + varint(len(strings))
    for text in strings:
        body += writer.string(text)
    return writer.event(body + root)


def checkpoint_event(writer, pools, delta):
    body = varint(1) + varint(0) + varint(0) + varint(delta & ((1 << 64) - 1)) + b"\x01" + varint(len(pools))
    for type_id, entries in pools:
        body += varint(type_id) + varint(len(entries))
        for key, value in entries:
            body += varint(key) + value
    return writer.event(body)


def pools(writer):
    symbols = [(key, writer.string(text)) for key, text in SYMBOLS.items()]
    classes = [(key, varint(symbol) + writer.int(1, 4)) for key, symbol in CLASSES.items()]
    methods = [(key, varint(cls) + varint(name) + varint(4) + b"\x00") for key, (cls, name) in METHODS.items()]
    stacks = []
    for key, frames in STACKS.items():
        value = b"\x00" + varint(len(frames))
        for method, line in frames:
            value += varint(method) + writer.int(line, 4) + writer.int(0, 4)
        stacks.append((key, value))
    threads = [(1, writer.string("main") + writer.int(1, 8))]
    return [(SYMBOL, symbols), (CLASS, classes), (METHOD, methods), (STACK, stacks), (THREAD, threads)]


def events(writer):
    out = b""
    for i in range(3):
        out += writer.event(varint(EXECUTION_SAMPLE) + writer.int(1000 + i, 8) + varint(1) + varint(1 + i % 2) + writer.int(0, 8))
    out += writer.event(varint(ALLOCATION_SAMPLE) + writer.int(1100, 8) + varint(1) + varint(2) + varint(2) + writer.int(4096, 8))
    out += writer.event(varint(MONITOR_ENTER) + writer.int(1200, 8) + writer.int(5000, 8) + varint(1) + varint(1) + varint(2))
    out += writer.event(varint(THREAD_PARK) + writer.int(1300, 8) + writer.int(7000, 8) + varint(1) + varint(2))
    # An event type the reader skips.
    out += writer.event(varint(THREAD) + writer.string("skipped") + writer.int(9, 8))
    return out


def chunk(compressed, split_pools=False):
    writer = Writer(compressed)
    body = events(writer)
    all_pools = pools(writer)
    first_offset = None
    if split_pools:
        # Two checkpoints, the newer pointing back at the older by its delta.
        first_offset = 68 + len(body)
        first = checkpoint_event(writer, all_pools[:2], 0)
        body += first
        pool_offset = 68 + len(body)
        body += checkpoint_event(writer, all_pools[2:], first_offset - pool_offset)
    else:
        pool_offset = 68 + len(body)
        body += checkpoint_event(writer, all_pools, 0)
    metadata_offset = 68 + len(body)
    body += metadata_event(writer)
    size = 68 + len(body)
    header = b"FLR\x00" + struct.pack(">HH", 2, 1)
    header += struct.pack(">qqqqqqq", size, pool_offset, metadata_offset, 1_700_000_000_000_000_000, 1_000_000_000, 1000, 1_000_000_000)
    header += struct.pack(">i", 1 if compressed else 0)
    assert len(header) == 68
    return header + body


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "seed-compressed.jfr": chunk(True),
        "seed-fixed.jfr": chunk(False),
        "seed-two-chunks.jfr": chunk(True, split_pools=True) + chunk(False),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)
        print(f"{out / name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
