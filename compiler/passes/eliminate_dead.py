"""Dead-code elimination.

Guarantees: every remaining op contributes to a graph output; constants no
op uses disappear with their last user (constants are owned by the ops that
use them).  Ops have no side effects, so removal never changes results.
"""
from __future__ import annotations

from ..ir import Graph


def eliminate_dead(g: Graph) -> Graph:
    live = set(g.outputs)
    kept = []
    for op in reversed(g.ops):
        if any(v in live for v in op.outputs):
            kept.append(op)
            live.update(op.inputs)
    g.ops = kept[::-1]
    return g
