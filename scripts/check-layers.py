#!/usr/bin/env python3
"""Check the module graphs of src/ and python/vmmweights/ against the layer
order of docs/ARCHITECTURE.md.

Reads every `use` and every inline `crate::`/`super::`/`self::` path in src/
(comments stripped, re-exports followed to the module that defines the name)
and fails when:
  1. a top-level module imports one in its own or a higher layer (LAYERS below);
  2. modules under one parent import each other in a circle (at any depth);
  3. a top-level module is missing from LAYERS;
  4. a file outside src/driver/ names cudarc;
  5. the Python package python/vmmweights/ has an import circle (imports in
     function bodies included) or a module that imports one in its own or a
     higher layer (PY_LAYERS below), or a top-level module missing from it.
The command-line program (src/bin/vmmw/) sits above every layer and is checked
for rules 2 and 4. `--print` prints the top-level graph.

Usage: python3 scripts/check-layers.py [--print] [ROOT]
       python3 scripts/check-layers.py --self-test   (the checks fail on bad trees)
"""
import os
import re
import sys

# Bottom to top. A module may import only modules of lower layers; modules of
# one layer do not import each other. Keep in step with docs/ARCHITECTURE.md.
LAYERS = [
    ["error"],
    ["units", "codec"],
    ["driver"],
    ["hostmem", "segment", "tag"],
    ["report"],
    ["sleep"],
    ["pool"],
    ["loader"],
    ["share", "devices"],
    ["update", "control"],
    ["ffi", "fuzz"],
]
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}


# One left-to-right pass, so a quote inside a comment, a `//` inside a string
# and a quote in a char literal (`'"'`) each stay what they are; stripping
# comments and strings in separate passes let an odd quote in a doc comment
# swallow the code up to the next quote, and the imports in it with it.
TOKEN_RE = re.compile(
    r"""(?P<line>//[^\n]*)"""
    r"""|(?P<block>/\*.*?\*/)"""
    r"""|(?P<raw>\br(?P<hashes>#*)".*?"(?P=hashes))"""
    r"""|(?P<str>"(?:\\.|[^"\\])*")"""
    r"""|(?P<char>'(?:\\.|[^'\\\n])')""",
    re.S,
)


def strip_comments(text):
    def keep(m):
        if m.group("line") or m.group("block"):
            return ""
        if m.group("char"):
            return "' '"
        return '""'

    return TOKEN_RE.sub(keep, text)


def module_of(path, root="src/"):
    """src/a/b.rs and src/a/b/mod.rs -> ('a', 'b'); src/lib.rs -> ();
    with root src/bin/vmmw/, its main.rs -> ()."""
    parts = path[len(root):-len(".rs")].split("/")
    if parts[-1] in ("mod", "lib", "main") and (parts[-1] != "main" or len(parts) == 1):
        parts = parts[:-1]
    return tuple(parts)


def split_top(s):
    """Split on commas not inside braces."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out if x.strip()]


def expand_use(tree):
    """'a::{b, c::{d, e as f}}' -> [['a','b'], ['a','c','d'], ['a','c','e']]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if m:
        prefix = [p for p in m.group(1).split("::") if p]
        out = []
        for item in split_top(m.group(2)):
            for rest in expand_use(item):
                out.append(prefix + rest)
        return out
    return [[p for p in tree.split("::") if p]]


USE_RE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH_RE = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def parse(root):
    files = {}
    for d, _, fs in os.walk(os.path.join(root, "src")):
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.relpath(os.path.join(d, f), root)
                files[p] = open(os.path.join(root, p), encoding="utf-8").read()
    return files


def absolute(mod, segs):
    """Resolve crate::/super::/self:: (and bare first segments) against `mod`."""
    if segs[0] == "crate":
        return tuple(segs[1:])
    base = list(mod)
    i = 0
    while i < len(segs) and segs[i] in ("super", "self"):
        if segs[i] == "super":
            base = base[:-1]
        i += 1
    return tuple(base + segs[i:])


def self_test():
    """Each rule fails on a small tree that breaks it, and a clean tree passes."""
    import subprocess
    import tempfile

    def tree(files):
        d = tempfile.mkdtemp()
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            with open(os.path.join(d, path), "w", encoding="utf-8") as f:
                f.write(text)
        return d

    base = {
        "src/lib.rs": "pub mod error; pub mod pool; pub mod loader;\npub use error::Result;\n",
        "src/error.rs": "pub type Result<T> = std::result::Result<T, ()>;\n",
        "src/pool/mod.rs": "mod a;\nmod b;\nuse crate::Result;\n",
        "src/pool/a.rs": "use super::b::X;\n",
        "src/pool/b.rs": "pub struct X;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        "src/loader/mod.rs": "use crate::pool;\n// crate::loader::nothing in a comment\n",
        "src/bin/vmmw/main.rs": "mod a;\nmod b;\nuse vmmweights::pool;\n",
        "src/bin/vmmw/a.rs": "use crate::b::X;\n",
        "src/bin/vmmw/b.rs": "pub struct X;\n",
        "python/vmmweights/__init__.py": "from .pool import Pool\n",
        "python/vmmweights/__main__.py": "from . import Pool\n",
        "python/vmmweights/_structs.py": "import ctypes\n",
        "python/vmmweights/_native.py": "from . import _structs as S\n",
        "python/vmmweights/pool.py": "from ._native import call\nimport vmmweights._structs\n",
        "python/vmmweights/torch/__init__.py": "from ..pool import Pool\nfrom . import shared\n",
        "python/vmmweights/torch/shared.py": "from .._native import call\n",
        "python/vmmweights/torch/alias/x/__init__.py": "from vmmweights import Pool\n",
    }
    cases = [
        ("clean", {}, None),
        ("upward", {"src/pool/a.rs": "use super::b::X;\nuse crate::loader;\n"}, "upward import"),
        ("circle", {"src/pool/b.rs": "use super::a::Y;\npub struct X;\n"}, "import circle"),
        ("circle behind quotes",
         {"src/pool/b.rs": "/// a \"quote\n"
                           "fn f(g: &Guard<'_, S>) -> char { let _ = '\"'; super::a::run() }\n"
                           "pub struct X; // and \" one more\n"},
         "import circle"),
        ("unlisted", {"src/lib.rs": base["src/lib.rs"] + "pub mod extra;\n",
                      "src/extra.rs": "\n"}, "not in LAYERS"),
        ("cudarc", {"src/pool/b.rs": "use cudarc::driver::sys;\npub struct X;\n"}, "uses cudarc"),
        ("re-export", {"src/error.rs": "pub use crate::loader::L as Result;\n"}, "upward import"),
        ("cli circle", {"src/bin/vmmw/b.rs": "use crate::a::Y;\npub struct X;\n"}, "import circle under `vmmw`"),
        ("python circle", {"python/vmmweights/torch/shared.py": "def f():\n    from . import DTYPES\n"},
         "python import circle"),
        ("python upward", {"python/vmmweights/pool.py": "from .torch import shared\n"}, "python upward import"),
        ("python facade", {"python/vmmweights/pool.py": "import vmmweights\n"}, "python upward import"),
        ("python unlisted", {"python/vmmweights/extra.py": "\n"}, "not in PY_LAYERS"),
    ]
    failed = 0
    for name, change, expect in cases:
        files = dict(base)
        files.update(change)
        r = subprocess.run([sys.executable, __file__, tree(files)], capture_output=True, text=True)
        ok = r.returncode == 0 if expect is None else (r.returncode != 0 and expect in r.stderr)
        print(f"check-layers self-test {name}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failed += 1
            print(r.stdout + r.stderr, file=sys.stderr)
    sys.exit(1 if failed else 0)


def crate_graph(files, root):
    """The crate under `root` (a {path: text} map): its modules and, for each,
    the modules it imports (re-exports followed to the defining module)."""
    mods = {module_of(p, root): strip_comments(t) for p, t in files.items()}
    # Re-exports: module -> {name: absolute path}, and glob re-export targets.
    exports, globs = {}, {}
    for mod, text in mods.items():
        for m in USE_RE.finditer(text):
            if not m.group(1):
                continue
            for segs in expand_use(m.group(2)):
                if not segs:
                    continue
                first = segs[0]
                if first not in ("crate", "super", "self") and mod == ():
                    segs = ["crate"] + segs
                elif first not in ("crate", "super", "self"):
                    segs = ["self"] + segs
                target = absolute(mod, segs)
                if target[-1] == "*":
                    globs.setdefault(mod, []).append(target[:-1])
                else:
                    exports.setdefault(mod, {})[target[-1]] = target

    def resolve(path, depth=0):
        """The module that defines `path` (longest module prefix, re-exports followed)."""
        k = len(path)
        while k > 0 and path[:k] not in mods:
            k -= 1
        owner = path[:k]
        if k < len(path) and depth < 8:
            name = path[k]
            target = exports.get(owner, {}).get(name)
            if target and target != path:
                return resolve(target, depth + 1)
            for g in globs.get(owner, []):
                if g in mods and g != owner:
                    return resolve(g + (name,), depth + 1)
        return owner

    edges = {}
    for mod, whole in mods.items():
        for base, text in inline_modules(mod, whole):
            refs = []
            for m in USE_RE.finditer(text):
                for segs in expand_use(m.group(2)):
                    if segs and segs[0] in ("crate", "super", "self"):
                        refs.append(segs)
                    elif segs and mod + (segs[0],) in mods:
                        refs.append(["self"] + segs)
            rest = USE_RE.sub("", text)
            refs += [m.group(1).split("::") for m in PATH_RE.finditer(rest)]
            for segs in refs:
                target = resolve(absolute(base, segs))
                if target != mod and not (base != mod and target == base):
                    edges.setdefault(mod, set()).add(target)
    return mods, edges


# The Python package python/vmmweights/, bottom to top, by its top-level
# modules (a subpackage counts as one: `torch` holds torch/*). `__init__` is
# the package's facade: it re-exports the layers below it and nothing but the
# entry point `__main__` imports it. torch/alias/ is not part of the package:
# it is the `torch_memory_saver` stand-in put on PYTHONPATH, a user of it.
# Keep in step with docs/ARCHITECTURE.md.
PY_LAYERS = [
    ["_structs"],
    ["_native"],
    ["report", "tags", "metadata", "_owned"],
    ["pool", "control"],
    ["loader", "saver", "pack"],
    ["devices", "share", "update"],
    ["transport"],
    ["torch"],
    ["__init__"],
    ["__main__"],
]
PY_RANK = {m: i for i, layer in enumerate(PY_LAYERS) for m in layer}
PY_PACKAGE = "vmmweights"
PY_OUTSIDE = ("torch", "alias")


def python_modules(root):
    """{module path: source}: python/vmmweights/a/b.py -> ('a', 'b'),
    a/__init__.py -> ('a',), the package's own __init__.py -> ()."""
    base = os.path.join(root, "python", PY_PACKAGE)
    out = {}
    for d, _, fs in os.walk(base):
        for f in fs:
            if not f.endswith(".py"):
                continue
            parts = tuple(os.path.relpath(os.path.join(d, f), base)[:-len(".py")].split(os.sep))
            if parts[:len(PY_OUTSIDE)] == PY_OUTSIDE:
                continue
            is_init = parts[-1] == "__init__"
            mod = parts[:-1] if is_init else parts
            out[mod] = (open(os.path.join(d, f), encoding="utf-8").read(), is_init)
    return out


def python_edges(mods):
    """Module -> the package modules it imports, lazy (in-function) imports
    included: a circle through a function body is still a circle."""
    import ast

    def owner(path):
        k = len(path)
        while k > 0 and path[:k] not in mods:
            k -= 1
        return path[:k]

    edges = {}
    for mod, (text, is_init) in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == PY_PACKAGE:
                        targets.add(owner(tuple(parts[1:])))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod if is_init else mod[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    base += tuple(node.module.split(".")) if node.module else ()
                elif node.module and node.module.split(".")[0] == PY_PACKAGE:
                    base = tuple(node.module.split(".")[1:])
                else:
                    continue
                for a in node.names:
                    sub = base + (a.name,)
                    targets.add(sub if sub in mods else owner(base))
        edges[mod] = {t for t in targets if t != mod}
    return edges


def python_problems(root):
    """Circles anywhere in the package's import graph, and imports that do
    not go down PY_LAYERS."""
    mods = python_modules(root)
    if not mods:
        return []
    edges = python_edges(mods)
    name = lambda m: ".".join((PY_PACKAGE,) + m)
    top = lambda m: m[0] if m else "__init__"
    problems = []
    graph = {name(a): {name(b) for b in bs} for a, bs in edges.items()}
    for cycle in find_cycles(graph):
        problems.append(f"python import circle among: {', '.join(cycle)}")
    for m in sorted({top(m) for m in mods}):
        if m not in PY_RANK:
            problems.append(f"python module `{name((m,))}` is not in PY_LAYERS (scripts/check-layers.py)")
    for a, bs in sorted(edges.items()):
        for b in sorted(bs):
            ta, tb = top(a), top(b)
            if ta == tb or ta not in PY_RANK or tb not in PY_RANK:
                continue
            if PY_RANK[tb] >= PY_RANK[ta]:
                problems.append(
                    f"python upward import: `{name(a)}` imports `{name(b)}` "
                    f"(layer {PY_RANK[ta]} `{ta}` may only use layers below it)"
                )
    return problems


def main():
    if "--self-test" in sys.argv:
        self_test()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
    files = parse(root)
    lib = {p: t for p, t in files.items() if not p.startswith("src/bin/")}
    mods, edges = crate_graph(lib, "src/")
    problems = []

    # Rule 1 and 3: top-level edges go strictly down the layers.
    top = {}
    for a, bs in edges.items():
        for b in bs:
            if not a or not b or a[0] == b[0]:
                continue
            top.setdefault(a[0], set()).add(b[0])
            for m in (a[0], b[0]):
                if m not in RANK:
                    problems.append(f"module `{m}` is not in LAYERS (scripts/check-layers.py)")
            if a[0] in RANK and b[0] in RANK and RANK[b[0]] >= RANK[a[0]]:
                where = "::".join(a)
                problems.append(
                    f"upward import: `{where}` uses `{'::'.join(b)}` "
                    f"(layer {RANK[a[0]]} `{a[0]}` may only use layers below it)"
                )
    for m in {k[0] for k in mods if k}:
        if m not in RANK:
            problems.append(f"module `{m}` is not in LAYERS (scripts/check-layers.py)")

    # Rule 2: no circles among the children of any module, in the library
    # and in the command line (src/bin/vmmw/, a crate of its own).
    problems += circles(edges, "crate")
    bin_files = {p: t for p, t in files.items() if p.startswith("src/bin/vmmw/")}
    bin_mods, bin_edges = crate_graph(bin_files, "src/bin/vmmw/")
    problems += circles(bin_edges, "vmmw")

    # Rule 5: the Python package, python/vmmweights/.
    problems += python_problems(root)

    # Rule 4: only the driver names cudarc.
    for p, t in sorted(files.items()):
        if not p.startswith("src/driver/") and re.search(r"\bcudarc\b", strip_comments(t)):
            problems.append(f"{p} uses cudarc; only src/driver/ may")

    if "--print" in sys.argv:
        for a in sorted(top, key=lambda m: (RANK.get(m, 99), m)):
            print(f"{a:8} -> {' '.join(sorted(top[a], key=lambda m: (RANK.get(m, 99), m)))}")
    for p in sorted(set(problems)):
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    n = sum(len(v) for v in edges.values())
    print(f"check-layers: {len(mods)} modules, {n} import edges: no circles, nothing imports upward")


def circles(edges, crate):
    """A problem for each circle among the children of one module."""
    problems, sib = [], {}
    for a, bs in edges.items():
        for b in bs:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == len(a) or n == len(b):
                continue  # a module and its own ancestor or descendant
            parent = a[:n]
            sib.setdefault(parent, {}).setdefault(a[n], set()).add(b[n])
    for parent, g in sorted(sib.items()):
        for cycle in find_cycles(g):
            name = "::".join((crate,) + parent)
            problems.append(f"import circle under `{name}` among: {', '.join(cycle)}")
    return problems


def inline_modules(mod, text):
    """(module path, text) for the file's own text and each inline `mod x { }`
    (test modules), so `super::` inside one means the file's module."""
    out, own, pos = [], [], 0
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        own.append(text[pos:m.start()])
        out.append((mod + (m.group(1),), text[m.end():i - 1]))
        pos = i
    own.append(text[pos:])
    return [(mod, "".join(own))] + out


def find_cycles(g):
    """One cycle per strongly connected component with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
