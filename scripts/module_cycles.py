#!/usr/bin/env python3
"""Lists the module edges of rozd's library under src/ and prints import cycles.

A node is one file module (`src/fleet/config.rs` is `fleet::config`,
`src/fleet/mod.rs` is `fleet`), found by following `mod x;` from
`src/lib.rs`. An edge A -> B means code of A names B: a `use` of
`crate::...`, `super::...`, `self::...` or a child module, or such a path
written inline. A path ends at the longest module it names
(`crate::hw::config::MqttConfig` is an edge to `hw::config`).

Left out, and said so in the output:
- `#[cfg(test)]` items (unit tests may use the whole crate);
- the crate root `src/lib.rs` unless `--with-root`: it declares every
  module and holds `HostContext`, so every module that names
  `crate::VERSION` or `crate::HostContext` would close a circle through it.

Usage: scripts/module_cycles.py [--edges] [--with-root] [--tests] [SRC_DIR]
Exit status 1 when a cycle runs through a `config` module, else 0.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Blanks comments, string and char literals (keeps line structure)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or (c == "'" and re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])):
            j = text.find("'", i + 2) + 1
            out.append("' '")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_items(text):
    """Removes every item under `#[cfg(test)]` (a block or one statement)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        j = m.end()
        # the item ends at its matching closing brace, or at `;` if none opens first
        depth = 0
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif text[j] == ";" and depth == 0:
                j += 1
                break
            j += 1
        text = text[:m.start()] + "\n" * text.count("\n", m.start(), j) + text[j:]


def module_tree(src):
    """{module path: file} following `mod x;` from lib.rs."""
    modules = {}

    def visit(path, file, folder):
        modules[path] = file
        code = strip_comments_and_strings(open(file, encoding="utf-8").read())
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code, re.M):
            name = m.group(1)
            for candidate, sub in ((os.path.join(folder, name + ".rs"), os.path.join(folder, name)),
                                   (os.path.join(folder, name, "mod.rs"), os.path.join(folder, name))):
                if os.path.exists(candidate):
                    visit(path + (name,), candidate, sub)
                    break

    visit((), os.path.join(src, "lib.rs"), src)
    return modules


def use_paths(code):
    """Expands every `use` tree into full paths (lists of segments)."""
    paths = []

    def expand(prefix, tree):
        tree = tree.strip()
        if not tree:
            return
        if tree.startswith("{"):
            depth, start = 0, 1
            for k, ch in enumerate(tree):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if (ch == "," and depth == 1) or (ch == "}" and depth == 0):
                    expand(prefix, tree[start:k])
                    start = k + 1
            return
        head, sep, rest = tree.partition("::")
        head = head.split(" as ")[0].strip()
        if sep and rest.strip():
            expand(prefix + [head], rest)
        else:
            paths.append(prefix + [head])

    for m in re.finditer(r"\buse\s+([^;]*);", code, re.S):
        expand([], re.sub(r"\s+", " ", m.group(1)))
    return paths


def inline_paths(code):
    code = re.sub(r"\buse\s+[^;]*;", lambda m: "\n" * m.group(0).count("\n"), code, flags=re.S)
    return [m.group(0).split("::") for m in re.finditer(r"\b" + IDENT + r"(?:::" + IDENT + r")+", code)]


def resolve(modules, here, is_dir_module, segments):
    """The module a path names from module `here`, or None (external crate)."""
    segs = [s.strip() for s in segments if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif here + (segs[0],) in modules:
        base = here  # a child module named without `self::`
    else:
        return None
    target = base
    for s in segs:
        if target + (s,) in modules:
            target = target + (s,)
        else:
            break
    return target


def edges(src, with_tests):
    modules = module_tree(src)
    out = {m: set() for m in modules}
    for mod, file in modules.items():
        code = strip_comments_and_strings(open(file, encoding="utf-8").read())
        if not with_tests:
            code = strip_test_items(code)
        is_dir = file.endswith("mod.rs") or file.endswith("lib.rs")
        for segs in use_paths(code) + inline_paths(code):
            target = resolve(modules, mod, is_dir, segs)
            if target is not None and target != mod:
                out[mod].add(target)
    return out


def name(m):
    return "::".join(m) or "crate"


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


def shortest_cycle(graph, start, allowed):
    """A shortest cycle from `start` back to it inside `allowed`."""
    prev, frontier, seen = {}, [start], {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in allowed and w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return None


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    rest = [a for a in argv if not a.startswith("--")]
    src = rest[0] if rest else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    graph = edges(src, "--tests" in flags)
    if "--with-root" not in flags:
        graph = {m: {t for t in ts if t != ()} for m, ts in graph.items() if m != ()}
    if "--edges" in flags:
        for m in sorted(graph):
            for t in sorted(graph[m]):
                print(f"{name(m)} -> {name(t)}")
    print(f"{len(graph)} modules, {sum(len(t) for t in graph.values())} edges"
          f" ({'with' if '--tests' in flags else 'without'} #[cfg(test)] items,"
          f" {'with' if '--with-root' in flags else 'without'} the crate root)")
    through_config = False
    comps = cycles(graph)
    if not comps:
        print("no cycles")
    for comp in comps:
        members = set(comp)
        print(f"cycle of {len(comp)} modules: {', '.join(name(m) for m in comp)}")
        for m in comp:
            if m[:1] == ("config",):
                through_config = True
                c = shortest_cycle(graph, m, members)
                if c:
                    print(f"  through {name(m)}: {' -> '.join(name(x) for x in c)}")
    print("a cycle runs through config" if through_config else "no cycle runs through config")
    return 1 if through_config else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
