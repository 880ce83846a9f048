"""Sums as dense layers (fixed-point pipeline only).

Guarantees: every ``reduce`` by sum of a float tensor x of N elements and M
results is replaced by x reshaped to one row [1, N] and a ``dense`` op with
weights W [N, M], W[i, j] = 1 where element i of x (row-major) belongs to
result j and 0 elsewhere, whose output takes the reduction's shape
(keepdims or not).  Any axes, one mechanism; a sum of a whole row is the
column of ones [N, 1].  The function is the same; the order of the float
additions may differ, which is why the float pipeline does not run this
pass.  The weights cost N x M bytes as int8 (the kernel's weight budget
applies to them as to any layer's).

In fixed point the layer is exact where the reduction has no integer form
of its own: the weights quantize to 127 and 0 at a step of 1/127, so each
accumulator holds the exact sum of int16 activations (proven within its
type by passes/bound_ranges.py) and one requantization gives the output's
scale.  ReduceMean's division by the count then folds into the layer
(passes/fold_affine.py), and ReduceL1's Abs before it is a qact.
"""
from __future__ import annotations

import numpy as np

from ..ir import F32, Graph, Op, TensorType, Value, const, fresh_namer


def member_matrix(shape: tuple, axes: list[int]) -> np.ndarray:
    """W [N, M]: W[i, j] = 1 where element i of a tensor of ``shape``
    (row-major) is summed into result j of the reduction over ``axes``."""
    kept = [i for i in range(len(shape)) if i not in axes]
    coords = np.indices(shape).reshape(len(shape), -1)
    j = np.ravel_multi_index(coords[kept], [shape[i] for i in kept]) if kept else \
        np.zeros(coords.shape[1], np.int64)
    w = np.zeros((coords.shape[1], int(np.prod([shape[i] for i in kept], dtype=np.int64))),
                 np.float32)
    w[np.arange(w.shape[0]), j] = 1
    return w


def reduce_to_dense(g: Graph) -> Graph:
    fresh = fresh_namer(g)
    ops = []
    for op in g.ops:
        x = op.inputs[0]
        if op.kind != "reduce" or op.attrs["fn"] != "sum" or x.type.dtype != F32:
            ops.append(op)
            continue
        shape = x.type.shape
        w = member_matrix(shape, sorted(ax % len(shape) for ax in op.attrs["axes"]))
        row = Value(fresh(f"{x.name}_row"), TensorType(F32, (1, x.type.numel)))
        ops.append(Op("reshape", [x], [row], {"shape": [1, x.type.numel]}, op.origin))
        ops.append(Op("dense", [row, const(fresh(f"{op.output.name}_sum"), w)], op.outputs,
                      {"shape": list(op.output.type.shape), "act": "none"}, op.origin))
    g.ops = ops
    return g
