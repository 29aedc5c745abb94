"""Kiln's MCP evaluation (docs/mcp.md): ten scripted investigations on planted data, as a
model would run them with Kiln's tools, each with the size of its answers in tokens
(characters / 4) and whether the planted cause is in them; and, for comparison, the size
of a DOT graph of the same profile (what Grafana's MCP server's "fetch profile" returns:
`go tool pprof -dot`, 100 nodes).

    evaluate.py KILN_BINARY [CORPUS_DIR] [--quick]

Starts its own `kiln server` on a free port (a temporary data directory, the regression
watcher on short windows), plants the data over the HTTP API, drives `kiln mcp` over
stdio with the official MCP SDK, prints a Markdown table and a JSON line, and stops the
server. With --quick, the Go corpus and the DOT comparison are left out.
"""

import asyncio
import gzip
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, content_type="text/plain"):
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def get(url):
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def wobble(index, salt):
    return (index * 7919 + salt * 104729) % 23 - 11


def checkout_profile(index, slow):
    text = (f"main;handle;parse {300 + 3 * wobble(index, 1)}\n"
            f"main;handle;render {200 + 2 * wobble(index, 2)}\n"
            f"main;gc {100 + wobble(index, 3)}\n")
    if slow:
        text += f"main;handle;slow_path {60 + wobble(index, 4)}\n"
    return text


def ingest(base, service, tags, start, body, seconds=10, rate=100, fmt="folded"):
    name = service + ".cpu" + (("{" + tags + "}") if tags else "")
    url = (f"{base}/ingest?name={urllib.parse.quote(name)}&format={fmt}&sampleRate={rate}"
           f"&from={start}&until={start + seconds}")
    post(url, body.encode() if isinstance(body, str) else body,
         "application/octet-stream" if fmt == "pprof" else "text/plain")


def plant(base, now, corpus):
    """The planted causes, and what each investigation must find."""
    # checkout: 1.1 adds slow_path (the regression), deployed 25 minutes ago.
    v1, v2 = now - 1800, now - 1500
    for i in range(20):
        ingest(base, "checkout", "version=1.0", v1 + i * 10, checkout_profile(i, False))
        ingest(base, "checkout", "version=1.1", v2 + i * 10, checkout_profile(i, True))
    # cart: its CPU steps from 100 to 250 samples a minute 40 minutes ago.
    step = now - 2400
    for t in range(now - 7200, now - 60, 60):
        level = 250 if t >= step else 100
        ingest(base, "cart", "", t, f"main;serve;price {level + wobble(t // 60, 5)}\nmain;serve;tax 20\n", seconds=60)
    # payments: the same work for two hours, noise only.
    for t in range(now - 7200, now - 60, 120):
        i = t // 120
        ingest(base, "payments", "", t, f"main;charge;sign {200 + wobble(i, 6)}\nmain;charge;verify {100 + wobble(i, 7)}\n", seconds=120)
    # search: three times the CPU in the last hour as in the hour before (cart, stepping
    # up 40 minutes ago, grows less over the hour).
    for t in range(now - 7200, now - 60, 300):
        level = 600 if t >= now - 3600 else 200
        ingest(base, "search", "", t, f"main;query;score {level}\n", seconds=300)
    go = None
    if corpus:
        go = open(os.path.join(corpus, "pprof-large.cpu.pb.gz"), "rb").read()
        ingest(base, "gocorpus", "", now - 600, go, fmt="pprof")
    return {"v1": v1, "v2": v2, "step": step, "go": go}


def investigations(now, planted, go_top):
    v1, v2 = planted["v1"], planted["v2"]
    step = planted["step"]

    def change_point_near(texts):
        for line in "\n".join(texts).splitlines():
            if line.startswith("largest change point: at "):
                stamp = line.split("at ", 1)[1].split(",")[0]
                at = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
                return abs(at - step) <= 600
        return False

    cases = [
        ("What uses the most CPU in checkout?",
         [("top_functions", {"service": "checkout"})],
         lambda texts: "\n1 | parse |" in texts[0]),
        ("What regressed after checkout's last deploy?",
         [("list_regressions", {"service": "checkout"})],
         lambda texts: "| slow_path |" in texts[0] and "1.0 → 1.1" in texts[0]),
        ("Is slow_path's growth in 1.1 real, or noise?",
         [("compare", {"service": "checkout",
                       "left": {"selector": '{version="1.0"}', "from": str(v1 * 1000), "until": str(v2 * 1000)},
                       "right": {"selector": '{version="1.1"}', "from": str(v2 * 1000), "until": str(now * 1000)}})],
         lambda texts: any(l.startswith("1 | slow_path |") and l.endswith("| yes") for l in texts[0].splitlines())),
        ("Who calls slow_path?",
         [("flame_graph", {"service": "checkout", "focus": "slow_path"})],
         lambda texts: "slow_path → handle → main" in texts[0]),
        ("Since when does cart use more CPU?",
         [("list_services", {"from": "now-2h"}), ("series", {"service": "cart", "from": "now-2h", "points": 24})],
         change_point_near),
        ("Which service changed most in the last hour?",
         [("list_services", {})],
         # New services (no profiles in the hour before) are listed first, as new.
         lambda texts: next(l for l in texts[0].splitlines()[2:] if "| new |" not in l).startswith("search |")),
        ("Did payments change between the last two hours?",
         [("compare", {"service": "payments"})],
         lambda texts: "\n0 of " in texts[0] and "changed significantly" in texts[0]),
        ("What does checkout's worst profile look like?",
         [("get_profile", {"service": "checkout"})],
         lambda texts: "slow_path |" in texts[0] and "version=1.1" in texts[0]),
        ("Which versions of checkout run, and how hot is each?",
         [("list_labels", {"service": "checkout", "name": "version"}),
          ("compare", {"service": "checkout",
                       "left": {"selector": '{version="1.0"}', "from": str(v1 * 1000), "until": str(v2 * 1000)},
                       "right": {"selector": '{version="1.1"}', "from": str(v2 * 1000), "until": str(now * 1000)}})],
         lambda texts: "1.0 |" in texts[0] and "1.1 |" in texts[0] and "profiles" in texts[1]),
    ]
    if go_top:
        cases.append(("Where does the Go program spend its CPU?",
                      [("top_functions", {"service": "gocorpus"}), ("flame_graph", {"service": "gocorpus"})],
                      lambda texts: f"| {go_top} |" in texts[0]))
    return cases


def go_pprof(args, data):
    with tempfile.NamedTemporaryFile(suffix=".pb.gz") as f:
        f.write(data)
        f.flush()
        env = dict(os.environ, GOTOOLCHAIN="local")
        return subprocess.run(["go", "tool", "pprof", *args, f.name], capture_output=True, env=env, check=True).stdout.decode()


async def run(binary, base, cases):
    params = StdioServerParameters(command=binary, args=["mcp", "--url", base])
    results = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for question, calls, found in cases:
                texts = []
                for name, arguments in calls:
                    got = await session.call_tool(name, arguments)
                    texts.append("\n".join(c.text for c in got.content if c.type == "text"))
                tokens = sum(math.ceil(len(t) / 4) for t in texts)
                if not found(texts):
                    print(f"not found for {question!r}:\n" + "\n".join(texts), file=sys.stderr)
                results.append({"question": question, "calls": [n for n, _ in calls],
                                "tokens": tokens, "found": bool(found(texts))})
    return results


def main():
    binary = sys.argv[1]
    rest = [a for a in sys.argv[2:] if not a.startswith("--")]
    corpus = None if "--quick" in sys.argv else (rest[0] if rest else None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        config = os.path.join(data, "kiln.yaml")
        with open(config, "w") as f:
            f.write("regressions: { interval_ms: 200, window_ms: 120000, lookback_ms: 7200000, min_profiles: 10 }\n")
        server = subprocess.Popen([binary, "server", "--config", config, "--listen", f"127.0.0.1:{port}",
                                   "--data-dir", os.path.join(data, "d")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    get(f"{base}/ready")
                    break
                except Exception:
                    time.sleep(0.1)
            now = int(time.time())
            planted = plant(base, now, corpus)
            # The watcher's finding for checkout 1.1.
            for _ in range(300):
                if json.loads(get(f"{base}/api/v1/regressions?since=now-1h"))["regressions"]:
                    break
                time.sleep(0.2)
            go_top, dots = None, []
            if planted["go"]:
                go_top = go_pprof(["-top", "-nodecount=1"], planted["go"]).strip().splitlines()[-1].split()[-1]
            for service in ["checkout"] + (["gocorpus"] if planted["go"] else []):
                if corpus is None:
                    break
                query = urllib.parse.quote(f'{CPU}{{service_name="{service}"}}')
                merged = get(f"{base}/pyroscope/render?query={query}&from=0&until=now&format=pprof")
                dot = go_pprof(["-dot", "-nodecount=100"], merged)
                whole = go_pprof(["-dot", "-nodecount=1000000", "-nodefraction=0", "-edgefraction=0"], merged)
                dots.append({"service": service, "tokens": math.ceil(len(dot) / 4),
                             "every_node_tokens": math.ceil(len(whole) / 4)})
            results = asyncio.run(run(binary, base, investigations(now, planted, go_top)))
        finally:
            server.terminate()
            server.wait()
    print("| # | question | tool calls | answer tokens | planted cause found |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(results, 1):
        print(f"| {i} | {r['question']} | {' → '.join(r['calls'])} | {r['tokens']} | {'yes' if r['found'] else 'NO'} |")
    for dot in dots:
        print(f"\nDOT graph of {dot['service']}'s merged profile: {dot['tokens']} tokens at 100 nodes"
              f" (go tool pprof -dot -nodecount=100), {dot['every_node_tokens']} with every node")
    print(json.dumps({"results": results, "dots": dots}))


if __name__ == "__main__":
    main()
