# Kiln's Python burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time
# in two named functions, called from a named main, for argv[1] seconds. With
# "compress", a third function spends its time in a C extension (zlib) instead.
import sys
import time
import zlib


def kiln_hot_a(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def kiln_hot_b(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def kiln_compress(data):
    return zlib.compress(data, 9)


def kiln_main(seconds, compress):
    end = time.monotonic() + seconds
    data = bytes(range(256)) * 4096
    while time.monotonic() < end:
        if compress:
            kiln_compress(data)
        else:
            kiln_hot_a(7000)
            kiln_hot_b(3000)


if __name__ == "__main__":
    kiln_main(float(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "compress")
