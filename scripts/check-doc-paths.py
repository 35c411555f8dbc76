#!/usr/bin/env python3
"""Every repository path the docs name exists.

Reads README.md, docs/*.md, bench/results/*.md and the README.md of each
folder under examples/, bindings/ and python/, and checks, in each:
  - every relative Markdown link target ([text](path), anchors dropped),
    resolved against the file's folder;
  - every word inside `code` that starts with a top-level folder or file of
    the repository (src/..., tests/..., scripts/..., Cargo.toml), resolved
    against the repository root; `a/{b,c}.rs` stands for both; a trailing
    `::item` or `:line` is dropped; a word with a placeholder (<x>, NN, *,
    ...) is skipped;
  - `scripts/gpu-check.sh N ...`: each N selects at least one part in
    scripts/gpu.d/, as it does when run.
CHANGELOG.md is left out: it names what existed when each entry was written.

    python3 scripts/check-doc-paths.py             check this repository
    python3 scripts/check-doc-paths.py --self-test the check fails on a doc that names a missing path
"""

import os
import re
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOP = ("src/", "tests/", "scripts/", "docs/", "bench/", "examples/", "bindings/", "python/",
       "include/", "kernels/", "fuzz/", "cmake/", "abi/", "preload/")
TOP_FILES = ("Cargo.toml", "Cargo.lock", "CMakeLists.txt", "README.md", "CHANGELOG.md",
             "cbindgen.toml", "clippy.toml", "vmmweights.pc.in", "LICENSE")
PLACEHOLDER = re.compile(r"<|>|\*|\.\.\.|\bNN\b|\$|%|\bX\b|\bN\b|X\.Y\.Z")
# Text just before a code span that says the path is another project's:
# "vLLM's `tests/...`", "github ggml-org/ggml `docs/gguf.md`".
ELSEWHERE = re.compile(r"(\w's|github \S+/\S+) $")


def docs(root):
    out = [os.path.join(root, "README.md")]
    for folder in ("docs", os.path.join("bench", "results")):
        d = os.path.join(root, folder)
        if os.path.isdir(d):
            out += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    for parent in ("examples", "bindings", "python"):
        for d, _, fs in os.walk(os.path.join(root, parent)):
            if "node_modules" in d or "/target" in d:
                continue
            out += [os.path.join(d, f) for f in fs if f == "README.md"]
    return [p for p in out if os.path.isfile(p)]


def expand(word):
    """`a/{b,c}.rs` -> [a/b.rs, a/c.rs]."""
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    return [w for alt in m.group(1).split(",") for w in expand(word[:m.start()] + alt + word[m.end():])]


def clean(word):
    word = word.strip("'\"()[],;.")
    word = word.split("::")[0]
    word = re.sub(r":\d+(-\d+)?$", "", word)
    return word.rstrip(":")


def names_path(word):
    return word.startswith(TOP) or word in TOP_FILES


def gpu_parts(root):
    d = os.path.join(root, "scripts", "gpu.d")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def check_file(root, path):
    text = open(path, encoding="utf-8").read()
    rel = os.path.relpath(path, root)
    problems = []
    text = re.sub(r"<!-- check-doc-paths: off -->.*?<!-- check-doc-paths: on -->", "", text, flags=re.S)
    # Fenced code blocks: words in them are checked like inline code.
    spans = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    body = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
    for m in re.finditer(r"`([^`\n]+)`", body):
        before = body[max(0, m.start() - 60):m.start()].split("\n")[-1]
        if not ELSEWHERE.search(before):
            spans.append(m.group(1))
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        t = target.split("#")[0]
        if t and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), t))):
            problems.append(f"{rel}: link to {target}, which does not exist")
    parts = gpu_parts(root)
    for span in spans:
        for line in span.splitlines():
            words = line.split()
            for i, w in enumerate(words):
                w = clean(w)
                if not names_path(w) or PLACEHOLDER.search(w):
                    continue
                for p in expand(w):
                    if not os.path.exists(os.path.join(root, p)):
                        problems.append(f"{rel}: names {p}, which does not exist")
                if w == "scripts/gpu-check.sh":
                    for sel in words[i + 1:]:
                        if not re.fullmatch(r"\d\d[\w-]*", sel):
                            break
                        if not any(p.startswith(sel) for p in parts):
                            problems.append(f"{rel}: `scripts/gpu-check.sh ... {sel}` selects no part of scripts/gpu.d/")
    return problems


def check(root):
    problems = []
    for path in docs(root):
        problems += check_file(root, path)
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "bench", "results"))
        os.makedirs(os.path.join(d, "tests", "all"))
        os.makedirs(os.path.join(d, "scripts", "gpu.d"))
        open(os.path.join(d, "tests", "all", "real.rs"), "w").close()
        open(os.path.join(d, "scripts", "gpu.d", "15-contract.sh"), "w").close()
        open(os.path.join(d, "scripts", "gpu-check.sh"), "w").close()
        open(os.path.join(d, "README.md"), "w").write("[ok](bench/results/x.md), `tests/all/real.rs::t`\n")
        open(os.path.join(d, "bench", "results", "x.md"), "w").write(
            "Checked by `tests/driver_contract.rs` and `tests/all/{real,gone}.rs`;"
            " run `bash scripts/gpu-check.sh 15 99`; see [y](y.md). vLLM's `tests/theirs.py`,"
            " github o/r `src/theirs.rs`.\n<!-- check-doc-paths: off -->\n`include/installed.h`\n"
            "<!-- check-doc-paths: on -->\n")
        got = check(d)
        want = ["names tests/driver_contract.rs", "names tests/all/gone.rs", "selects no part",
                "link to y.md"]
        missing = [w for w in want if not any(w in g for g in got)]
        if missing or len(got) != len(want):
            sys.exit(f"check-doc-paths self-test: expected problems {want}, got {got}")
    print(f"check-doc-paths self-test: a missing path, a brace alternative, a gpu-check part and a link are caught")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    problems = check(ROOT)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(f"{len(problems)} path(s) named in the docs do not exist")
    print(f"docs: every path named in {len(docs(ROOT))} Markdown files exists")


if __name__ == "__main__":
    main()
