#!/usr/bin/env bash
# Checks the Debian packages that scripts/package.sh built in target/debian/
# (the architectures in $ROZD_DEB_ARCHES, default "amd64 arm64", as there;
# amd64 is required):
#
#  1. control data of every package: fields, conffiles, maintainer scripts
#     (shell syntax, user creation, systemd enable/start, purge);
#  2. file lists: paths, owners and modes; the packaged unit is
#     systemd/rozd.service and the packaged config validates (`rozd check`);
#  3. the amd64 package installed into a throwaway root with
#     `dpkg --root=DIR --force-script-chrootless`: dpkg runs the real
#     maintainer scripts, which honour $DPKG_ROOT, so the user, groups,
#     ownership and the unit's enablement symlink land in DIR. Then a
#     reinstall (the edited conffile survives), remove and purge. The host's
#     account files and /etc/systemd are checked to be untouched;
#  4. each binary is an ELF of its architecture linking only libc/libm/
#     libgcc_s, and each (arm64 under qemu-aarch64-static, armhf under
#     qemu-arm-static) serves a real session (scripts/smoke_session.py + the
#     Python client tests/python/session_client.py).
#
# What this cannot show: systemd starting the unit (PID 1 here is not
# systemd; `systemd-analyze verify`/`security` in tests/integration/systemd_unit.rs check
# the unit), and real GPIO/serial devices.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

out=target/debian
arches=${ROZD_DEB_ARCHES:-amd64 arm64}
failures=0

die() {
  echo "package-test: FAIL: $*" >&2
  exit 1
}
ok() { echo "  ok: $*"; }
quiet() { "$@" >/dev/null; }
# check DESCRIPTION COMMAND...: runs COMMAND, records a failure if it fails.
check() {
  local what=$1
  shift
  if "$@"; then
    ok "$what"
  else
    echo "  FAIL: $what" >&2
    failures=$((failures + 1))
  fi
}

[[ " $arches " == *" amd64 "* ]] || die "ROZD_DEB_ARCHES ($arches) must include amd64: the dpkg --root test installs it"
# Per architecture: the ELF class/endianness bytes and e_machine, and how to
# run the binary here (qemu-user with the cross libc as its sysroot).
elf_expect() {
  case "$1" in
    amd64) echo "02 01|3e 00|x86-64" ;;
    arm64) echo "02 01|b7 00|64-bit little-endian AArch64" ;;
    armhf) echo "01 01|28 00|32-bit little-endian ARM" ;;
    *) die "unsupported architecture '$1'" ;;
  esac
}
runner() {
  case "$1" in
    amd64) echo "" ;;
    arm64) echo "qemu-aarch64-static -L /usr/aarch64-linux-gnu" ;;
    armhf) echo "qemu-arm-static -L /usr/arm-linux-gnueabihf" ;;
  esac
}
for tool in dpkg dpkg-deb python3 od readelf; do
  command -v "$tool" >/dev/null || die "$tool not found (apt packages dpkg-dev, binutils)"
done
for arch in $arches; do
  elf_expect "$arch" >/dev/null
  read -r qemu _ sysroot <<<"$(runner "$arch")"
  if [ -n "${qemu:-}" ]; then
    command -v "$qemu" >/dev/null || die "$qemu not found (apt package qemu-user-static; scripts/package.sh installs it)"
    [ -d "$sysroot/lib" ] || die "$sysroot/lib missing (the $arch cross libc; scripts/package.sh installs it)"
  fi
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || die "cannot read the version from Cargo.toml"
find_deb() {
  local arch=$1 debs
  debs=("$out"/rozd_"$version"-*_"$arch".deb)
  [ -f "${debs[0]}" ] || die "no $out/rozd_${version}-*_$arch.deb: run ./scripts/package.sh first"
  [ "${#debs[@]}" -eq 1 ] || die "several $arch packages of $version in $out: ${debs[*]}"
  echo "${debs[0]}"
}
declare -A debs
for arch in $arches; do
  debs[$arch]=$(find_deb "$arch")
done

work=$(mktemp -d /tmp/rozd-package-test.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# ------------------------------------------------------------ 1. control data
check_control() {
  local deb=$1 arch=$2 ctl="$work/control-$2"
  echo "== $deb: control data"
  dpkg-deb --control "$deb" "$ctl"
  check "Package: rozd" [ "$(dpkg-deb -f "$deb" Package)" = rozd ]
  check "Version: $version-1" [ "$(dpkg-deb -f "$deb" Version)" = "$version-1" ]
  check "Architecture: $arch" [ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ]
  local depends
  depends=$(dpkg-deb -f "$deb" Depends)
  check "Depends: libc6 (>= 2.34), libgcc-s1, passwd" [ "$depends" = "libc6 (>= 2.34), libgcc-s1, passwd" ]
  check "Recommends: ca-certificates" [ "$(dpkg-deb -f "$deb" Recommends)" = ca-certificates ]
  check "conffiles are exactly /etc/rozd/rozd.toml and /etc/rozd/AGENTS.md" \
    [ "$(sort "$ctl/conffiles")" = "$(printf '%s\n' /etc/rozd/AGENTS.md /etc/rozd/rozd.toml)" ]
  for script in postinst prerm postrm; do
    check "$script exists, is executable, and parses (sh -n)" \
      bash -c '[ -x "$1" ] && sh -n "$1"' _ "$ctl/$script"
  done
  check "postinst creates the system user rozd (nologin, home /var/lib/rozd)" \
    grep -q 'useradd --system --gid rozd --home-dir /var/lib/rozd --no-create-home' "$ctl/postinst"
  check "postinst adds rozd to dialout and gpio" grep -q 'for g in dialout gpio' "$ctl/postinst"
  check "postinst enables rozd.service" grep -q 'deb-systemd-helper enable rozd.service' "$ctl/postinst"
  check "postinst starts rozd.service (restarts it on upgrade)" \
    grep -q 'deb-systemd-invoke $_dh_action rozd.service' "$ctl/postinst"
  check "user creation comes before the unit is started" \
    bash -c '[ "$(grep -n "useradd" "$1" | head -n1 | cut -d: -f1)" -lt "$(grep -n "deb-systemd-invoke" "$1" | head -n1 | cut -d: -f1)" ]' _ "$ctl/postinst"
  check "prerm stops rozd.service" grep -q 'deb-systemd-invoke stop rozd.service' "$ctl/prerm"
  check "postrm purge removes data, config, user" \
    bash -c 'grep -q "rm -rf \"\$ROOT/var/lib/rozd\" \"\$ROOT/etc/rozd\"" "$1" && grep -q "shadow userdel rozd" "$1"' _ "$ctl/postrm"
  check "postrm purges the unit's enablement state" grep -q 'deb-systemd-helper purge rozd.service' "$ctl/postrm"
}
for arch in $arches; do
  check_control "${debs[$arch]}" "$arch"
done
for arch in $arches; do
  [ "$arch" = amd64 ] && continue
  check "$arch and amd64 packages carry identical maintainer scripts" \
    diff -r "$work/control-amd64" "$work/control-$arch" --exclude=control --exclude=md5sums
done

# ------------------------------------------------------------ 2. file lists
# "mode owner/group path" for every regular file and directory in a package.
listing() {
  dpkg-deb --contents "$1" |
    awk '{ o = $2; if (o == "0/0") o = "root/root"; p = $6; for (i = 7; i <= NF; i++) p = p " " $i; print $1, o, p }' |
    sort -k3
}
check_files() {
  local deb=$1 arch=$2 list="$work/list-$2"
  echo "== $deb: files"
  listing "$deb" >"$list"
  expect() {
    check "$1 $2 $3" grep -qxF -e "$1 $2 $3" "$list"
  }
  expect -rwxr-xr-x root/root ./usr/bin/rozd
  expect -rw-r----- root/root ./etc/rozd/rozd.toml
  expect -rw-r--r-- root/root ./usr/lib/systemd/system/rozd.service
  expect -rw-r--r-- root/root ./usr/share/doc/rozd/README.md
  expect -rw-r--r-- root/root ./usr/share/doc/rozd/examples/rozd.toml
  expect -rw-r--r-- root/root ./usr/share/doc/rozd/copyright
  check "every file and directory is owned by root/root" \
    bash -c '! awk "\$2 != \"root/root\"" "$1" | grep -q .' _ "$list"
  check "nothing is setuid/setgid or world-writable" \
    bash -c '! awk "{ print \$1 }" "$1" | grep -q "[sS]\|^-.......w\|^d.......w"' _ "$list"
  mkdir -p "$work/x-$arch"
  dpkg-deb --extract "$deb" "$work/x-$arch"
  check "the packaged unit is systemd/rozd.service" \
    cmp -s systemd/rozd.service "$work/x-$arch/usr/lib/systemd/system/rozd.service"
  check "the packaged config is packaging/deb/rozd.toml" \
    cmp -s packaging/deb/rozd.toml "$work/x-$arch/etc/rozd/rozd.toml"
}
for arch in $arches; do
  check_files "${debs[$arch]}" "$arch"
done
for arch in $arches; do
  [ "$arch" = amd64 ] && continue
  check "$arch and amd64 packages install the same paths with the same modes" \
    diff <(awk '{ print $1, $3 }' "$work/list-amd64") <(awk '{ print $1, $3 }' "$work/list-$arch")
done

# ------------------------------------------------------------ 4a. binaries
# e_ident: "\x7fELF", class (1 = 32-bit, 2 = 64-bit), data (1 = little
# endian); e_machine at offset 18: 0x3e x86-64, 0xb7 AArch64, 0x28 ARM.
elf_header() {
  od -An -tx1 -N20 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'
}
echo "== binaries"
for arch in $arches; do
  bin="$work/x-$arch/usr/bin/rozd"
  how=$(runner "$arch")
  IFS='|' read -r ident machine name <<<"$(elf_expect "$arch")"
  header=$(elf_header "$bin")
  check "$arch /usr/bin/rozd is a $name ELF ($header)" \
    bash -c '[[ "$1" == "7f 45 4c 46 $2 "* && "$1" == *" $3" ]]' _ "$header" "$ident" "$machine"
  if command -v file >/dev/null; then
    echo "  file: $(file -b "$bin")"
  fi
  # The package's Depends (libc6 >= 2.34, libgcc-s1) must cover what the
  # binary links: a new shared library or a newer glibc symbol fails here.
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
  check "$arch links only libc, libm, libgcc_s, ld.so ($needed)" \
    bash -c '! tr " " "\n" <<<"$1" | grep -v "^$" | grep -vqx "libc.so.6\|libm.so.6\|libgcc_s.so.1\|ld-linux-x86-64.so.2\|ld-linux-aarch64.so.1\|ld-linux-armhf.so.3"' _ "$needed"
  glibc=$(readelf -V "$bin" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -n1)
  check "$arch needs glibc symbols up to 2.34 ($glibc)" \
    bash -c '[ "${1#GLIBC_2.}" -le 34 ]' _ "$glibc"
  # shellcheck disable=SC2086 # $how is the qemu command line, or nothing
  check "$arch binary validates the packaged config (rozd check${how:+ under qemu})" \
    quiet $how "$bin" check --config "$work/x-$arch/etc/rozd/rozd.toml"
  # shellcheck disable=SC2086
  check "$arch binary reports version $version" \
    bash -c '"$@" --version | grep -qF "$0"' "$version" $how "$bin"
done

# ------------------------------------------------------------ 3. throwaway root
deb_amd64=${debs[amd64]}
echo "== $deb_amd64: dpkg --root install, reinstall, remove, purge"
root="$work/root"
mkdir -p "$root/etc" "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/usr/sbin"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
# A minimal Debian account database; gpio is absent, as on plain Debian.
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
dialout:x:20:
nogroup:x:65534:
EOF
printf 'root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' >"$root/etc/shadow"
printf 'root:*::\ndialout:*::\nnogroup:*::\n' >"$root/etc/gshadow"
chmod 0640 "$root/etc/shadow" "$root/etc/gshadow"
# policy-rc.d 101 = "do not start services": deb-systemd-invoke reads it from
# $DPKG_ROOT, so nothing is started on this host.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"

host_state() {
  sha256sum /etc/passwd /etc/group /etc/shadow /etc/gshadow 2>/dev/null
  find /etc/systemd/system -maxdepth 2 -name 'rozd*' 2>/dev/null
  [ -e /usr/bin/rozd ] && echo "/usr/bin/rozd exists"
  [ -e /var/lib/rozd ] && echo "/var/lib/rozd exists"
  true
}
host_before=$(host_state)

dpkg_root() {
  # --force-depends: the throwaway root has no libc6/passwd packages (the
  # host's tools run the scripts). --force-script-chrootless: run the
  # maintainer scripts on the host with DPKG_ROOT=$root instead of chroot.
  dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@"
}
field() { awk -F: -v n="$2" '$1 == n' "$root/etc/$1"; }
owner_mode() { stat -c '%u:%g %a' "$1"; }

dpkg_root --install "$deb_amd64" >"$work/dpkg-install.log" 2>&1 || {
  cat "$work/dpkg-install.log" >&2
  die "dpkg --root --install failed"
}
check "dpkg status: install ok installed" \
  bash -c 'dpkg --root="$1" -s rozd | grep -qx "Status: install ok installed"' _ "$root"
check "dpkg records /etc/rozd/rozd.toml as a conffile" \
  bash -c 'dpkg --root="$1" -s rozd | grep -q "^ /etc/rozd/rozd.toml [0-9a-f]\{32\}$"' _ "$root"
rozd_user=$(field passwd rozd)
uid=$(cut -d: -f3 <<<"$rozd_user")
gid=$(field group rozd | cut -d: -f3)
echo "  passwd: $rozd_user"
check "user rozd: system uid, group rozd, home /var/lib/rozd, shell nologin" \
  bash -c '[[ "$1" =~ ^rozd:x:([0-9]+):$2:[^:]*:/var/lib/rozd:/usr/sbin/nologin$ ]] && ((BASH_REMATCH[1] < 1000 && BASH_REMATCH[1] > 0))' _ "$rozd_user" "$gid"
check "rozd has a shadow entry" grep -q '^rozd:' "$root/etc/shadow"
check "group gpio was created (system gid)" \
  bash -c 'g=$(awk -F: "\$1 == \"gpio\" { print \$3 }" "$1/etc/group"); [ -n "$g" ] && [ "$g" -lt 1000 ]' _ "$root"
check "rozd is a member of dialout" bash -c 'awk -F: "\$1 == \"dialout\"" "$1/etc/group" | grep -q ":rozd$\|:rozd,\|,rozd,\|,rozd$"' _ "$root"
check "rozd is a member of gpio" bash -c 'awk -F: "\$1 == \"gpio\"" "$1/etc/group" | grep -q ":rozd$\|:rozd,\|,rozd,\|,rozd$"' _ "$root"
check "/var/lib/rozd is rozd:rozd 750" [ "$(owner_mode "$root/var/lib/rozd")" = "$uid:$gid 750" ]
check "/etc/rozd is root:rozd 750" [ "$(owner_mode "$root/etc/rozd")" = "0:$gid 750" ]
check "/etc/rozd/rozd.toml is root:rozd 640" [ "$(owner_mode "$root/etc/rozd/rozd.toml")" = "0:$gid 640" ]
check "/usr/bin/rozd is root:root 755" [ "$(owner_mode "$root/usr/bin/rozd")" = "0:0 755" ]
wants="$root/etc/systemd/system/multi-user.target.wants/rozd.service"
check "rozd.service is enabled (multi-user.target.wants symlink)" \
  bash -c '[ -L "$1" ] && [ "$(readlink "$1")" = /usr/lib/systemd/system/rozd.service ]' _ "$wants"
check "the installed config validates (rozd check)" \
  quiet "$root/usr/bin/rozd" check --config "$root/etc/rozd/rozd.toml"

# Upgrade path: an edited conffile survives a reinstall, ownership is kept.
echo '# local edit by package-test' >>"$root/etc/rozd/rozd.toml"
dpkg_root --install "$deb_amd64" >"$work/dpkg-reinstall.log" 2>&1 || {
  cat "$work/dpkg-reinstall.log" >&2
  die "dpkg --root reinstall failed"
}
check "reinstall keeps the edited /etc/rozd/rozd.toml" \
  grep -qx '# local edit by package-test' "$root/etc/rozd/rozd.toml"
check "reinstall keeps the user (same uid)" [ "$(field passwd rozd | cut -d: -f3)" = "$uid" ]
check "reinstall adds no duplicate group membership" \
  bash -c '[ "$(grep -o "rozd" <<<"$(awk -F: "\$1 == \"gpio\" { print \$4 }" "$1/etc/group")" | wc -l)" = 1 ]' _ "$root"
check "/etc/rozd/rozd.toml still root:rozd 640" [ "$(owner_mode "$root/etc/rozd/rozd.toml")" = "0:$gid 640" ]

# Data and secrets an operator adds, which purge must remove.
echo 'session data' >"$root/var/lib/rozd/rozd.db"
echo 'ANTHROPIC_API_KEY=test' >"$root/etc/rozd/env"

dpkg_root --remove rozd >"$work/dpkg-remove.log" 2>&1 || {
  cat "$work/dpkg-remove.log" >&2
  die "dpkg --root --remove failed"
}
check "remove: /usr/bin/rozd and the unit are gone" \
  bash -c '[ ! -e "$1/usr/bin/rozd" ] && [ ! -e "$1/usr/lib/systemd/system/rozd.service" ]' _ "$root"
check "remove: configuration, data and user are kept" \
  bash -c '[ -f "$1/etc/rozd/rozd.toml" ] && [ -f "$1/var/lib/rozd/rozd.db" ] && grep -q "^rozd:" "$1/etc/passwd"' _ "$root"
check "remove: dpkg status config-files" \
  bash -c 'dpkg --root="$1" -s rozd | grep -qx "Status: deinstall ok config-files"' _ "$root"

dpkg_root --purge rozd >"$work/dpkg-purge.log" 2>&1 || {
  cat "$work/dpkg-purge.log" >&2
  die "dpkg --root --purge failed"
}
check "purge: /etc/rozd (config, env file) is gone" [ ! -e "$root/etc/rozd" ]
check "purge: /var/lib/rozd (data) is gone" [ ! -e "$root/var/lib/rozd" ]
check "purge: user and group rozd are gone" \
  bash -c '! grep -q "^rozd:" "$1/etc/passwd" "$1/etc/group" "$1/etc/shadow" "$1/etc/gshadow"' _ "$root"
check "purge: group gpio is kept, without rozd" \
  bash -c 'awk -F: "\$1 == \"gpio\"" "$1/etc/group" | grep -q "^gpio:x:[0-9]*:$"' _ "$root"
check "purge: no rozd unit symlinks or masks left" \
  bash -c '! find "$1/etc/systemd" -name "rozd*" 2>/dev/null | grep -q .' _ "$root"
check "purge: dpkg no longer knows rozd" bash -c '! dpkg --root="$1" -s rozd >/dev/null 2>&1' _ "$root"
check "the host's accounts, /etc/systemd/system, /usr/bin and /var/lib are untouched" \
  [ "$(host_state)" = "$host_before" ]

# ------------------------------------------------------------ 4b. a real session
venv=${ROZD_TEST_PYENV:-$repo/target/pyenv}
if ! "$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "== installing grpcio and grpcio-tools into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check grpcio grpcio-tools
fi
for arch in $arches; do
  how=$(runner "$arch")
  echo "== $arch binary${how:+ under ${how%% *}}: a real session"
  smoke_start=$SECONDS
  # shellcheck disable=SC2086 # $how is the qemu command line, or nothing
  check "$arch rozd serves a session with a client tool round trip${how:+ (${how%% *})}" \
    python3 scripts/smoke_session.py --python "$venv/bin/python" --expect-version "$version" \
    --config "$work/x-$arch/etc/rozd/rozd.toml" -- $how "$work/x-$arch/usr/bin/rozd"
  echo "  ($arch session: $((SECONDS - smoke_start)) s)"
done

if ((failures)); then
  die "$failures check(s) failed"
fi
echo "== package-test: all checks passed (${debs[*]})"
