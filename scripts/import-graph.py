#!/usr/bin/env python3
"""File-level import graph of one Rust crate, and the import circles in it.

    python3 scripts/import-graph.py gpumon-core/src [--split stages] [--edges] [--dot]

Reads every `.rs` file reachable from `lib.rs` (or `main.rs`) through `mod x;` declarations
(`x.rs` or `x/mod.rs`, relative to the declaring module's folder), and collects the paths each
file names: `use` trees (`use crate::a::{b::C, d}`), and paths in code that start with `crate::`,
`super::`, `self::` or a module this file imported. Comments and string literals are skipped, so
an intra-doc link is not an import. Inline modules (`mod tests { use super::*; }`) are followed
so that `super` means what the compiler means.

Each path is resolved to the file that *defines* the item: the walk descends through module
files, and a name that a module only re-exports (`pub use x::Y;`, `pub use x::*;`) is followed to
where it is defined. So `use crate::Snapshot` is an edge to the file that defines `Snapshot`, not
to `lib.rs`. A re-export itself (`pub use …`, any visibility) is the module's facade, not a
dependency: it makes an edge only when the file also names the item outside its `use` items.
`mod x;` declarations are containment, not edges. Every `#[cfg]` branch counts (tests too);
`#[path]` attributes and macro-generated paths are not followed.

Files are grouped into concerns by their top-level module (`model.rs` and `model/*` are
`model`, `lib.rs` is `lib`). A folder named with `--split` (default: `stages`, where it exists)
holds a concern per child module: `stages/diagnose/*` is `stages/diagnose`, `stages/report.rs`
is `stages/report`, and the folder's own `mod.rs` is `stages`. `--group FILE=CONCERN` overrides
one file. Prints each strongly connected component of more than one file, with its concerns;
exits 1 when one spans two concerns (a cycle inside one concern, a module and its own
submodules, is fine) or lies in a concern named with `--acyclic`, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict

# --------------------------------------------------------------------------------------------
# Lexing: strip comments, strings and chars, keeping line structure and braces.
# --------------------------------------------------------------------------------------------


def strip(src: str) -> str:
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 260]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            close = '"' + m.group(1)
            j = src.find(close, i + len(m.group(0)))
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
        elif c == 'b' and src.startswith('b"', i) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a); only literals are dropped.
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", src[i:i + 12])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


# --------------------------------------------------------------------------------------------
# The module tree.
# --------------------------------------------------------------------------------------------


class Module:
    """One module: a file, or an inline `mod x { … }` inside a file."""

    def __init__(self, path: tuple, file: str, parent: "Module | None"):
        self.path = path  # module path from the crate root, e.g. ("stages", "diagnose")
        self.file = file  # the file it lives in (relative to src/)
        self.parent = parent
        self.children: dict[str, Module] = {}
        self.defs: set[str] = set()  # items defined here
        self.uses: list[tuple] = []  # (segments, alias or '*', is_pub, start, end) per use leaf
        self.code_paths: list[list] = []  # segments of each path in code


ITEM = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)"
)
MOD_DECL = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
USE = re.compile(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]*);")
PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:[A-Za-z_][A-Za-z0-9_]*\s*::\s*)+[A-Za-z_*][A-Za-z0-9_]*)")


def split_tree(tree: str, prefix: list) -> list:
    """`a::{b::C, d@e, *}` → [(['a','b','C'], 'C'), (['a','d@e'], 'd@e'), (['a'], '*')]."""
    leaves = []

    def walk(t: str, pre: list):
        if "{" in t:
            head, _, rest = t.partition("{")
            body = rest[: rest.rfind("}")]
            base = pre + [s for s in head.split("::") if s]
            depth, start = 0, 0
            for k, ch in enumerate(body + ","):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                elif ch == "," and depth == 0:
                    part = body[start:k]
                    if part:
                        walk(part, base)
                    start = k + 1
            return
        segs = pre + [s for s in t.split("::") if s]
        if not segs:
            return
        if segs[-1] == "*":
            leaves.append((segs[:-1], "*"))
            return
        if segs[-1] == "self" or segs[-1].startswith("self@"):
            alias = segs[-1][5:] if "@" in segs[-1] else None
            segs = segs[:-1]
            if alias:
                segs = segs[:-1] + [segs[-1] + "@" + alias]
        leaves.append((segs, segs[-1]))

    walk(re.sub(r"\s+", "", tree), prefix)
    return leaves


def parse_use(tree: str) -> list:
    # Handle `as` before whitespace is squeezed: `a::B as C` → marker `a::B@C`.
    tree = re.sub(r"\s+as\s+([A-Za-z_][A-Za-z0-9_]*)", r"@\1", tree)
    out = []
    for segs, alias in split_tree(tree, []):
        if segs and "@" in segs[-1]:
            name, _, al = segs[-1].partition("@")
            segs = segs[:-1] + [name]
            alias = al
        out.append((segs, alias))
    return out


class Crate:
    def __init__(self, src: str):
        self.src = src
        self.files: dict[str, str] = {}  # file → stripped text
        root_file = "lib.rs" if os.path.exists(os.path.join(src, "lib.rs")) else "main.rs"
        self.root = self.load(root_file, (), None, folder="")

    def load(self, file: str, path: tuple, parent, folder: str) -> Module:
        text = strip(open(os.path.join(self.src, file), encoding="utf-8").read())
        self.files[file] = text
        module = Module(path, file, parent)
        self.parse(text, module, folder, file)
        return module

    def child_file(self, folder: str, name: str) -> tuple:
        for cand, sub in ((f"{folder}{name}.rs", f"{folder}{name}/"), (f"{folder}{name}/mod.rs", f"{folder}{name}/")):
            if os.path.exists(os.path.join(self.src, cand)):
                return cand, sub
        return None, None

    def parse(self, text: str, module: Module, folder: str, file: str):
        """Scans `text` (one file), building inline modules as it goes."""
        stack = [(module, -1)]  # (module, brace depth at which it closes)
        depth = 0
        i = 0
        n = len(text)
        while i < n:
            cur = stack[-1][0]
            m = MOD_DECL.match(text, i) if text[i] == "m" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
            if m:
                name, kind = m.group(1), m.group(2)
                if kind == ";":
                    sub_folder = folder + "/".join(cur.path[len(module.path):]) + ("/" if cur is not module else "")
                    child_file, child_folder = self.child_file(sub_folder, name)
                    if child_file:
                        cur.children[name] = self.load(child_file, cur.path + (name,), cur, child_folder)
                    i = m.end()
                    continue
                child = Module(cur.path + (name,), file, cur)
                cur.children[name] = child
                cur.defs.add(name)
                depth += 1
                stack.append((child, depth))
                i = m.end()
                continue
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                if len(stack) > 1 and stack[-1][1] == depth:
                    stack.pop()
                depth -= 1
            elif c == "u" or c == "p":
                um = USE.match(text, i)
                if um and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                    is_pub = bool(um.group(1))
                    for segs, alias in parse_use(um.group(2)):
                        cur.uses.append((segs, alias, is_pub, um.start(), um.end()))
                    i = um.end()
                    continue
            if c.isalpha() or c == "_":
                if i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_:"):
                    im = ITEM.match(text, i)
                    if im:
                        cur.defs.add(im.group(1))
                    pm = PATH.match(text, i)
                    if pm:
                        segs = [s.strip() for s in pm.group(1).split("::")]
                        cur.code_paths.append(segs)
                        i = pm.end()
                        continue
                j = i
                while j < n and (text[j].isalnum() or text[j] == "_"):
                    j += 1
                i = j
                continue
            i += 1

    # ---- resolution --------------------------------------------------------------------------

    def modules(self):
        todo = [self.root]
        while todo:
            m = todo.pop()
            yield m
            todo.extend(m.children.values())

    def start(self, module: Module, first: str):
        """Where a path's first segment points, from `module`: (module, consumed) or None."""
        if first == "crate":
            return self.root
        if first == "self":
            return module
        if first == "super":
            return module.parent
        return None

    def resolve(self, module: Module, segs: list, seen=None, relative_ok=True):
        """The module (file) that defines what `segs` names, seen from `module`; None if external."""
        seen = seen or set()
        if not segs:
            return None
        cur = None
        rest = list(segs)
        while rest and rest[0] in ("crate", "self", "super"):
            base = cur or module
            cur = self.start(base, rest.pop(0))
            if cur is None:
                return None
        if cur is None:
            # A relative path: a child module, or a name imported into / defined in `module`.
            first = rest[0]
            if first in module.children:
                cur = module
            elif relative_ok:
                target = self.lookup(module, first, rest[1:], seen)
                return target
            else:
                return None
        return self.descend(cur, rest, seen)

    def descend(self, cur: Module, rest: list, seen):
        while rest:
            name = rest[0]
            if name in cur.children:
                cur = cur.children[name]
                rest = rest[1:]
                continue
            if name == "*":
                return cur
            return self.lookup(cur, name, rest[1:], seen) or cur
        return cur

    def lookup(self, cur: Module, name: str, rest: list, seen):
        """`name` in module `cur`: a definition, or followed through its `use` items."""
        key = (id(cur), name)
        if key in seen:
            return None
        seen = seen | {key}
        if name in cur.children:
            return self.descend(cur.children[name], rest, seen)
        if name in cur.defs:
            return cur
        for segs, alias, _pub, _s, _e in cur.uses:
            if alias == name:
                return self.resolve(cur, segs + rest, seen)
        for segs, alias, _pub, _s, _e in cur.uses:
            if alias == "*":
                base = self.resolve(cur, segs, seen)
                if base is not None and base is not cur:
                    found = self.lookup(base, name, rest, seen)
                    if found is not None:
                        return found
        return None

    # ---- the graph ---------------------------------------------------------------------------

    def edges(self):
        graph = defaultdict(set)
        for module in self.modules():
            # The file's code without its `use` items: where a re-exported name may be used.
            code = USE.sub(" ", self.files[module.file])
            graph[module.file]
            for segs, alias, is_pub, _s, _e in module.uses:
                if is_pub and alias != "*":
                    # A re-export counts only when the file names the item itself too.
                    if not re.search(r"(?<![A-Za-z0-9_])" + re.escape(alias) + r"(?![A-Za-z0-9_])", code):
                        continue
                elif is_pub:
                    continue
                if segs and segs[0] not in ("crate", "self", "super") and segs[0] not in module.children:
                    continue  # an external crate (std, serde, …)
                target = self.resolve(module, segs if alias == "*" else segs, relative_ok=False)
                if target is not None:
                    graph[module.file].add(target.file)
            aliases = {alias: segs for segs, alias, *_ in module.uses if alias != "*"}
            for segs in module.code_paths:
                first = segs[0]
                if first in ("crate", "self", "super") or first in module.children:
                    target = self.resolve(module, segs, relative_ok=False)
                elif first in aliases and (aliases[first][:1] in (["crate"], ["self"], ["super"]) or aliases[first][0] in module.children):
                    target = self.resolve(module, aliases[first] + segs[1:], relative_ok=False)
                else:
                    continue
                if target is not None:
                    graph[module.file].add(target.file)
        for f in graph:
            graph[f].discard(f)
        return graph


def concern_of(file: str, splits: list, groups: dict) -> str:
    if file in groups:
        return groups[file]
    parts = file[:-3].split("/")  # drop .rs
    if parts[-1] == "mod":
        parts = parts[:-1]
    if not parts:
        return "lib"
    for split in splits:
        sp = split.strip("/").split("/")
        if parts[: len(sp)] == sp:
            if len(parts) == len(sp):
                return "/".join(sp)
            return "/".join(parts[: len(sp) + 1])
    return parts[0] if parts[0] != "lib" else "lib"


def sccs(graph):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="the crate's src/ folder")
    ap.add_argument("--split", action="append", help="a folder holding a concern per child module (default: stages)")
    ap.add_argument("--group", action="append", default=[], help="FILE=CONCERN: put FILE in CONCERN")
    ap.add_argument("--edges", action="store_true", help="print every edge, grouped by file")
    ap.add_argument("--dot", action="store_true", help="print the graph in Graphviz dot")
    ap.add_argument("--acyclic", action="append", default=[],
                    help="CONCERN: fail on any circle within it too (issue 43: no import circle in src/cli)")
    args = ap.parse_args()

    crate = Crate(args.src)
    graph = crate.edges()
    splits = args.split if args.split is not None else [d for d in ("stages",) if os.path.isdir(os.path.join(args.src, d))]
    groups = dict(g.split("=", 1) for g in args.group)
    concern = {f: concern_of(f, splits, groups) for f in graph}

    if args.dot:
        print("digraph imports {")
        for f in sorted(graph):
            for t in sorted(graph[f]):
                print(f'  "{f}" -> "{t}";')
        print("}")
        return 0
    if args.edges:
        for f in sorted(graph):
            print(f"{f} [{concern[f]}] -> {', '.join(sorted(graph[f])) or '-'}")

    comps = [c for c in sccs(graph) if len(c) > 1]
    crossing = 0
    print(f"{args.src}: {len(graph)} files, {sum(len(v) for v in graph.values())} edges, "
          f"{len(set(concern.values()))} concerns")
    if not comps:
        print("no import circles")
    for comp in sorted(comps, key=lambda c: (-len(c), c)):
        concerns = sorted({concern[f] for f in comp})
        cross = len(concerns) > 1 or any(c in args.acyclic for c in concerns)
        crossing += cross
        kind = "CYCLE ACROSS CONCERNS" if len(concerns) > 1 else "CYCLE IN AN ACYCLIC CONCERN" if cross else "cycle within one concern"
        print(f"{kind} "
              f"({len(comp)} files; {', '.join(concerns)}):")
        for f in comp:
            inner = sorted(t for t in graph[f] if t in comp)
            print(f"  {f} -> {', '.join(inner)}")
    if crossing:
        print(f"{crossing} circle(s) across concerns or within an acyclic one")
    return 1 if crossing else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`
        sys.stderr.close()
        sys.exit(1)
