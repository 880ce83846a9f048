"""Constant folding.

Guarantees: afterwards no op has only constant operands, and every folded
constant is finite (an op whose constant operands compute to infinity or
NaN is refused naming its node); every such op has
been replaced by a constant holding exactly the bits the generated C would
compute for it (the op's reference evaluator is bit-exact, see
``kmlc.fmath``), so folding never changes a model's results.  Chains fold in
one sweep because ops are visited in topological order: ``(x - mean) / std``
written as ``Div(Sub(x, mean), Sqrt(var + eps))`` keeps the Sub and Div and
folds everything on the constant side.
"""
from __future__ import annotations

import numpy as np

from ..errors import KmlcError
from ..ir import Graph, const, fresh_namer
from ..ops import evaluate


def fold_constants(g: Graph) -> Graph:
    fresh = fresh_namer(g)
    kept = []
    for op in g.ops:
        if op.inputs and all(v.is_const for v in op.inputs):
            with np.errstate(all="ignore"):
                results = evaluate(op.kind, [v.data for v in op.inputs], op.attrs)
            for old, data in zip(op.outputs, results, strict=True):
                if not np.all(np.isfinite(data)):
                    bad = "NaN" if np.isnan(data).any() else "infinity"
                    raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: its constant "
                                    f"operands compute to {bad} (float32 overflow or an "
                                    "undefined operation); kmlc needs finite constants")
                new = const(fresh(f"{old.name}_c"), data.astype(old.type.dtype.np)
                            .reshape(old.type.shape))
                g.replace_uses(old, new)  # later ops see the constant: chains fold
        else:
            kept.append(op)
    g.ops = kept
    return g
