"""The ctypes mirrors in vmmweights/_structs.py match the generated C header
field by field (name, type, array length, order): a struct changed in Rust
fails here, not as silent memory corruption."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from vmmweights import _structs as S

HEADER = Path(__file__).resolve().parents[2] / "include" / "vmmweights.h"

C_TYPES = {
    "uint64_t": ctypes.c_uint64,
    "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32,
    "uint8_t": ctypes.c_uint8,
    "double": ctypes.c_double,
    "char": ctypes.c_char,
    "size_t": ctypes.c_size_t,
}


def header_structs() -> dict:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} not found: run from a source checkout")
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    for base, alias in re.findall(r"typedef (\w+) (vmmw_\w+_t);", text):  # named enum types
        C_TYPES[alias] = C_TYPES[base]
    defines = {m[0]: int(m[1]) for m in re.findall(r"#define (\w+) (\d+)\s", text)}
    out = {}
    for name, body in re.findall(r"typedef struct (vmmw_\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            m = re.fullmatch(r"(.+?)\s*(\*?)\s*(\w+)(?:\[(\w+)\])?", decl)
            assert m, f"cannot parse `{decl}` in {name}"
            ctype, star, field, count = m.groups()
            nested = re.fullmatch(r"struct (vmmw_\w+)", ctype.strip())
            if star:
                t = ctypes.c_void_p
            elif nested:
                # A struct of the header held by value: its mirror, checked on its own.
                t = S.ALL[nested[1]]
            else:
                t = C_TYPES[ctype.strip()]
                if count:
                    t = t * (defines[count] if count in defines else int(count))
            fields.append((field, t))
        out[name] = fields
    return out


def same(a, b) -> bool:
    if hasattr(a, "_length_") or hasattr(b, "_length_"):
        return getattr(a, "_length_", None) == getattr(b, "_length_", None) and same(a._type_, b._type_)
    return ctypes.sizeof(a) == ctypes.sizeof(b) and getattr(a, "_type_", None) == getattr(b, "_type_", None)


@pytest.mark.parametrize("name", sorted(S.ALL))
def test_struct_matches_header(name):
    structs = header_structs()
    assert name in structs, f"{name} is not in {HEADER}"
    want = structs[name]
    got = S.ALL[name]._fields_
    assert [f for f, _ in got] == [f for f, _ in want], f"{name}: field names/order differ"
    for (f, g), (_, w) in zip(got, want):
        assert same(g, w), f"{name}.{f}: ctypes {g} vs header {w}"


def header_functions() -> dict:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} not found: run from a source checkout")
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out = {}
    for name, args in re.findall(r"\b(vmmw_\w+)\(([^()]*)\);", text):
        args = args.strip()
        out[name] = 0 if args in ("", "void") else args.count(",") + 1
    return out


def test_declared_functions_match_header_arity():
    """Every C function the package declares exists in the header with the
    number of arguments declared (the trailing error argument included)."""
    from vmmweights import _native

    funcs = header_functions()
    for name, (_res, args, has_err) in _native._SIGNATURES.items():
        assert name in funcs, f"{name} is not in the header"
        assert funcs[name] == len(args) + has_err, f"{name}: {funcs[name]} arguments in the header"
