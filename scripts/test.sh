#!/usr/bin/env bash
# Runs every rozd test on a fresh Debian/Ubuntu machine: installs what the
# tests need (apt packages, Python grpcio for the independent client), then
# checks formatting and lints and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=()
command -v systemd-analyze >/dev/null || apt_packages+=(systemd)
command -v socat >/dev/null || apt_packages+=(socat)
command -v mosquitto >/dev/null || apt_packages+=(mosquitto mosquitto-clients)
if ((${#apt_packages[@]})); then
  echo "== installing ${apt_packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

# An independent gRPC client in Python, generated from proto/ by the tests.
venv=target/pyenv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "== installing grpcio and grpcio-tools into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check grpcio grpcio-tools
fi
export ROZD_TEST_PYTHON="$PWD/$venv/bin/python"

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
cargo test --locked
