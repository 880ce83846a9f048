"""kmlc's graph IR: typed, statically shaped tensors and the ops between them.

A ``Graph`` is a list of ``Op`` in topological order over SSA ``Value``s.  A
value is either a graph input, a constant (it carries ``data``), or the
result of exactly one op.  Every value has a ``TensorType``: a dtype and a
fully static shape (kmlc compiles one sample per call, so there is nothing
dynamic left once the frontend has bound the batch dimension).

The IR has a textual form (``print(graph)``) modelled on MLIR's generic form,
and a verifier (``verify``) that every pass's output is checked against.
"""
from __future__ import annotations

import hashlib
import math
import re
import string
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    np: type
    ctype: str

    @property
    def size(self) -> int:
        return np.dtype(self.np).itemsize

    def __str__(self) -> str:
        return self.name


F32 = DType("f32", np.float32, "float")
I64 = DType("i64", np.int64, "s64")
I32 = DType("i32", np.int32, "s32")
I16 = DType("i16", np.int16, "s16")
I8 = DType("i8", np.int8, "s8")
U8 = DType("u8", np.uint8, "u8")
U16 = DType("u16", np.uint16, "u16")
U32 = DType("u32", np.uint32, "u32")
# ONNX bool: one byte holding 0 or 1 (u8 in C, so that the same arrays work
# in the kernel and in userspace, where bool's size is the ABI's).
BOOL = DType("bool", np.bool_, "u8")
DTYPES = {d.name: d for d in (F32, I64, I32, I16, I8, U8, U16, U32, BOOL)}


def dtype_of(array: np.ndarray) -> DType:
    for d in DTYPES.values():
        if array.dtype == d.np:
            return d
    raise TypeError(f"no kmlc dtype for numpy dtype {array.dtype}")


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)          # exact: declared shapes may be absurd

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.size

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


class Value:
    """An SSA value.  ``data`` is set for constants and nothing else."""

    def __init__(self, name: str, type: TensorType, data: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.data = data
        if data is not None:
            assert data.shape == type.shape and data.dtype == type.dtype.np, (name, data.shape, type)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    def __repr__(self) -> str:
        return f"%{self.name}"


def const(name: str, data: np.ndarray) -> Value:
    data = np.ascontiguousarray(data).reshape(np.shape(data))   # a scalar stays rank 0
    return Value(name, TensorType(dtype_of(data), tuple(data.shape)), data)


@dataclass(eq=False)
class Op:
    """One operation.  ``origin`` names the ONNX nodes it was built from, so
    that generated C can say where each block comes from."""

    kind: str
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict = field(default_factory=dict)
    origin: tuple[str, ...] = ()

    @property
    def output(self) -> Value:
        assert len(self.outputs) == 1
        return self.outputs[0]


class IRError(Exception):
    """The IR broke an invariant: always a bug in a frontend or a pass."""


@dataclass(eq=False)
class Graph:
    name: str
    inputs: list[Value]
    outputs: list[Value]
    ops: list[Op]
    # Names the graph's inputs and outputs had in the source model.
    source_names: dict[Value, str] = field(default_factory=dict)
    # Proven integer range of every value (passes/bound_ranges.py).
    intervals: dict[Value, tuple[int, int]] = field(default_factory=dict)

    def producers(self) -> dict[Value, Op]:
        return {v: op for op in self.ops for v in op.outputs}

    def users(self) -> dict[Value, list[Op]]:
        uses: dict[Value, list[Op]] = {}
        for op in self.ops:
            for v in op.inputs:
                uses.setdefault(v, []).append(op)
        return uses

    def constants(self) -> list[Value]:
        """Constants in first-use order (graph outputs last)."""
        seen: dict[Value, None] = {}
        for v in [v for op in self.ops for v in op.inputs] + self.outputs:
            if v.is_const:
                seen.setdefault(v)
        return list(seen)

    def replace_uses(self, old: Value, new: Value) -> None:
        for op in self.ops:
            op.inputs = [new if v is old else v for v in op.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]
        if old in self.source_names and new not in self.source_names:
            self.source_names[new] = self.source_names[old]

    def source_name(self, v: Value) -> str:
        return self.source_names.get(v, v.name)

    def __str__(self) -> str:
        return print_graph(self)


# --------------------------------------------------------------------------
# Textual form
# --------------------------------------------------------------------------

def _fmt_scalar(x) -> str:
    if isinstance(x, (float, np.floating)):
        return str(np.float32(x))  # shortest text that reads back as the same f32
    return str(x)


def fmt_attr(v) -> str:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if len(v) > 8 and not any(isinstance(x, (list, tuple, dict)) for x in v):
            return f"[{fmt_attr(v[0])}, {fmt_attr(v[1])}, ... {len(v)} values]"
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {fmt_attr(x)}" for k, x in v.items()) + "}"
    if isinstance(v, str):
        return v
    return _fmt_scalar(v)


def fmt_const(data: np.ndarray, limit: int = 8) -> str:
    flat = data.reshape(-1)
    if flat.size <= limit:
        return "[" + ", ".join(_fmt_scalar(x) for x in flat) + "]"
    digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()[:12]
    return (f"<{flat.size} values, min {_fmt_scalar(flat.min())}, "
            f"max {_fmt_scalar(flat.max())}, sha256 {digest}>")


def print_graph(g: Graph) -> str:
    sig_in = ", ".join(f"%{v.name}: {v.type}" for v in g.inputs)
    sig_out = ", ".join(str(v.type) for v in g.outputs)
    lines = [f"graph @{g.name}({sig_in}) -> ({sig_out}) {{"]
    for c in g.constants():
        lines.append(f"  %{c.name} = const {c.type} {fmt_const(c.data)}")
    for op in g.ops:
        res = ", ".join(f"%{v.name}" for v in op.outputs)
        args = ", ".join(f"%{v.name}" for v in op.inputs)
        attrs = f" {fmt_attr(op.attrs)}" if op.attrs else ""
        types = ", ".join(str(v.type) for v in op.outputs)
        loc = f"  // {', '.join(op.origin)}" if op.origin else ""
        lines.append(f"  {res} = {op.kind}({args}){attrs} : {types}{loc}")
    lines.append("  return " + ", ".join(f"%{v.name}" for v in g.outputs))
    lines.append("}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Verifier
# --------------------------------------------------------------------------

def verify(g: Graph) -> Graph:
    """Check SSA form, topological order, unique names and that every op's
    result types are what the op's type rule gives for its operands."""
    from .ops import infer_types  # ops depends on ir

    defined: set[Value] = set(g.inputs)
    names: set[str] = set()

    def define(v: Value, what: str) -> None:
        if v.name in names:
            raise IRError(f"value name %{v.name} defined twice ({what})")
        names.add(v.name)

    for v in g.inputs:
        if v.is_const:
            raise IRError(f"graph input %{v.name} is a constant")
        define(v, "input")
    for c in g.constants():
        define(c, "constant")
    for op in g.ops:
        for v in op.inputs:
            if not v.is_const and v not in defined:
                raise IRError(f"{op.kind} uses %{v.name} before it is defined")
        try:
            expected = infer_types(op.kind, [v.type for v in op.inputs], op.attrs)
        except IRError:
            raise
        except Exception as e:  # a type rule rejected the operands
            raise IRError(f"{op.kind} {op.origin}: {e}") from e
        got = [v.type for v in op.outputs]
        if expected != got:
            raise IRError(f"{op.kind} {op.origin}: result types {list(map(str, got))}, "
                          f"type rule gives {list(map(str, expected))}")
        for v in op.outputs:
            if v.is_const or v in defined:
                raise IRError(f"%{v.name} is defined more than once")
            define(v, op.kind)
            defined.add(v)
    for v in g.outputs:
        if not v.is_const and v not in defined:
            raise IRError(f"graph output %{v.name} is never defined")
    return g


def fresh_namer(g: Graph | None = None, taken: Iterable[str] = ()):
    """Return a function that makes value names unique within ``g``."""
    used = set(taken)
    if g is not None:
        used |= {v.name for v in g.inputs} | {c.name for c in g.constants()}
        used |= {v.name for op in g.ops for v in op.outputs}

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        return name

    return fresh


# Printable ASCII that means nothing special in a C comment or string
# literal; '*' and '/' together end or open a comment, '"' and '\\' end or
# escape a string, '?' starts trigraphs.
_C_TEXT_SAFE = frozenset(string.ascii_letters + string.digits + " _.,:;+-=<>()[]{}#@!$%&^|~'/")


def c_text(name: str, limit: int = 64) -> str:
    """``name`` (an ONNX node or tensor name, a file name) as pure-ASCII text
    that is safe inside a C comment and inside a C string literal: every
    character outside a plain printable set, and every '*', '"', '\\' and
    '?', is written as the three-digit octal escapes of its UTF-8 bytes
    (which a string literal decodes back to the same bytes).  Controls,
    newlines and bidi overrides so never reach the C.  Past ``limit``
    characters of output the rest is cut to "..." (never inside an escape)."""
    out, n = [], 0
    for c in name:
        t = c if c in _C_TEXT_SAFE else "".join(f"\\{b:03o}" for b in c.encode())
        if n + len(t) > limit:
            return "".join(out) + "..."
        out.append(t)
        n += len(t)
    return "".join(out)


def c_identifier(name: str, default: str = "t") -> str:
    """``name`` made into a C identifier: other characters become '_'."""
    s = re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_")
    if not s:
        s = default
    if s[0].isdigit():
        s = f"{default}{s}"
    return s
