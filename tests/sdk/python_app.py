"""A small Python program profiled by the real pyroscope-io SDK, pushing to Kiln.

Usage: python_app.py SERVER_URL SECONDS. It burns CPU in `kiln_python_hot_loop` so the
test can find that function in the stored flame graph.
"""
import sys
import time

import pyroscope


def kiln_python_hot_loop(deadline):
    total = 0
    while time.time() < deadline:
        for i in range(10_000):
            total += i * i
    return total


def main():
    server, seconds = sys.argv[1], float(sys.argv[2])
    pyroscope.configure(
        application_name="kiln-python-e2e",
        server_address=server,
        sample_rate=100,
        tags={"sdk": "python"},
    )
    kiln_python_hot_loop(time.time() + seconds)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
