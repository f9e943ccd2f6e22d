#!/usr/bin/env bash
# Builds the rozd Debian packages (release profile) for amd64 and arm64 into
# target/debian/, on a fresh Debian/Ubuntu amd64 machine: installs the cross
# toolchain, qemu-user-static (used by scripts/package-test.sh), the rustup
# target and cargo-deb when they are missing.
#
#   ./scripts/package.sh                 # amd64 and arm64
#   ROZD_DEB_ARCHES=arm64 ./scripts/package.sh
#   ROZD_DEB_ARCHES="amd64 arm64 armhf" ./scripts/package.sh   # + 32-bit Pi OS
#
# Output: target/debian/rozd_<version>-1_<arch>.deb (older rozd_*_<arch>.deb
# of the architectures built are removed first).
set -euo pipefail
cd "$(dirname "$0")/.."

arches=${ROZD_DEB_ARCHES:-amd64 arm64}
out=target/debian
cargo_deb_version=3.8.0

die() {
  echo "package.sh: $*" >&2
  exit 1
}

# Debian arch -> Rust target triple, cross C compiler (for rusqlite's bundled
# SQLite and ring), and the apt packages providing it and the target's
# headers (the kernel's among them: bindgen reads linux/videodev2.h for the
# v4l crate's bindings).
rust_target() {
  case "$1" in
    amd64) echo x86_64-unknown-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu ;;
    armhf) echo armv7-unknown-linux-gnueabihf ;;
    *) die "unsupported architecture '$1' (amd64, arm64, armhf)" ;;
  esac
}
cross_gcc() {
  case "$1" in
    amd64) echo "" ;;
    arm64) echo aarch64-linux-gnu-gcc ;;
    armhf) echo arm-linux-gnueabihf-gcc ;;
  esac
}
cross_apt() {
  case "$1" in
    amd64) echo "" ;;
    arm64) echo "gcc-aarch64-linux-gnu libc6-dev-arm64-cross linux-libc-dev-arm64-cross" ;;
    armhf) echo "gcc-arm-linux-gnueabihf libc6-dev-armhf-cross linux-libc-dev-armhf-cross" ;;
  esac
}

[ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] ||
  die "this script builds on an amd64 Debian/Ubuntu machine (dpkg reports '$(dpkg --print-architecture 2>/dev/null || echo none)')"

# ---------------------------------------------------------------- prerequisites
# libclang: bindgen generates the v4l crate's V4L2 bindings at build time.
wanted=(dpkg-dev qemu-user-static libclang-dev)
for arch in $arches; do
  rust_target "$arch" >/dev/null
  # shellcheck disable=SC2207 # space-separated package names
  wanted+=($(cross_apt "$arch"))
done
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

installed_targets=$(rustup target list --installed)
for arch in $arches; do
  target=$(rust_target "$arch")
  if ! grep -qx "$target" <<<"$installed_targets"; then
    echo "== rustup target add $target"
    rustup target add "$target" || die "rustup target add $target failed"
  fi
done

if ! cargo deb --version >/dev/null 2>&1; then
  echo "== cargo install cargo-deb $cargo_deb_version"
  cargo install --locked --version "$cargo_deb_version" cargo-deb || die "cargo install cargo-deb failed"
fi

# ---------------------------------------------------------------- build
mkdir -p "$out"
for arch in $arches; do
  rm -f "$out"/rozd_*_"$arch".deb
done
for arch in $arches; do
  target=$(rust_target "$arch")
  gcc=$(cross_gcc "$arch")
  echo "== cargo deb for $arch ($target, release profile)"
  start=$SECONDS
  if [ -n "$gcc" ]; then
    command -v "$gcc" >/dev/null || die "$gcc not found (apt package: $(cross_apt "$arch"))"
    # cc-rs (SQLite, ring) compiles with CC_<target>; rustc links with the
    # same cross gcc. Only this process sees these settings.
    target_env=${target//-/_}
    export "CC_${target_env}=$gcc"
    export "CARGO_TARGET_${target_env^^}_LINKER=$gcc"
    # bindgen (libclang, told the target) reads the target's headers from
    # the cross sysroot, not the build machine's /usr/include.
    export "BINDGEN_EXTRA_CLANG_ARGS_${target_env}=-isystem /usr/${gcc%-gcc}/include"
  fi
  if [ "$arch" = amd64 ]; then
    # The native build: target/release, shared with `cargo run --release`.
    target_args=()
  else
    target_args=(--target "$target")
  fi
  cargo deb --locked "${target_args[@]}" --output "$out/" ||
    die "cargo deb for $arch ($target) failed; see the output above"
  echo "== $arch built in $((SECONDS - start)) s"
done

echo "== packages"
found=0
for arch in $arches; do
  for deb in "$out"/rozd_*_"$arch".deb; do
    [ -f "$deb" ] || die "no $arch package in $out after the build"
    ls -l "$deb"
    found=$((found + 1))
  done
done
[ "$found" -gt 0 ] || die "no packages built"
