"""Forwarding of identities.

Guarantees: no ``reshape`` whose output has its input's type (an ONNX
Identity, or a Reshape/Flatten to the same shape) remains unless its
output is a graph output; its users read its input instead.  This changes
no value, and it lets the passes that match producer and user (fuse-dense,
fold-affine) see through such copies.
"""
from __future__ import annotations

from ..ir import Graph


def forward_identity(g: Graph) -> Graph:
    kept = []
    for op in g.ops:
        x, y = op.inputs[0] if op.inputs else None, op.outputs[0]
        if op.kind == "reshape" and x.type == y.type and y not in g.outputs:
            g.replace_uses(y, x)
            continue
        kept.append(op)
    g.ops = kept
    return g
