"""The lowered program: a schedule of kernel calls over named buffers.

This is the level below the graph IR.  ``passes.lower`` produces it, the
planner fills in workspace offsets, and codegen renders it without making
any decision of its own.

A ``Buffer`` is one contiguous array:
  input   a slice of the caller's ``in`` array (``offset`` in elements)
  output  a slice of the caller's ``out`` array (``offset`` in elements)
  temp    a slice of the caller's workspace (``offset`` in bytes, planned)
  const   a ``static const`` array; ``data`` holds its values, shaped as
          the C declaration is

A ``Kernel`` names its operands by role (``a``, ``b``, ``c``, ``x`` are read,
``y`` is written) and carries the static loop parameters its template needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ir import DType, TensorType, fmt_attr

# The SIMD paths of fixed-point models, in order (kml_simd.h: enum kml_path)
SIMD_ISAS = ("sse2", "avx2")
# Offset pairs (kml_fixed.h, kml_w8_lane): a full tile of int8 weights
# stored as the bytes w + W8_OFFSET, read by loads that run up to
# W8_OVERREAD bytes past the array (passes/lower.py keeps them in the set)
W8_OFFSET = 128
W8_OVERREAD = 3


@dataclass(eq=False)
class Buffer:
    name: str          # C identifier
    dtype: DType
    numel: int
    kind: str          # input | output | temp | const
    data: np.ndarray | None = None
    offset: int = 0
    value: str = ""    # the IR value it was created for, for comments
    layout: str = ""   # for 2-D constants: what a row holds, for comments

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.size

    def ref(self) -> str:
        where = {"input": f"in[{self.offset}]", "output": f"out[{self.offset}]",
                 "temp": f"ws+{self.offset}", "const": "static"}[self.kind]
        return f"%{self.name}<{self.dtype}x{self.numel} @{where}>"


@dataclass(eq=False)
class Kernel:
    kind: str                       # matmul | binary | map | softmax | argmax | copy
    fn: str                         # C function name
    operands: dict[str, Buffer]     # role -> buffer; role "y" is written
    params: dict = field(default_factory=dict)
    origin: tuple[str, ...] = ()

    @property
    def reads(self) -> list[Buffer]:
        return [b for r, b in self.operands.items() if r != "y"]

    @property
    def writes(self) -> list[Buffer]:
        return [self.operands["y"]]


@dataclass
class Port:
    """A graph input or output: its name in the source model, its type, and
    the buffer (a slice of ``in`` or ``out``) that holds it."""
    name: str
    type: TensorType
    buffer: Buffer


@dataclass(eq=False)
class Program:
    name: str
    numerics: str
    inputs: list[Port]
    outputs: list[Port]
    kernels: list[Kernel]
    plan: object = None   # planner.MemoryPlan once planned
    quant: object = None  # passes.quantize.QuantInfo for fixed-point programs
    graph: object = None  # the graph that was lowered (float: what the C computes)
    hooks: list = field(default_factory=list)  # kernel hooks generated with the model
    in_dtype: DType | None = None    # element type of the entry point's in[]
    out_dtype: DType | None = None   # and of its out[] (passes/lower.py: io_types)

    def buffers(self, kind: str | None = None) -> list[Buffer]:
        seen: dict[Buffer, None] = {}
        for p in self.inputs + self.outputs:
            seen.setdefault(p.buffer)
        for k in self.kernels:
            for b in k.operands.values():
                seen.setdefault(b)
        return [b for b in seen if kind is None or b.kind == kind]

    @property
    def in_elems(self) -> int:
        return sum(p.buffer.numel for p in self.inputs)

    @property
    def out_elems(self) -> int:
        return sum(p.buffer.numel for p in self.outputs)

    def weight_set(self) -> list[Buffer]:
        """The constants in the order of the weight set's struct members
        (kml_<core>_weights): larger elements first, so that no member needs
        padding before it, and in program order otherwise."""
        return sorted(self.buffers("const"), key=lambda b: -b.dtype.size)

    @property
    def weight_bytes(self) -> int:
        """sizeof the weight set: its members, and the padding that rounds
        the struct up to its largest element (1 B of padding when the model
        has no constants: C has no empty structs)."""
        cs = self.weight_set()
        if not cs:
            return 1
        align = cs[0].dtype.size
        return -(-sum(b.nbytes for b in cs) // align) * align

    def __str__(self) -> str:
        lines = [f"schedule @{self.name} {self.numerics} {{"]
        for p in self.inputs:
            lines.append(f"  input  {p.name!r} {p.type} -> {p.buffer.ref()}")
        for p in self.outputs:
            lines.append(f"  output {p.name!r} {p.type} -> {p.buffer.ref()}")
        for i, k in enumerate(self.kernels):
            ops = ", ".join(f"{r}={b.ref()}" for r, b in k.operands.items() if r != "y")
            loc = f"  // {', '.join(k.origin)}" if k.origin else ""
            shown = {n: v for n, v in k.params.items() if v not in (None, [], {}, "none")}
            lines.append(f"  k{i} {k.kind}({ops}) -> {k.operands['y'].ref()} "
                         f"{fmt_attr(shown)}{loc}")
        lines.append("}")
        return "\n".join(lines)
