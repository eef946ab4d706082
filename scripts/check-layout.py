#!/usr/bin/env python3
"""Checks the source layout rules of lockcore and the drivers (one concept per file).

* A file is one concept, and its length follows the concept. A file in `lockcore/src` or
  `driver-*/src` with more than MAX_CODE_LINES lines of non-test code (test modules,
  `#[cfg(test)] mod x { ... }` blocks and files that are only compiled for tests do not
  count) must be named in docs/layout.md's "Long files" section, with the one concept it
  is; a long file that is not named there is split by concept, not by size.
* docs/layout.md names every file of those crates, and no file that is gone.
* Every driver has the common files of docs/layout.md ("The common layout of a driver"):
  lib.rs, config.rs, backend.rs, store.rs, wait.rs, renew.rs, error.rs, each for the same
  role, unless COMMON_EXEMPT says why a driver has no such file.
* No import circle between the files of one crate: file A uses an item defined in file B
  (through `use crate::…`, `use super::…`, a path in code, or a name re-exported at the crate
  root) and B, directly or through others, uses A. `mod x;` declarations and `pub use`
  re-exports are declarations, not uses, and make no edge.

It also prints each crate's size: lines of non-test code without comments or blank
lines, the store's own files (`.sql`, `.lua`) under `src/` included.

Usage: scripts/check-layout.py [CRATE_DIR…]   (default: lockcore and every driver-*)
Exit status 1 with one line per violation, 0 otherwise.
"""

import os
import re
import sys

MAX_CODE_LINES = 600

# The files every driver has, for the same role in each (docs/layout.md).
COMMON_FILES = ["lib.rs", "config.rs", "backend.rs", "store.rs", "wait.rs", "renew.rs", "error.rs"]

# A driver without one of the common files, with the reason. Keep this list short.
COMMON_EXEMPT = {
    ("driver-redlock", "error.rs"):
        "its requests are driver-redis's scripts, whose errors driver-redis's error.rs maps",
}

# Mutual references accepted, with the reason. Keep this list short.
ALLOWED_CIRCLES = {
    frozenset({"lockcore/src/error.rs", "lockcore/src/key.rs"}):
        "LockError names the key it is about, and validating a key returns a LockError: "
        "a type-level reference between the contract's two vocabulary types, not a call cycle",
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments(text):
    """Removes comments and string literals (so paths in docs or messages make no edge)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
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
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] + "   "):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cut_test_blocks(code):
    """Removes `#[cfg(test)]` items whose body is a braced block (test modules, helpers)."""
    out, i = [], 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?(mod|fn|impl)\b[^{;]*\{")
    while True:
        m = pattern.search(code, i)
        if not m:
            out.append(code[i:])
            break
        out.append(code[i:m.start()])
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        out.append("\n" * code.count("\n", m.start(), j))
        i = j
    return "".join(out)


def code_lines(raw):
    """Lines of non-test code: everything before the first `#[cfg(test)] mod … {` block."""
    lines = raw.split("\n")
    for k, line in enumerate(lines):
        if line.startswith("#[cfg(test)]") and k + 1 < len(lines) and re.match(r"(pub(\(crate\))? )?mod \w+ \{", lines[k + 1]):
            return k
    return len(lines)


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path tuple -> file path
        self.test_only = set()
        self.load(("crate",), os.path.join(src, "lib.rs"), False)

    def load(self, module, path, test_only):
        self.files[module] = path
        if test_only:
            self.test_only.add(module)
        text = strip_comments(open(path, encoding="utf-8").read())
        base = os.path.dirname(path) if path.endswith(("lib.rs", "mod.rs")) else path[:-3]
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            attrs, name = m.group(1), m.group(2)
            path_attr = re.search(r'#\[path\s*=', attrs)
            child_test = test_only or "cfg(test)" in attrs
            candidates = [os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")]
            found = next((c for c in candidates if os.path.exists(c)), None)
            if found and not path_attr:
                self.load(module + (name,), found, child_test)

    def resolve(self, module, path):
        """The module (file) that defines what `path` (a list of segments) names."""
        segs = list(path)
        if not segs:
            return None
        if segs[0] == "crate":
            cur = ("crate",)
            segs = segs[1:]
        elif segs[0] in ("super", "self"):
            cur = module
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    cur = cur[:-1]
                segs = segs[1:]
        else:
            return None
        while segs and cur + (segs[0],) in self.files:
            cur = cur + (segs[0],)
            segs = segs[1:]
        if segs and cur in self.reexports:
            target = self.reexports[cur].get(segs[0])
            if target is not None:
                return target
        return cur

    def build_reexports(self):
        """Names a module file re-exports with `pub use child::{…}`: name -> defining module."""
        self.reexports = {}
        for module, path in self.files.items():
            text = strip_comments(open(path, encoding="utf-8").read())
            names = {}
            for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
                for full in expand_use(m.group(1)):
                    segs = full.split("::")
                    alias = segs[-1]
                    if " as " in alias:
                        segs[-1], alias = [x.strip() for x in alias.split(" as ")]
                    if segs[0] not in ("crate", "self", "super"):
                        segs = ["self"] + segs
                    names[alias] = (module, segs)
            self.reexports[module] = names
        # Resolve the targets (a re-export of a re-export resolves to the definition).
        resolved = {}
        for module, names in self.reexports.items():
            resolved[module] = {}
            for alias, (mod, segs) in names.items():
                cur = mod if segs[0] == "self" else None
                segs2 = segs[1:] if segs[0] == "self" else segs
                if cur is None:
                    target = self.resolve_plain(mod, segs2)
                else:
                    target = self.walk(cur, segs2)
                if target is not None and target in self.files:
                    resolved[module][alias] = target
        self.reexports = resolved

    def walk(self, cur, segs):
        while segs and cur + (segs[0],) in self.files:
            cur = cur + (segs[0],)
            segs = segs[1:]
        return cur if cur in self.files else None

    def resolve_plain(self, module, segs):
        if segs[0] == "crate":
            return self.walk(("crate",), segs[1:])
        cur = module
        while segs and segs[0] == "super":
            cur, segs = cur[:-1], segs[1:]
        return self.walk(cur, segs)

    def edges(self):
        self.build_reexports()
        graph = {}
        for module, path in self.files.items():
            if module in self.test_only:
                continue
            text = cut_test_blocks(strip_comments(open(path, encoding="utf-8").read()))
            deps = set()
            # `use` statements (not `pub use` re-exports).
            for m in re.finditer(r"(?<![\w:])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
                if m.group(1) and "crate" not in m.group(1):
                    continue  # a public re-export
                for full in expand_use(m.group(2)):
                    segs = [s.split(" as ")[0].strip() for s in full.split("::")]
                    if segs[0] in ("crate", "super", "self"):
                        target = self.resolve(module, segs)
                        if target and target != module and target in self.files:
                            deps.add(target)
            # Paths in code: crate::a::b, super::x.
            body = re.sub(r"(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text)
            for m in re.finditer(r"(?<![\w:])((?:crate|super)(?:::" + IDENT + r")+)", body):
                target = self.resolve(module, m.group(1).split("::"))
                if target and target != module and target in self.files:
                    deps.add(target)
            # A module's own children it declares are not uses.
            graph[module] = {d for d in deps if d not in self.test_only}
        return graph


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []

    def rec(prefix, t):
        t = t.strip()
        if not t:
            return
        k = t.find("{")
        if k < 0:
            out.append((prefix + t).replace(" ", "") if " as " not in t else prefix + t)
            return
        head = t[:k].strip()
        inner = t[k + 1:t.rfind("}")]
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        for p in parts:
            if p.strip() == "self":
                out.append((prefix + head).rstrip(":"))
            elif p.strip():
                rec(prefix + head, p)

    rec("", tree)
    return out


def cycles(graph):
    """Strongly connected components with more than one file."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                comps.append(comp)

    for v in list(graph):
        if v not in index:
            strong(v)
    return comps


def layout_doc():
    """The files docs/layout.md lists: {crate_dir: {path relative to src}}."""
    listed, crate = {}, None
    for line in open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8"):
        m = re.match(r"^([\w-]+)/src/\s*$", line)
        if m:
            crate = m.group(1)
            listed.setdefault(crate, set())
            continue
        m = re.match(r"^  (\S+\.rs)\s", line)
        if m and crate:
            listed[crate].add(m.group(1))
        elif line.startswith("```"):
            crate = None if not line.strip("`\n") else crate
    return listed


def long_files_doc():
    """The files docs/layout.md's "Long files" section names: {path from the repository root}."""
    named, inside = set(), False
    for line in open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8"):
        if line.startswith("## "):
            inside = line.strip() == "## Long files"
            continue
        m = re.match(r"^\| `([^`]+\.rs)` \|", line)
        if inside and m:
            named.add(m.group(1))
    return named


def store_code_lines(path):
    """Lines of a `.sql` or `.lua` file that are neither blank nor comments."""
    n = 0
    for line in open(path, encoding="utf-8"):
        t = line.strip()
        if t and not t.startswith("--"):
            n += 1
    return n


def size(crate_dir, crate):
    """Non-test code lines of a crate without comments or blank lines, store files included."""
    n = 0
    for module, path in crate.files.items():
        if module in crate.test_only:
            continue
        raw = open(path, encoding="utf-8").read()
        # Line comments and doc comments out; the text of string literals (SQL, Lua kept in
        # Rust strings) counts.
        code = cut_test_blocks(raw).split("\n")[: code_lines(raw)]
        n += sum(1 for line in code if line.strip() and not line.strip().startswith("//"))
    for root, _, names in os.walk(os.path.join(ROOT, crate_dir, "src")):
        for name in names:
            if name.endswith((".sql", ".lua")):
                n += store_code_lines(os.path.join(root, name))
    return n


def main(args):
    crates = args or sorted(
        d for d in os.listdir(ROOT) if d == "lockcore" or d.startswith("driver-")
    )
    problems = []
    listed = layout_doc()
    long_named = long_files_doc()
    sizes = []
    for crate_dir in crates:
        src = os.path.join(ROOT, crate_dir, "src")
        crate = Crate(src)
        files = {os.path.relpath(p, src) for p in crate.files.values()}
        if crate_dir.startswith("driver-"):
            for common in COMMON_FILES:
                if common not in files and (crate_dir, common) not in COMMON_EXEMPT:
                    problems.append(
                        f"{crate_dir}/src/{common} is missing: every driver has the common files "
                        f"of docs/layout.md, each for the same role"
                    )
        for missing in sorted(files - listed.get(crate_dir, set())):
            problems.append(f"docs/layout.md does not list {crate_dir}/src/{missing}")
        for stale in sorted(listed.get(crate_dir, set()) - files):
            problems.append(f"docs/layout.md lists {crate_dir}/src/{stale}, which is not a module of the crate")
        for module, path in sorted(crate.files.items()):
            if module in crate.test_only:
                continue
            raw = open(path, encoding="utf-8").read()
            n = code_lines(raw)
            rel = os.path.relpath(path, ROOT)
            if n > MAX_CODE_LINES and rel not in long_named:
                problems.append(
                    f"{rel}: {n} lines of non-test code: a file this long must be one concept, "
                    f"named with that concept under \"Long files\" in docs/layout.md; otherwise "
                    f"split it by concept (not by size)"
                )
        for rel in sorted(n for n in long_named if n.startswith(crate_dir + "/")):
            path = os.path.join(ROOT, rel)
            if not os.path.exists(path):
                problems.append(f"docs/layout.md names {rel} as a long file, and it is gone")
            elif code_lines(open(path, encoding="utf-8").read()) <= MAX_CODE_LINES:
                problems.append(f"docs/layout.md names {rel} as a long file, and it is not (at most {MAX_CODE_LINES} lines): take it off the list")
        sizes.append(f"{crate_dir} {size(crate_dir, crate)}")
        graph = crate.edges()
        for comp in cycles(graph):
            names = sorted(os.path.relpath(crate.files[m], ROOT) for m in comp)
            if frozenset(names) in ALLOWED_CIRCLES:
                continue
            detail = "; ".join(
                f"{os.path.relpath(crate.files[a], src)} uses {', '.join(sorted(os.path.relpath(crate.files[b], src) for b in graph[a] if b in comp))}"
                for a in sorted(comp)
            )
            problems.append(f"import circle between {', '.join(names)} ({detail})")
    print("non-test code lines, comments and blank lines excluded, .sql and .lua included:")
    for line in sizes:
        print(f"    {line}")
    for p in problems:
        print(p)
    if not problems:
        print(f"layout ok: {', '.join(crates)} (the drivers' common files, every file over {MAX_CODE_LINES} lines of non-test code named with its concept, no import circles)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
