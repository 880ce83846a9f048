"""A bound on a float twin's rounding error, from the arithmetic.

``float_bound(graph, rows)`` evaluates kmlc's float graph (the one lowered
to C) in float64 on every row and carries, for every value, a bound on
|what the float32 C computes - the exact result|, following the order
docs/numerics.md §2 fixes.  With u = 2^-24 and gamma(n) = n u / (1 - n u):
  * constants: 4 u |c| (a constant folded from up to four float32 ops);
  * dense: |alpha| |w|^T E(x) inherited, plus gamma(K + 3) (|alpha| (|x| +
    E(x)).|w| + |b|) for the K products summed in order, alpha and the
    bias (the classic bound for a recursive dot product);
  * every rounding also 2^-149 absolute (results in the subnormal range);
  * + - * /: first-order propagation of both operands' bounds, plus u |r|
    for the rounding of the result (a division by a value its bound can
    reach zero from has no bound);
  * relu, clip: 1-Lipschitz and exact; leaky relu: max(1, |alpha|) E + u |y|;
    sigmoid: E / 4 + 2.5 ulp + 9e-8; tanh: E + 1.5 ulp + 8e-8 (the
    approximations' measured bounds, §3);
  * softmax: relative errors through exp (1 ulp), the in-order sum and the
    division;
  * reshape and the copies (transpose, slice, concat, expand, gather by
    constant indices): each value keeps its bound; argmax: its input's
    bound (an index agrees where the exact top-2 gap exceeds twice it);
  * reductions: a sum of n values in order, the sum of the bounds plus
    gamma(n) times the sum of magnitudes; a product, prod(|x| + E) -
    |prod(x)| plus gamma(n) prod(|x| + E); max and min, the largest bound;
    a gather by runtime indices, the table's where the indices are exact;
  * exp: |y| (e^E - 1) + 1 ulp; log: log(1 + E / (|x| - E)) + 1 ulp; sqrt:
    E / (sqrt(|x| - E) + sqrt(x)) + u |y|; reciprocal: E / (|x| (|x| - E))
    + u |y| (no bound where E reaches |x|); erf: 1.1284 E + 1 ulp + 6e-8.
Any other op, or a bound or value that is not finite, gives an infinite
bound: ``kmlc verify`` then falls back to its absolute and relative
tolerance for those elements.
"""
from __future__ import annotations

import numpy as np

from .ir import Graph
from .ops import CMP, ELEMENTWISE, MATH, MOVES, evaluate

U = 2.0 ** -24
ETA = 2.0 ** -149                 # absolute rounding error below the normal range
ULP = 2.0 ** -23                  # one ulp, relative, of a normal float32
APPROX = {"sigmoid": (0.25, 2.5, 9e-8), "tanh": (1.0, 1.5, 8e-8)}  # Lipschitz, ulps, abs


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _act(kind: str, params: dict, z, ez):
    """An activation's float64 value and bound at z with bound ez."""
    if kind == "none":
        return z, ez
    if kind == "relu":
        return np.maximum(z, 0), ez
    if kind == "clip":
        lo, hi = params.get("min", -np.inf), params.get("max", np.inf)
        return np.minimum(np.maximum(z, lo), hi), ez
    if kind == "leaky_relu":
        a = params.get("alpha", 0.01)
        y = np.where(z >= 0, z, a * z)
        return y, max(1.0, abs(a)) * ez + U * np.abs(y)
    if kind in APPROX:
        lip, ulps, absolute = APPROX[kind]
        y = 1 / (1 + np.exp(-z)) if kind == "sigmoid" else np.tanh(z)
        return y, lip * ez + ulps * ULP * np.abs(y) + absolute
    return z, np.full_like(z, np.inf)


def _decision(op, operands):
    """A decision op in float64, and its bound: 0 for comparisons, logic and
    casts to integers and bools, whose results kmlc verify compares
    exactly (with onnxruntime's float32 or float64 results); a rounding's
    input bound plus 1 where that bound is not 0; the operands' otherwise."""
    xs = [x for x, _ in operands]
    es = [e for _, e in operands]
    k, a = op.kind, op.attrs
    if k == "compare":
        return CMP[a["cmp"]](xs[0], xs[1]), 0.0
    if k in ("not", "and", "or"):
        f = {"not": np.logical_not, "and": np.logical_and, "or": np.logical_or}[k]
        return f(*(x != 0 for x in xs)), 0.0
    if k == "cast":
        x = xs[0]
        if a["to"] == "bool":
            return x != 0, 0.0
        if a["to"] == "f32":
            return x, es[0] + U * np.abs(x)
        return np.trunc(x), 0.0
    if k in ("floor", "ceil", "round"):
        f = {"floor": np.floor, "ceil": np.ceil, "round": np.round}[k]
        return f(xs[0]), np.where(es[0] > 0, es[0] + 1, 0.0)
    if k == "where":
        return np.where(xs[0] != 0, xs[1], xs[2]), np.maximum(es[1], es[2])
    if k in ("max", "min"):
        return (np.maximum if k == "max" else np.minimum)(xs[0], xs[1]), np.maximum(*es)
    return (np.abs if k == "abs" else np.negative)(xs[0]), es[0]


def float_bound(g: Graph, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per graph output: (float64 values, bound), each (rows, numel)."""
    R = len(rows)
    val, err = {}, {}
    off = 0
    for v in g.inputs:
        val[v] = rows[:, off:off + v.type.numel].astype(np.float64).reshape((R,) + v.type.shape)
        err[v] = np.zeros_like(val[v])
        off += v.type.numel

    def get(v):
        if v.is_const:
            c = np.asarray(v.data, np.float64)
            return c, 4 * U * np.abs(c)
        return val[v], err[v]

    with np.errstate(all="ignore"):
        for op in g.ops:
            y = op.outputs[0]
            shape = (R,) + y.type.shape
            a = op.attrs
            if op.kind == "dense":
                (x, ex), (w, ew) = get(op.inputs[0]), get(op.inputs[1])
                k = w.shape[0]
                x, ex = x.reshape(R, -1, k), ex.reshape(R, -1, k)
                alpha = float(a.get("alpha", 1.0))
                z = alpha * (x @ w)
                mag = abs(alpha) * ((np.abs(x) + ex) @ (np.abs(w) + ew))
                ez = abs(alpha) * (ex @ np.abs(w) + np.abs(x) @ ew)
                if len(op.inputs) == 3:
                    b, eb = get(op.inputs[2])
                    z, mag, ez = z + b, mag + np.abs(b), ez + eb
                ez = ez + gamma(k + 3) * mag + (k + 3) * ETA
                z, ez = _act(a["act"], a.get("act_params", {}), z, ez)
            elif op.kind in ("add", "sub", "mul", "div"):
                (p, ep), (q, eq) = get(op.inputs[0]), get(op.inputs[1])
                if op.kind == "add":
                    z, ez = p + q, ep + eq
                elif op.kind == "sub":
                    z, ez = p - q, ep + eq
                elif op.kind == "mul":
                    z, ez = p * q, np.abs(p) * eq + np.abs(q) * ep + ep * eq
                else:
                    z = p / q
                    room = np.abs(q) - eq
                    ez = np.where(room > 0, (ep + np.abs(z) * eq) / room, np.inf)
                ez = ez + U * np.abs(z)
            elif op.kind in ("relu", "clip", "leaky_relu", "sigmoid", "tanh"):
                z, ez = _act(op.kind, a, *get(op.inputs[0]))
            elif op.kind == "reshape":
                z, ez = get(op.inputs[0])
            elif op.kind == "softmax":
                x, ex = get(op.inputs[0])
                ax = a["axis"] % len(op.inputs[0].type.shape) + 1
                n = x.shape[ax]
                m = x.max(axis=ax, keepdims=True)
                rel = np.expm1(ex + ex.max(axis=ax, keepdims=True) + U * np.abs(x - m)) + 2 * ULP
                e = np.exp(x - m)
                z = e / e.sum(axis=ax, keepdims=True)
                rs = rel.max(axis=ax, keepdims=True) + gamma(n)
                ez = z * ((rel + rs) / np.maximum(1 - rs, 1e-300) + U)
            elif op.kind in ELEMENTWISE:
                z, ez = _decision(op, [get(v) for v in op.inputs])
                z = np.asarray(z, np.float64)
                ez = np.broadcast_to(ez, z.shape)
            elif op.kind in MOVES or op.kind == "gather":
                # copies: each value carries its bound along (row by row); a
                # gather's indices are exact (bound below 1) or it has none
                def arg(j, v, i, r):
                    if op.kind == "gather" and j == 1:
                        return v.data if v.is_const else get(v)[0][r].astype(np.int64)
                    return get(v)[i] if v.is_const else get(v)[i][r]

                def moved(i):
                    return np.stack([evaluate(op.kind, [arg(j, v, i, r) for j, v in
                                                        enumerate(op.inputs)], a)[0]
                                     for r in range(R)])
                z, ez = moved(0), moved(1)
                if op.kind == "gather" and not op.inputs[1].is_const:
                    idx_err = get(op.inputs[1])[1].reshape(R, -1).max(axis=1)
                    # integers within less than 1 of the exact ones are them
                    ez = np.where((idx_err < 1).reshape((R,) + (1,) * (ez.ndim - 1)), ez,
                                  np.inf)
            elif op.kind == "reduce":
                x, ex = get(op.inputs[0])
                axes = tuple(1 + ax % len(op.inputs[0].type.shape) for ax in a["axes"])
                n = int(np.prod([x.shape[i] for i in axes]))
                if a["fn"] == "sum":
                    z = x.sum(axis=axes)
                    ez = ex.sum(axis=axes) + gamma(n) * np.abs(x).sum(axis=axes)
                elif a["fn"] in ("max", "min"):
                    z = x.max(axis=axes) if a["fn"] == "max" else x.min(axis=axes)
                    ez = ex.max(axis=axes)
                else:   # |prod(x + d) - prod(x)| <= prod(|x| + E) - prod(|x|)
                    z = np.prod(x, axis=axes)
                    hi = np.prod(np.abs(x) + ex, axis=axes)
                    ez = hi - np.abs(z) + gamma(n) * hi
            elif op.kind in MATH:
                x, ex = get(op.inputs[0])
                if op.kind == "exp":
                    z = np.exp(x)
                    ez = z * np.expm1(ex) + ULP * z
                elif op.kind == "erf":
                    from math import erf
                    z = np.vectorize(erf, otypes=[float])(x) if x.size else x
                    ez = 1.1284 * ex + ULP * np.abs(z) + 6e-8
                else:
                    room = np.abs(x) - ex
                    if op.kind == "log":
                        z = np.log(x)
                        ez = np.where(room > 0, np.log1p(ex / np.maximum(room, 1e-300)), np.inf)
                        ez = ez + ULP * np.abs(z)
                    elif op.kind == "sqrt":
                        z = np.sqrt(x)
                        ez = np.where(room > 0, ex / (np.sqrt(np.maximum(room, 0)) + z), np.inf)
                        ez = ez + U * z
                    else:   # reciprocal
                        z = 1 / x
                        ez = np.where(room > 0, ex / (np.abs(x) * np.maximum(room, 1e-300)),
                                      np.inf) + U * np.abs(z)
            elif op.kind == "argmax":
                x, ex = get(op.inputs[0])
                ax = a["axis"] % len(op.inputs[0].type.shape) + 1
                z = np.argmax(x, axis=ax).astype(np.float64)
                ez = np.broadcast_to(ex.max(axis=ax), z.shape)
            else:
                z = np.zeros(shape)
                ez = np.full(shape, np.inf)
            z = np.asarray(z).reshape(shape)
            ez = np.asarray(ez, np.float64).reshape(shape) + ETA
            val[y], err[y] = z, np.where(np.isfinite(ez) & np.isfinite(z), ez, np.inf)
    return [tuple(np.broadcast_to(x, (R,) + v.type.shape).reshape(R, -1) for x in get(v))
            for v in g.outputs]
