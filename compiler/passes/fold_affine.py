"""Folding of per-feature affine ops into a dense layer (fixed-point
pipeline only).

Guarantees: every ``sub``/``add``/``mul``/``div`` of a constant that varies
only along the feature axis (shape [K], [1, K] or a scalar), whose result is
used only by a ``dense`` op, is removed and absorbed into that dense op's
weights and bias, in float64:
    dense(x - c) = x @ w + (b - c @ w)        dense(x / c) = x @ (w / c[:, None]) + b
    dense(x + c) = x @ w + (b + c @ w)        dense(x * c) = x @ (c[:, None] * w) + b
and so is one applied to the output of a dense op without activation that
has no other use (y = dense(x) * c + d: an output's de-normalization):
    dense(x) - c: b - c        dense(x) / c: w / c, b / c
    dense(x) + c: b + c        dense(x) * c: w * c, b * c
so normalization layers such as (x - mean) / std or min-max scaling cost
nothing at run time.  A fold whose weights or bias would not be finite in
float32 (a divisor of 0) is refused naming both nodes.  The result equals the original function up to float
rounding; the float pipeline does not run this pass, because it keeps
ONNX's exact operation order.
"""
from __future__ import annotations

import numpy as np

from ..errors import KmlcError
from ..ir import Graph, Op, const, fresh_namer


def _feature_vector(c, k: int) -> np.ndarray | None:
    """``c`` as a length-K vector if it is constant along all but the last axis."""
    d = np.asarray(c.data, dtype=np.float64)
    if d.size == 1:
        return np.full(k, d.reshape(()))
    squeezed = d.reshape(-1) if d.ndim >= 1 and d.size == d.shape[-1] else None
    return squeezed if squeezed is not None and squeezed.size == k else None


def _origin(*ops: Op) -> tuple:
    """The ONNX nodes of ops folded into one, each named once (ReduceMean's
    sum and division are one node)."""
    return tuple(dict.fromkeys(n for op in ops for n in op.origin))


def _fold_once(g: Graph, fresh) -> bool:
    producers, users = g.producers(), g.users()
    for d in g.ops:
        if d.kind != "dense":
            continue
        x = d.inputs[0]
        p = producers.get(x)
        if p is None or p.kind not in ("add", "sub", "mul", "div") or x in g.outputs:
            continue
        if len(users.get(x, [])) != 1:
            continue
        a, b = p.inputs
        if b.is_const and not a.is_const:
            v, c = a, b
        elif a.is_const and not b.is_const and p.kind in ("add", "mul"):
            v, c = b, a
        else:
            continue
        if v.type != x.type:
            continue
        w = d.inputs[1].data.astype(np.float64)
        k = w.shape[0]
        cv = _feature_vector(c, k)
        if cv is None:
            continue
        bias = (d.inputs[2].data.astype(np.float64) if len(d.inputs) == 3
                else np.zeros(w.shape[1]))
        if bias.ndim == 2:
            continue  # a per-row bias: leave it alone
        alpha = d.attrs.get("alpha", 1.0)  # dense is act(alpha * x @ w + b)
        with np.errstate(all="ignore"):
            if p.kind == "sub":
                bias = bias - alpha * (cv @ w)
            elif p.kind == "add":
                bias = bias + alpha * (cv @ w)
            elif p.kind == "mul":
                w = cv[:, None] * w
            else:
                w = w / cv[:, None]
            w32, b32 = w.astype(np.float32), bias.astype(np.float32)
        if not (np.all(np.isfinite(w32)) and np.all(np.isfinite(b32))):
            raise KmlcError(f"node {' + '.join(p.origin + d.origin)}: folding the "
                            f"{p.kind} into the dense layer gives weights that are not finite "
                            "in float32 (a divisor of 0?); fixed point needs finite weights")
        ins = [v, const(fresh(f"{d.inputs[1].name}_f"), w32),
               const(fresh(f"{d.inputs[1].name}_fb"), b32)]
        fused = Op("dense", ins, d.outputs, dict(d.attrs), _origin(p, d))
        g.ops = [fused if o is d else o for o in g.ops if o is not p]
        return True
    return False


def _fold_after_once(g: Graph, fresh) -> bool:
    producers, users = g.producers(), g.users()
    for p in g.ops:
        if p.kind not in ("add", "sub", "mul", "div"):
            continue
        a, b = p.inputs
        x, c = (a, b) if b.is_const and not a.is_const else \
            (b, a) if a.is_const and not b.is_const and p.kind in ("add", "mul") else (None, None)
        d = producers.get(x) if x is not None else None
        if d is None or d.kind != "dense" or d.attrs.get("act", "none") != "none" \
                or x in g.outputs or len(users.get(x, [])) != 1 or p.output.type != x.type:
            continue
        w = d.inputs[1].data.astype(np.float64)
        cv = _feature_vector(c, w.shape[1])
        if cv is None:
            continue
        bias = (d.inputs[2].data.astype(np.float64) if len(d.inputs) == 3
                else np.zeros(w.shape[1]))
        if bias.ndim == 2:
            continue
        alpha = d.attrs.get("alpha", 1.0)      # dense is alpha * x @ w + b: scale both
        with np.errstate(all="ignore"):
            if p.kind in ("add", "sub"):
                bias = bias + cv if p.kind == "add" else bias - cv
            else:
                f = cv if p.kind == "mul" else 1.0 / cv
                w, bias = w * f[None, :], bias * f
            w32, b32 = w.astype(np.float32), bias.astype(np.float32)
        if not (np.all(np.isfinite(w32)) and np.all(np.isfinite(b32))):
            raise KmlcError(f"node {' + '.join(d.origin + p.origin)}: folding the "
                            f"{p.kind} into the dense layer gives weights that are not finite "
                            "in float32 (a divisor of 0?); fixed point needs finite weights")
        ins = [d.inputs[0], const(fresh(f"{d.inputs[1].name}_f"), w32),
               const(fresh(f"{d.inputs[1].name}_fb"), b32)]
        fused = Op("dense", ins, p.outputs, dict(d.attrs, alpha=alpha), _origin(d, p))
        g.ops = [fused if o is p else o for o in g.ops if o is not d]
        return True
    return False


def fold_affine(g: Graph) -> Graph:
    fresh = fresh_namer(g)
    while _fold_once(g, fresh) or _fold_after_once(g, fresh):
        pass
    return g
