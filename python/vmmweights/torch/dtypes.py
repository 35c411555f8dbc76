"""The dtype tables the torch modules share: torch dtypes by safetensors name
and the ``__cuda_array_interface__`` type strings."""

from __future__ import annotations

import torch

DTYPES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}

# __cuda_array_interface__ type strings; BF16 has none, so it travels as int16
# and is viewed as bfloat16 afterwards.
_TYPESTR = {"BF16": ("<i2", torch.bfloat16), "F16": ("<f2", None), "F32": ("<f4", None),
            "F64": ("<f8", None), "I8": ("|i1", None), "U8": ("|u1", None), "I16": ("<i2", None),
            "I32": ("<i4", None), "I64": ("<i8", None), "BOOL": ("|b1", None)}
