"""A small Python program profiled by the real pyroscope-io SDK, pushing to Kiln.

Usage: python_app.py SERVER_URL SECONDS. With KILN_TENANT and KILN_TOKEN in the
environment it sends them as the SDK's `tenant_id` and basic auth (user name = tenant,
password = token), as a Grafana Cloud-style setup would. It burns CPU in `kiln_python_hot_loop` so the
test can find that function in the stored flame graph.
"""
import os
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
        tenant_id=os.environ.get("KILN_TENANT", ""),
        basic_auth_username=os.environ.get("KILN_TENANT", ""),
        basic_auth_password=os.environ.get("KILN_TOKEN", ""),
    )
    kiln_python_hot_loop(time.time() + seconds)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
