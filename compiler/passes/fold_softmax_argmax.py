"""Removal of a softmax whose only use is an argmax over the same axis
(fixed-point pipeline only).

Guarantees: softmax is monotonic, so argmax(softmax(x)) = argmax(x); the
argmax reads x directly and the softmax disappears.  In float the two can
differ when rounding makes two probabilities equal, so the float pipeline,
which follows ONNX exactly, keeps the softmax.
"""
from __future__ import annotations

from ..ir import Graph


def fold_softmax_argmax(g: Graph) -> Graph:
    producers, users = g.producers(), g.users()
    for a in list(g.ops):
        if a.kind != "argmax":
            continue
        s = producers.get(a.inputs[0])
        if s is None or s.kind != "softmax" or s.output in g.outputs:
            continue
        rank = len(s.output.type.shape)
        if len(users[s.output]) == 1 and s.attrs["axis"] % rank == a.attrs["axis"] % rank:
            a.inputs = [s.inputs[0]]
            a.origin = s.origin + a.origin
            g.ops = [o for o in g.ops if o is not s]
    return g
