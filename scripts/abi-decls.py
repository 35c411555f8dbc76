#!/usr/bin/env python3
"""Print the ABI-relevant declarations of a C header, one per line, sorted.

Used by scripts/check-abi.sh. What counts: function prototypes, typedefs
(struct bodies with their fields in order) and numeric #define constants.
What does not: comments, whitespace, include guards, the version macros
(they change with every release), VMMW_DEPRECATED(...) markers (deprecating
is not a break), the VMMW_*_OPTIONS_INIT helper macros and anything under
#ifdef __cplusplus. Usage: abi-decls.py HEADER
"""
import re
import sys

SKIP_DEFINES = re.compile(r"VMMW_VERSION_|VMMWEIGHTS_|VMMW_DEPRECATED|_OPTIONS_INIT$")


def decls(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out, body = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            m = re.match(r"#\s*define\s+(VMMW_\w+)\s+(.+)$", s)
            if m and not SKIP_DEFINES.search(m.group(1)) and "(" not in m.group(1):
                out.append(f"#define {m.group(1)} {m.group(2).strip()}")
            continue
        body.append(s)
    code = " ".join(body)
    code = code.replace('extern "C" {', " ").replace("} ", "}")
    depth, cur = 0, []
    for ch in code:
        cur.append(ch)
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif ch == ";" and depth == 0:
            d = re.sub(r"\s+", " ", "".join(cur)).strip()
            d = re.sub(r"VMMW_DEPRECATED\(\"(?:[^\"\\]|\\.)*\"\)\s*", "", d)
            d = re.sub(r"\s*([(){},;*\[\]])\s*", r"\1", d)
            if d and d != ";":
                out.append(d)
            cur = []
    return sorted(set(out))


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(decls(f.read())))
