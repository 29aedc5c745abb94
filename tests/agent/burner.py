# Kiln's Python burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time in
# two named functions (the same work, one picked at random, 7 times in 10: no period for
# the sampling to fall in step with), called from a named main, for argv[1] seconds. With
# "compress", a function spends its time in zlib (a C extension); with "sleep", it sleeps
# in kiln_sleepy (off the CPU); with "many", it calls kiln_f_0 … kiln_f_9999 in turn.
import random
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


def kiln_sleepy():
    time.sleep(0.02)


def kiln_many():
    source = "".join(
        f"def kiln_f_{i}(n):\n    return sum(range(n))\n" for i in range(10000)
    )
    names = {}
    exec(compile(source, "kiln_many.py", "exec"), names)
    return [names[f"kiln_f_{i}"] for i in range(10000)]


def kiln_main(seconds, mode):
    end = time.monotonic() + seconds
    data = bytes(range(256)) * 4096
    many = kiln_many() if mode == "many" else []
    while time.monotonic() < end:
        if mode == "many":
            for function in many:
                function(200)
        elif mode == "compress":
            kiln_compress(data)
        elif mode == "sleep":
            kiln_sleepy()
        else:
            if random.random() < 0.7:
                kiln_hot_a(1000)
            else:
                kiln_hot_b(1000)


if __name__ == "__main__":
    kiln_main(float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "plain")
