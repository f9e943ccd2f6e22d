#!/usr/bin/env python3
"""Writes link/<target>.order: the functions rozd runs while it starts, idles
and stops, for the linker to put first and together in .text (build.rs).

Why: an idle daemon's resident memory is mostly its own code pages, and the
kernel maps a binary's pages 64 KiB around each fault. Start-up touches
functions from every crate, spread over the whole 16 MiB of .text, so most
of it ends up resident although start-up runs about 2 MiB of it. Linked
together, those functions take a few contiguous pages (BENCHMARKS.md,
"Start-up code together").

How: builds the release binary with the linker's map (ROZD_LINK_MAP), runs it
on the built-in host under callgrind (every executed instruction's address),
lets it idle, stops it with SIGTERM, and lists every .text input section
that ran, in their present order; the same for the bench's build of the
binary. Then builds the release binary again, linked with the new order.

The order lists section names as linker-script patterns: the parts of a name
that change with unrelated code are `*` (see `generalised`), so the order
survives most changes. Functions renamed or added since it was written are
linked in the usual place: re-run this after large changes (the bench's idle
RSS shows when it is due).

The Pi's build (aarch64-unknown-linux-gnu) cannot run under callgrind here:
`--target aarch64-unknown-linux-gnu` lists the functions of its build whose
names, demangled without their hashes, are those of the x86_64 build's
sections the x86_64 order selects (the same code runs at start-up on both;
the hashes differ by target). Run it after the x86_64 order.

Usage: scripts/text_order.py [--idle SECONDS]   (needs valgrind)
       scripts/text_order.py --target aarch64-unknown-linux-gnu   (needs aarch64-linux-gnu-gcc)
"""

import argparse
import bisect
import fnmatch
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET_DIR = ROOT / os.environ.get("CARGO_TARGET_DIR", "target")
TARGET = "x86_64-unknown-linux-gnu"
CROSS_TARGET = "aarch64-unknown-linux-gnu"
CROSS_GCC = "aarch64-linux-gnu-gcc"
READY = "serving gRPC and REST"
# What thin LTO appends to the name of a local function it exports from its
# module: a hash of that module's code.
LTO_SUFFIX = re.compile(r"\.llvm\.\d+$")


# The binaries whose functions the order lists. Both leave target/release/rozd.
# The bench's is built with the dev-dependencies' features (tokio's test-util,
# serde_json's float_roundtrip), so its symbols have other names than the
# shipped build's: listed too, so that the bench measures what ships.
BUILDS = {
    "release": ["cargo", "build", "--locked", "--release", "--bin", "rozd"],
    "bench": ["cargo", "bench", "--locked", "--bench", "rozd", "--no-run"],
}


def build(command, env_extra):
    env = dict(os.environ, **env_extra)
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def builtin_config(directory):
    text = (ROOT / "src/config/builtin.toml").read_text()
    listen = 'listen = "127.0.0.1:8080"'
    if listen not in text:
        sys.exit(f"src/config/builtin.toml has no `{listen}` to move to port 0")
    text = text.replace(listen, 'listen = "127.0.0.1:0"')
    text += f'\n[store]\npath = "{directory / "rozd.db"}"\n'
    path = directory / "rozd.toml"
    path.write_text(text)
    return path


def run_under_callgrind(binary, config, out, idle):
    """Start, wait for READY in the log, idle, SIGTERM: as the bench measures."""
    log = out.with_suffix(".log")
    with open(log, "w") as log_file:
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=yes",
                f"--callgrind-out-file={out}",
                str(binary),
                "run",
                "--config",
                str(config),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while READY not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"rozd did not become ready under valgrind; see {log}")
            time.sleep(0.5)
        time.sleep(idle)
        process.send_signal(signal.SIGTERM)
        if process.wait(timeout=300) != 0:
            sys.exit(f"rozd under valgrind exited {process.returncode}; see {log}")


def executed_addresses(callgrind_out, binary):
    """Addresses of executed instructions in `binary` (callgrind, --dump-instr=yes).

    Cost lines start with the instruction's address: absolute (0x...), relative
    to the previous one (+n, -n) or the same (*); the object is named by ob=/cob=
    lines, and a call's cost line (after calls=) belongs to the caller."""
    objects = {}
    current_object = None
    in_binary = False
    address = 0
    addresses = set()
    name = str(binary)
    for line in open(callgrind_out):
        line = line.rstrip("\n")
        match = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if match:
            kind, number, path = match.groups()
            if path:
                objects[number] = path
            if kind == "ob":
                current_object = number
                in_binary = objects.get(current_object) == name
            continue
        if not line or not (line[0] in "0123456789+-*"):
            continue
        first = line.split()[0]
        if first.startswith("0x"):
            address = int(first, 16)
        elif first[0] in "+-":
            address += int(first)
        elif first != "*":
            continue
        if in_binary:
            addresses.add(address)
    return addresses


def text_sections(map_file):
    """(start, size, section name, first symbol) of each code input section,
    from lld's map.

    Its lines: VMA, LMA, size, alignment, then the name indented by what it
    is: an output section (0), an input section (8, `file:(section)`), a
    symbol (16)."""
    line_format = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+ (.*)$")
    sections = []
    in_text = False
    for line in open(map_file):
        match = line_format.match(line.rstrip("\n"))
        if not match:
            continue
        start, size, name = match.groups()
        depth = len(name) - len(name.lstrip(" "))
        if depth == 0:
            in_text = name == ".text"
        elif in_text and depth == 8:
            section = name.strip()
            if section.endswith(")") and ":(" in section:
                section = section[section.rindex(":(") + 2 : -1]
            sections.append([int(start, 16), int(size, 16), section, None])
        elif in_text and depth == 16 and sections and sections[-1][3] is None:
            # Not AArch64's mapping symbols ($x: code follows, $d: data).
            if not name.strip().startswith("$"):
                sections[-1][3] = name.strip()
    sections = [tuple(section) for section in sections if section[3] and section[1]]
    if not sections:
        sys.exit(f"no .text input sections in {map_file}: was the binary linked by lld?")
    return sections


def generalised(section):
    """A section name as a pattern that still matches after unrelated changes.

    - `.llvm.<n>` ends the name of a function thin LTO exported from its
      module: n is a hash of that module's code, which any change to the
      module changes.
    - `Cs<base62>_` in a v0-mangled name is a crate's disambiguator, a hash of
      its cargo metadata (features, profile, toolchain): the bench's build and
      the release build differ in it.
    Sections named `.text` alone (assembly without a section per function)
    would match every object's: None."""
    if not section.startswith(".text."):
        return None
    section = LTO_SUFFIX.sub(".llvm.*", section)
    if "._R" in section:
        section = re.sub(r"Cs[0-9A-Za-z]*_(?=\d)", "Cs*_", section)
    return section


def selected(sections, patterns):
    """The sections a list of the order's patterns selects (as the linker does)."""
    matcher = re.compile("|".join(fnmatch.translate(p) for p in patterns))
    return [section for section in sections if matcher.match(section[2])]


def functions_run(command, directory, idle):
    """Section names of the functions the binary `command` builds runs."""
    map_file = directory / "rozd.map"
    build(command, {"ROZD_LINK_MAP": str(map_file)})
    binary = (TARGET_DIR / "release/rozd").resolve()
    callgrind_out = directory / "callgrind.out"
    run_under_callgrind(binary, builtin_config(directory), callgrind_out, idle)
    addresses = sorted(executed_addresses(callgrind_out, binary))
    sections = text_sections(map_file)
    ran = []
    for start, size, section, _ in sections:
        at = bisect.bisect_left(addresses, start)
        if at < len(addresses) and addresses[at] < start + size:
            ran.append((size, section))
    total = sum(section[1] for section in sections)
    print(
        f"{' '.join(command)}: {len(ran)} of {len(sections)} .text sections ran, "
        f"{sum(size for size, _ in ran) / 2**20:.2f} of {total / 2**20:.2f} MiB"
    )
    return [section for _, section in ran]


def demangled(names):
    """Each name demangled without hashes and thin LTO's `.llvm.<n>` (c++filt;
    Rust's legacy and v0 names)."""
    text = "".join(f"{LTO_SUFFIX.sub('', name)}\n" for name in names)
    output = subprocess.run(
        ["c++filt", "--no-verbose"], input=text, capture_output=True, text=True, check=True
    ).stdout
    return output.splitlines()


def cross_order():
    """The Pi build's functions whose hash-free names are those of the x86_64
    build's functions the x86_64 order selects."""
    patterns = (ROOT / "link" / f"{TARGET}.order").read_text().split()
    with tempfile.TemporaryDirectory(prefix="text-order-native-") as scratch:
        map_file = pathlib.Path(scratch) / "rozd.map"
        build(BUILDS["release"], {"ROZD_LINK_MAP": str(map_file)})
        native = selected(text_sections(map_file), patterns)
    wanted = set(demangled(symbol for _, _, _, symbol in native))
    order = ROOT / "link" / f"{CROSS_TARGET}.order"
    if not order.exists():
        order.write_text("")  # so that this build links with lld, whose map is read
    variable = CROSS_TARGET.replace("-", "_")
    command = ["cargo", "build", "--locked", "--release", "--target", CROSS_TARGET, "--bin", "rozd"]
    cross = {f"CC_{variable}": CROSS_GCC, f"CARGO_TARGET_{variable.upper()}_LINKER": CROSS_GCC}
    with tempfile.TemporaryDirectory(prefix="text-order-cross-") as scratch:
        map_file = pathlib.Path(scratch) / "rozd.map"
        build(command, dict(cross, ROZD_LINK_MAP=str(map_file)))
        sections = text_sections(map_file)
    names = demangled(symbol for _, _, _, symbol in sections)
    ran = [section for section, name in zip(sections, names) if name in wanted]
    print(
        f"{CROSS_TARGET}: {len(ran)} of {len(sections)} .text sections named like the "
        f"{len(native)} the {TARGET} order selects, {sum(s[1] for s in ran) / 2**20:.2f} MiB"
    )
    write_order(order, (section for _, _, section, _ in ran))
    build(command, cross)
    print(f"wrote {order.relative_to(ROOT)}; {TARGET_DIR / CROSS_TARGET / 'release/rozd'} is linked with it")


def write_order(path, sections):
    patterns = dict.fromkeys(p for p in map(generalised, sections) if p is not None)
    path.write_text("".join(f"{pattern}\n" for pattern in patterns))
    print(f"{path.relative_to(ROOT)}: {len(patterns)} patterns")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle after READY")
    parser.add_argument("--target", default=TARGET, choices=[TARGET, CROSS_TARGET])
    args = parser.parse_args()
    if args.target == CROSS_TARGET:
        cross_order()
        return
    order = ROOT / "link" / f"{TARGET}.order"
    names = []
    for name, command in BUILDS.items():
        with tempfile.TemporaryDirectory(prefix=f"text-order-{name}-") as scratch:
            names += functions_run(command, pathlib.Path(scratch), args.idle)
    order.parent.mkdir(exist_ok=True)
    write_order(order, names)
    build(BUILDS["release"], {})
    print(f"wrote {order.relative_to(ROOT)}; {TARGET_DIR / 'release/rozd'} is linked with it")


if __name__ == "__main__":
    main()
