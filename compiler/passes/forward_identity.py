"""Forwarding of identities.

Guarantees: no ``reshape`` whose output has its input's type (an ONNX
Identity, or a Reshape/Flatten to the same shape) remains unless its
output is a graph output; its users read its input instead.  A
multiplication or division by constant ones, and a subtraction of constant
+0.0s, that leave their operand's shape become such a reshape first: each
gives every float32 x back bit for bit (NaN, infinities and -0.0 too), so
this changes no value (converters write them: onnxmltools' LightGBM
probabilities times 1).  It lets the passes that match producer and user
(fuse-dense, fold-affine) see through such copies, and fixed point need not
compile the arithmetic.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Op


def _identity_of(op: Op):
    """The operand ``op`` gives back unchanged, or None."""
    if op.kind not in ("mul", "div", "sub") or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    pairs = [(a, b), (b, a)] if op.kind == "mul" else [(a, b)]
    for x, c in pairs:
        if not c.is_const or x.is_const or x.type != op.outputs[0].type:
            continue
        d = c.data
        if op.kind == "sub" and np.all((d == 0) & ~np.signbit(d)) or \
                op.kind != "sub" and np.all(d == 1):
            return x
    return None


def forward_identity(g: Graph) -> Graph:
    kept = []
    for op in g.ops:
        same = _identity_of(op)
        if same is not None:
            op.kind, op.inputs, op.attrs = "reshape", [same], {"shape": list(same.type.shape)}
        x, y = op.inputs[0] if op.inputs else None, op.outputs[0]
        if op.kind == "reshape" and x.type == y.type and y not in g.outputs:
            g.replace_uses(y, x)
            continue
        kept.append(op)
    g.ops = kept
    return g
