"""Fusion of MatMul / Gemm + bias + activation into one ``dense`` op.

Guarantees:
  * every ``gemm`` with constant B and C (and transA = 0, or one row) and every
    ``matmul`` by a constant 1-D or 2-D weight becomes a ``dense`` op whose
    weight is stored [K, N] (input-major, the layout the kernel streams);
  * a following ``add`` or ``sub`` of a constant that broadcasts to the
    product's shape becomes its bias, and a following activation (relu,
    leaky_relu, sigmoid, tanh, clip) its epilogue, when the product has no
    other user and is not a graph output;
  * results are bit-identical to the unfused graph: each output is still
    the sum of the same products in k order, then ``alpha *``, then ``+ bias``
    (``x - c`` is ``x + (-c)`` in IEEE arithmetic), then the activation,
    exactly the order of the ONNX definitions.
"""
from __future__ import annotations

import numpy as np

from ..fmath import ACTIVATIONS
from ..ir import Graph, Op, Value, const, fresh_namer


def _bias(c: Value, data: np.ndarray, m: int, n: int, fresh) -> Value:
    """``data`` broadcast to [M, N] as a constant, stored [N] when all rows
    are equal; ``c`` itself when it already is exactly that."""
    full = np.broadcast_to(data, (m, n))
    data = np.ascontiguousarray(full[0] if (full == full[0]).all() else full, dtype=np.float32)
    if data.shape == c.type.shape and np.array_equal(data.view(np.uint32),
                                                     c.data.view(np.uint32)):
        return c
    return const(fresh(f"{c.name}_b"), data)


def _to_dense(op: Op, fresh) -> list[Op] | None:
    if op.kind == "gemm":
        a, b = op.inputs[:2]
        c = op.inputs[2] if len(op.inputs) == 3 else None
        if not b.is_const or (c is not None and not c.is_const):
            return None
        m, n = op.output.type.shape
        pre = []
        if op.attrs["transA"]:
            if m != 1:
                return None
            view = Value(fresh(f"{a.name}_row"), type(a.type)(a.type.dtype, (1, a.type.shape[0])))
            pre.append(Op("reshape", [a], [view], {"shape": [1, a.type.shape[0]]}, op.origin))
            a = view
        w = b.data.T if op.attrs["transB"] else b.data
        ins = [a, const(fresh(f"{b.name}_kn"), np.ascontiguousarray(w))]
        if c is not None:
            beta = np.float32(op.attrs["beta"])
            cdata = c.data if beta == 1 else beta * c.data
            ins.append(_bias(c, cdata, m, n, fresh))
        attrs = {"act": "none", "shape": [m, n]}
        if op.attrs["alpha"] != 1.0:
            attrs["alpha"] = op.attrs["alpha"]
        return pre + [Op("dense", ins, op.outputs, attrs, op.origin)]
    if op.kind == "matmul":
        x, w = op.inputs
        if not w.is_const or w.type.shape == () or len(w.type.shape) > 2:
            return None
        wd = w.data if w.data.ndim == 2 else w.data.reshape(-1, 1)
        wv = w if w.data.ndim == 2 else const(fresh(f"{w.name}_kn"), wd)
        return [Op("dense", [x, wv], op.outputs,
                   {"act": "none", "shape": list(op.output.type.shape)}, op.origin)]
    return None


def _absorb(d: Op, u: Op, fresh) -> Op | None:
    """The dense op ``d`` with its only user ``u`` folded in, or None."""
    y = d.output
    if u.kind in ("add", "sub"):
        if len(d.inputs) == 3 or d.attrs["act"] != "none":
            return None
        other = u.inputs[1] if u.inputs[0] is y else u.inputs[0]
        if (not other.is_const or u.output.type != y.type
                or (u.kind == "sub" and u.inputs[0] is not y)):
            return None
        k, n = d.inputs[1].type.shape
        cdata = -other.data if u.kind == "sub" else other.data
        bias = _bias(other, np.broadcast_to(cdata, y.type.shape).reshape(-1, n),
                     y.type.numel // n, n, fresh)
        return Op("dense", d.inputs + [bias], u.outputs, dict(d.attrs), d.origin + u.origin)
    if u.kind in ACTIVATIONS and d.attrs["act"] == "none":
        attrs = dict(d.attrs, act=u.kind)
        if u.attrs:
            attrs["act_params"] = dict(u.attrs)
        return Op("dense", d.inputs, u.outputs, attrs, d.origin + u.origin)
    return None


def fuse_dense(g: Graph) -> Graph:
    fresh = fresh_namer(g)
    ops = []
    for op in g.ops:
        ops.extend(_to_dense(op, fresh) or [op])
    g.ops = ops
    changed = True
    while changed:
        changed = False
        users = g.users()
        for i, d in enumerate(g.ops):
            if d.kind != "dense" or d.output in g.outputs or len(users.get(d.output, [])) != 1:
                continue
            u = users[d.output][0]
            fused = _absorb(d, u, fresh)
            if fused is not None:
                g.ops = [fused if o is u else o for o in g.ops if o is not d]
                changed = True
                break
    return g
