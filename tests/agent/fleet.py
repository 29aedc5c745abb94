# A Python service's mix of work for `kiln bench agent --storage` (docs/benchmarks.md):
# parsing and writing JSON, regular expressions, hashing, compression, sorting, decimal
# arithmetic and text diffs, in turn, until killed. Many functions and many stacks, as a
# real program has, not one hot loop: what storage per core-day depends on.
import collections
import decimal
import difflib
import hashlib
import json
import random
import re
import zlib

WORDS = [f"w{i}" for i in range(500)]


def handle_json(rng):
    doc = {"id": rng.randrange(1 << 30), "items": [{"k": rng.choice(WORDS), "v": rng.random()} for _ in range(50)]}
    return len(json.loads(json.dumps(doc))["items"])


def handle_regex(rng):
    text = " ".join(rng.choice(WORDS) for _ in range(300))
    return len(re.findall(r"w(\d+)7\b", text))


def handle_hash(rng):
    data = bytes(rng.randrange(256) for _ in range(4096))
    return hashlib.sha256(data).digest()[0] + zlib.crc32(zlib.compress(data, 6)) % 7


def handle_sort(rng):
    counts = collections.Counter(rng.choice(WORDS) for _ in range(2000))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][1]


def handle_decimal(rng):
    total = decimal.Decimal(0)
    for _ in range(300):
        total += decimal.Decimal(rng.randrange(10**6)) / decimal.Decimal(997)
    return int(total) % 10


def handle_diff(rng):
    a = [rng.choice(WORDS) for _ in range(200)]
    b = list(a)
    for _ in range(20):
        b[rng.randrange(len(b))] = rng.choice(WORDS)
    return sum(1 for _ in difflib.unified_diff(a, b))


def serve():
    rng = random.Random(7)
    handlers = [handle_json, handle_regex, handle_hash, handle_sort, handle_decimal, handle_diff]
    sink = 0
    while True:
        sink += rng.choice(handlers)(rng)


serve()
