"""The IR's op set: a type rule and a reference evaluator for every op kind.

The type rule (``infer``) gives an op's result types from its operand types
and attributes; the verifier checks every op against it.  The evaluator
(``evaluate``) computes the op in numpy with exactly the float32 operations
and order of the generated C (see ``kmlc.fmath``).  Constant folding uses the
evaluator, so a folded constant has the bits the module would compute, and
``interpret`` runs a whole graph, which is how tests check that a pass
preserves a graph's meaning bit for bit.

Op kinds and their semantics (shapes are static; all float math is f32):

  add, sub, mul, div (a, b)        elementwise with numpy broadcasting
  relu, sigmoid, tanh (x)          elementwise, kml_math.h
  leaky_relu (x) {alpha}           x < 0 ? alpha * x : x
  clip (x) {min, max}              min(max(x, min), max)
  softmax (x) {axis}               exp(x - max) / sum, summed in index order
  argmax (x) {axis, keepdims, select_last_index} -> i64
  reshape (x) {shape}              same elements, new static shape
  matmul (a, b)                    numpy matmul (1-D operands promoted)
  gemm (a, b, [c]) {alpha, beta, transA, transB}
                                   alpha * op(a) @ op(b) + beta * c
  dense (x, w, [b]) {alpha, act, act_params, shape}
                                   act(alpha * x2d @ w + b) with x2d = x
                                   viewed as [M, K], w [K, N], b [N] or
                                   [M, N]; result reshaped to ``shape``.
                                   alpha is omitted when it is 1.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import fmath, qmath
from .ir import BOOL, DTYPES, F32, I16, I32, I64, Graph, IRError, TensorType, Value


@dataclass(frozen=True)
class OpDef:
    kind: str
    infer: Callable[[list[TensorType], dict], list[TensorType]]
    evaluate: Callable[[list[np.ndarray], dict], list[np.ndarray]]


OPS: dict[str, OpDef] = {}


def infer_types(kind: str, types: list[TensorType], attrs: dict) -> list[TensorType]:
    if kind not in OPS:
        raise IRError(f"unknown op kind {kind!r}")
    return OPS[kind].infer(types, attrs)


def evaluate(kind: str, arrays: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return OPS[kind].evaluate(arrays, attrs)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _f32_only(types: list[TensorType]) -> None:
    for t in types:
        _need(t.dtype == F32, f"operand type {t} is not f32")


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None


# ---- elementwise ----------------------------------------------------------

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _binary_infer(types, attrs):
    _need(len(types) == 2, "takes 2 operands")
    _f32_only(types)
    return [TensorType(F32, broadcast_shape(types[0].shape, types[1].shape))]


def _binary_eval_for(kind):
    return lambda xs, attrs: [_BINARY[kind](xs[0], xs[1]).astype(np.float32)]


for _k in _BINARY:
    OPS[_k] = OpDef(_k, _binary_infer, _binary_eval_for(_k))


def _unary_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    _f32_only(types)
    return [types[0]]


def _activation_eval_for(kind):
    return lambda xs, attrs: [fmath.activation(xs[0], kind, attrs)]


for _k in fmath.ACTIVATIONS:
    OPS[_k] = OpDef(_k, _unary_infer, _activation_eval_for(_k))


# ---- float math ------------------------------------------------------------
# exp, log, sqrt, reciprocal and erf on runtime f32: kml_math.h's, mirrored
# by kmlc.fmath (sqrt and reciprocal are IEEE's, correctly rounded; exp, log
# and erf are approximations with the measured bounds of docs/numerics.md).
# pow has an evaluator but no kernel: the frontend writes a runtime power
# by a constant as products, sqrt and reciprocal, and fold_constants
# computes a pow of constants (in f64, rounded once to f32).

MATH = {"exp": lambda x: fmath.expf(x), "log": lambda x: fmath.logf(x),
        "sqrt": lambda x: fmath.sqrtf(x), "erf": lambda x: fmath.erff(x),
        "reciprocal": lambda x: (np.float32(1) / np.asarray(x, np.float32)).astype(np.float32)}


def _math_for(fn):
    return lambda xs, attrs: [np.asarray(fn(xs[0]), dtype=np.float32)]


for _k, _fn in MATH.items():
    OPS[_k] = OpDef(_k, _unary_infer, _math_for(_fn))
OPS["pow"] = OpDef("pow", _binary_infer, lambda xs, attrs: [
    np.power(np.asarray(xs[0], np.float64), np.asarray(xs[1], np.float64)).astype(np.float32)])
FOLD_ONLY = {"pow"}


# ---- data movement -------------------------------------------------------------
# Ops that only select and place elements, of any element type: each is a
# strided copy (passes/lower.py's ``move`` kernel), but gather by runtime
# indices, which reads its indices (``gather``).  They compute nothing, so
# both numerics carry them on the values' own encodings.
#
#   transpose (x) {perm}
#   slice (x) {starts, steps, shape}   y[i] = x[start + i * step] per axis,
#                                      steps may be negative; normalized:
#                                      every index it reads is in range
#   concat (x0, x1, ...) {axis}
#   expand (x) {shape}                 numpy broadcasting of x to shape
#   gather (x, idx: i32|i64) {axis, fill?}
#                                      np.take; a negative index counts from
#                                      the end; an index outside [-n, n)
#                                      gives ``fill`` (default 0; fixed
#                                      point's zero point, the real 0),
#                                      as onnxruntime refuses it and the
#                                      kernel must not read outside x

def _transpose_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    perm = list(attrs["perm"])
    _need(sorted(perm) == list(range(len(types[0].shape))), f"bad perm {perm}")
    return [TensorType(types[0].dtype, tuple(types[0].shape[p] for p in perm))]


def _slice_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    shape, starts, steps = types[0].shape, attrs["starts"], attrs["steps"]
    out = tuple(attrs["shape"])
    _need(len(starts) == len(steps) == len(out) == len(shape), "slice rank mismatch")
    for d, (n, s, st, e) in enumerate(zip(shape, starts, steps, out)):
        _need(st != 0 and e >= 1 and 0 <= s < n and 0 <= s + (e - 1) * st < n,
              f"slice of axis {d} reads outside it")
    return [TensorType(types[0].dtype, out)]


def _slice_eval(xs, attrs):
    idx = [s + np.arange(e) * st for s, st, e in zip(attrs["starts"], attrs["steps"],
                                                     attrs["shape"])]
    return [np.ascontiguousarray(xs[0][np.ix_(*idx)]) if idx else xs[0].copy()]


def _concat_infer(types, attrs):
    _need(len(types) >= 1, "takes at least 1 operand")
    d = types[0].dtype
    rank = len(types[0].shape)
    axis = _axis(attrs, rank)
    _need(all(t.dtype == d for t in types), "concat operands differ in type: "
          + ", ".join(str(t) for t in types))
    for t in types:
        _need(len(t.shape) == rank and all(a == b for i, (a, b) in
                                           enumerate(zip(t.shape, types[0].shape)) if i != axis),
              "concat operands' shapes differ off the axis: "
              + ", ".join(str(list(t.shape)) for t in types))
    shape = list(types[0].shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(d, tuple(shape))]


def _expand_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    shape = tuple(attrs["shape"])
    _need(broadcast_shape(types[0].shape, shape) == shape,
          f"cannot expand {list(types[0].shape)} to {list(shape)}")
    return [TensorType(types[0].dtype, shape)]


def _gather_infer(types, attrs):
    _need(len(types) == 2, "takes 2 operands")
    _need(types[1].dtype in (I32, I64), f"gather indices of {types[1].dtype}, not i32 or i64")
    x = types[0].shape
    axis = _axis(attrs, len(x))
    return [TensorType(types[0].dtype, x[:axis] + types[1].shape + x[axis + 1:])]


def _gather_eval(xs, attrs):
    x, idx = xs
    axis = _axis(attrs, x.ndim)
    n = x.shape[axis]
    i = np.asarray(idx, np.int64)
    ok = (i >= -n) & (i < n)
    y = np.take(x, np.where(ok, i % n if n else 0, 0), axis=axis)
    mask = ok.reshape((1,) * axis + ok.shape + (1,) * (x.ndim - axis - 1))
    return [np.where(mask, y, np.array(attrs.get("fill", 0), x.dtype)).astype(x.dtype)]


OPS["transpose"] = OpDef("transpose", _transpose_infer,
                         lambda xs, attrs: [np.ascontiguousarray(np.transpose(xs[0], attrs["perm"]))])
OPS["slice"] = OpDef("slice", _slice_infer, _slice_eval)
OPS["concat"] = OpDef("concat", _concat_infer, lambda xs, attrs: [
    np.concatenate(xs, axis=_axis(attrs, xs[0].ndim))])
OPS["expand"] = OpDef("expand", _expand_infer, lambda xs, attrs: [
    np.ascontiguousarray(np.broadcast_to(xs[0], tuple(attrs["shape"])))])
OPS["gather"] = OpDef("gather", _gather_infer, _gather_eval)
MOVES = ("transpose", "slice", "concat", "expand")


# ---- reductions ---------------------------------------------------------------
#   reduce (x) {fn: sum|prod|max|min, axes, keepdims}
#       each result runs over the reduced elements in row-major order of
#       the reduced axes, one at a time: sum from 0, prod from 1, max/min
#       from the first element (kml_maxf/kml_minf: NaN wins)

def _reduce_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    _need(attrs["fn"] in ("sum", "prod", "max", "min"), f"unknown reduction {attrs['fn']}")
    t = types[0]
    _need(t.dtype == F32 or attrs["fn"] in ("max", "min"), f"{attrs['fn']} of {t}")
    rank = len(t.shape)
    axes = [a % rank for a in attrs["axes"]] if rank else []
    _need(len(set(axes)) == len(axes), f"repeated axes {attrs['axes']}")
    shape = [1 if i in axes else n for i, n in enumerate(t.shape)] if attrs["keepdims"] else \
        [n for i, n in enumerate(t.shape) if i not in axes]
    return [TensorType(t.dtype, tuple(shape))]


def _reduce_eval(xs, attrs):
    x = np.asarray(xs[0])
    rank = x.ndim
    axes = sorted(a % rank for a in attrs["axes"])
    kept = [i for i in range(rank) if i not in axes]
    r = np.transpose(x, kept + axes).reshape([x.shape[i] for i in kept] + [-1])
    fn = attrs["fn"]
    if fn == "sum":
        acc = np.zeros(r.shape[:-1], x.dtype)
        for j in range(r.shape[-1]):
            acc = (acc + r[..., j]).astype(x.dtype)
    elif fn == "prod":
        acc = np.ones(r.shape[:-1], x.dtype)
        for j in range(r.shape[-1]):
            acc = (acc * r[..., j]).astype(x.dtype)
    else:
        pick = _max_min(np.greater_equal if fn == "max" else np.less_equal)
        acc = r[..., 0]
        for j in range(1, r.shape[-1]):
            acc = pick([acc, r[..., j]], {})[0]
    shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if attrs["keepdims"] else \
        [x.shape[i] for i in kept]
    return [np.asarray(acc, x.dtype).reshape(shape)]


# ---- decisions --------------------------------------------------------------------
# Comparisons, selection, logic, casts, rounding and min/max on runtime
# tensors, in both numerics (the integer forms come from passes/quantize.py).
# Every evaluator is the C of kml_elem.h / kml_math.h, and both are ONNX's
# semantics with these choices where ONNX leaves the result open (written in
# docs/numerics.md):
#   cast f32 -> i32/i64    truncation toward zero; NaN and values outside the
#                          target's range give its minimum (what x86's
#                          cvttss2si gives, and so onnxruntime on x86)
#   cast to a narrower int, abs/neg of the minimum integer: two's complement
#                          wrap-around (numpy's and onnxruntime's results)
#   max/min of floats      NaN wins; max(-0, +0) is its first operand (numpy)
#   round                  half to even, like ONNX
#
#   compare (a, b) {cmp: gt|ge|lt|le|eq|ne} -> bool, numpy broadcasting; integer
#                           operands may differ in width (fixed point's thresholds)
#   where (c: bool, a, b)   c ? a : b, broadcast
#   not (x: bool); and, or (a: bool, b: bool)
#   cast (x) {to: f32|i32|i64|bool, or i16 in fixed point}
#   floor, ceil, round (x: f32)
#   max, min (a, b); abs, neg (x): f32, i32 or i64

NUMERIC = (F32, I16, I32, I64)       # int16: fixed point's activations
INTEGER = (I16, I32, I64, BOOL)
CMP = {"gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal,
       "eq": np.equal, "ne": np.not_equal}


def _same_dtype(types, allowed, what):
    d = types[0].dtype
    _need(all(t.dtype == d for t in types), f"{what} operands differ in type: "
          + ", ".join(str(t) for t in types))
    _need(d in allowed, f"{what} of {d}, not " + " or ".join(str(a) for a in allowed))
    return d


def _compare_infer(types, attrs):
    _need(len(types) == 2, "takes 2 operands")
    _need(attrs["cmp"] in CMP, f"unknown comparison {attrs['cmp']}")
    if not all(t.dtype in INTEGER for t in types):   # integers compare exactly across widths
        _same_dtype(types, NUMERIC, "comparison")
    return [TensorType(BOOL, broadcast_shape(types[0].shape, types[1].shape))]


def _where_infer(types, attrs):
    _need(len(types) == 3, "takes 3 operands")
    _need(types[0].dtype == BOOL, f"where condition {types[0]} is not bool")
    d = _same_dtype(types[1:], NUMERIC + (BOOL,), "where")
    return [TensorType(d, broadcast_shape(*(t.shape for t in types)))]


def _logic_infer(types, attrs):
    _need(len(types) in (1, 2), "takes 1 or 2 operands")
    _same_dtype(types, (BOOL,), "logic")
    return [TensorType(BOOL, broadcast_shape(*(t.shape for t in types)))]


def _numeric_infer(types, attrs):
    _need(len(types) in (1, 2), "takes 1 or 2 operands")
    d = _same_dtype(types, NUMERIC, "arithmetic")
    return [TensorType(d, broadcast_shape(*(t.shape for t in types)))]


def _cast_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    _need(types[0].dtype in NUMERIC + (BOOL,), f"cast of {types[0]}")
    _need(attrs["to"] in ("f32", "i16", "i32", "i64", "bool"), f"cast to {attrs['to']}")
    return [TensorType(DTYPES[attrs["to"]], types[0].shape)]


def cast_eval(x: np.ndarray, to: str) -> np.ndarray:
    """kml_elem.h's casts (see above): numpy's, but for floats to integers."""
    dt = DTYPES[to].np
    if to in ("i32", "i64") and x.dtype == np.float32:
        info = np.iinfo(dt)
        ok = (x >= np.float32(info.min)) & (x < -np.float32(info.min))   # NaN: False
        return np.where(ok, np.trunc(np.where(ok, x, 0)).astype(dt), dt(info.min))
    if to == "bool":
        return x != 0
    return x.astype(dt)


OPS["compare"] = OpDef("compare", _compare_infer,
                       lambda xs, attrs: [CMP[attrs["cmp"]](xs[0], xs[1])])
OPS["where"] = OpDef("where", _where_infer, lambda xs, attrs: [np.where(xs[0], xs[1], xs[2])])
OPS["not"] = OpDef("not", _logic_infer, lambda xs, attrs: [np.logical_not(xs[0])])
OPS["and"] = OpDef("and", _logic_infer, lambda xs, attrs: [np.logical_and(xs[0], xs[1])])
OPS["or"] = OpDef("or", _logic_infer, lambda xs, attrs: [np.logical_or(xs[0], xs[1])])
OPS["cast"] = OpDef("cast", _cast_infer, lambda xs, attrs: [cast_eval(xs[0], attrs["to"])])
for _k, _fn in {"floor": np.floor, "ceil": np.ceil, "round": np.round}.items():
    OPS[_k] = OpDef(_k, _unary_infer, (lambda fn: lambda xs, attrs: [fn(xs[0])])(_fn))


def _max_min(ge):
    """kml_maxf/kml_minf: (a >= b || a is NaN) ? a : b (<= for min), which
    fixes the sign of max(-0, +0) too; plain for integers."""
    def ev(xs, attrs):
        a, b = np.broadcast_arrays(xs[0], xs[1])
        keep = ge(a, b) | (np.isnan(a) if a.dtype.kind == "f" else False)
        return [np.where(keep, a, b)]
    return ev


OPS["max"] = OpDef("max", _numeric_infer, _max_min(np.greater_equal))
OPS["min"] = OpDef("min", _numeric_infer, _max_min(np.less_equal))
OPS["abs"] = OpDef("abs", _numeric_infer, lambda xs, attrs: [np.abs(xs[0])])
OPS["reduce"] = OpDef("reduce", _reduce_infer, _reduce_eval)
OPS["neg"] = OpDef("neg", _numeric_infer, lambda xs, attrs: [np.negative(xs[0])])
ELEMENTWISE = ("compare", "where", "not", "and", "or", "cast", "floor", "ceil", "round",
               "max", "min", "abs", "neg")


# ---- reductions -----------------------------------------------------------

def _axis(attrs: dict, rank: int) -> int:
    axis = attrs["axis"]
    _need(-rank <= axis < rank, f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _softmax_infer(types, attrs):
    out = _unary_infer(types, attrs)
    _axis(attrs, len(types[0].shape))
    return out


OPS["softmax"] = OpDef("softmax", _softmax_infer,
                       lambda xs, attrs: [fmath.softmaxf(xs[0], _axis(attrs, xs[0].ndim))])


def _argmax_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    _need(types[0].dtype in (F32, I16, I64), f"argmax of {types[0]}")
    shape = list(types[0].shape)
    axis = _axis(attrs, len(shape))
    if attrs["keepdims"]:
        shape[axis] = 1
    else:
        del shape[axis]
    return [TensorType(I64, tuple(shape))]


def _argmax_eval(xs, attrs):
    axis = _axis(attrs, xs[0].ndim)
    idx = fmath.argmax(xs[0], axis, bool(attrs["select_last_index"]))
    return [np.expand_dims(idx, axis) if attrs["keepdims"] else idx]


OPS["argmax"] = OpDef("argmax", _argmax_infer, _argmax_eval)


# ---- shape ----------------------------------------------------------------

def _reshape_infer(types, attrs):
    _need(len(types) == 1, "takes 1 operand")
    shape = tuple(attrs["shape"])
    out = TensorType(types[0].dtype, shape)
    _need(out.numel == types[0].numel, f"cannot reshape {types[0]} to {list(shape)}")
    return [out]


OPS["reshape"] = OpDef("reshape", _reshape_infer,
                       lambda xs, attrs: [xs[0].reshape(attrs["shape"])])


# ---- matrix products --------------------------------------------------------

def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    _need(len(a) >= 1 and len(b) >= 1, "matmul operands must have rank >= 1")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    _need(a2[-1] == b2[-2], f"matmul inner dimensions differ: {a} @ {b}")
    out = broadcast_shape(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(types, attrs):
    _need(len(types) == 2, "takes 2 operands")
    _f32_only(types)
    return [TensorType(F32, matmul_shape(types[0].shape, types[1].shape))]


def _matmul_eval(xs, attrs):
    a, b = xs
    out_shape = matmul_shape(a.shape, b.shape)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    return [fmath.matmul_seq(a2, b2).reshape(out_shape)]


OPS["matmul"] = OpDef("matmul", _matmul_infer, _matmul_eval)


def _gemm_mn(types, attrs):
    a, b = types[0].shape, types[1].shape
    _need(len(a) == 2 and len(b) == 2, "gemm operands A and B must be 2-D")
    m, k = a[::-1] if attrs["transA"] else a
    k2, n = b[::-1] if attrs["transB"] else b
    _need(k == k2, f"gemm inner dimensions differ: {a} and {b} with transA={attrs['transA']}, "
          f"transB={attrs['transB']}")
    if len(types) == 3:
        _need(broadcast_shape(types[2].shape, (m, n)) == (m, n),
              "gemm C does not broadcast to [M, N]")
    return m, n


def _gemm_infer(types, attrs):
    _need(len(types) in (2, 3), "takes 2 or 3 operands")
    _f32_only(types)
    m, n = _gemm_mn(types, attrs)
    return [TensorType(F32, (m, n))]


def _gemm_eval(xs, attrs):
    a = xs[0].T if attrs["transA"] else xs[0]
    b = xs[1].T if attrs["transB"] else xs[1]
    y = fmath.matmul_seq(a, b)
    alpha, beta = np.float32(attrs["alpha"]), np.float32(attrs["beta"])
    if alpha != 1:
        y = alpha * y
    if len(xs) == 3:
        y = y + (beta * xs[2] if beta != 1 else xs[2])
    return [y.astype(np.float32)]


OPS["gemm"] = OpDef("gemm", _gemm_infer, _gemm_eval)


def _dense_infer(types, attrs):
    _need(len(types) in (2, 3), "takes 2 or 3 operands")
    _f32_only(types)
    x, w = types[0], types[1]
    _need(len(w.shape) == 2, "dense weight must be 2-D [K, N]")
    k, n = w.shape
    _need(len(x.shape) >= 1 and x.shape[-1] == k, f"dense input {x} does not end in K={k}")
    m = x.numel // k
    if len(types) == 3:
        _need(types[2].shape in ((n,), (m, n)), f"dense bias {types[2]} is not [{n}] or [{m},{n}]")
    out = TensorType(F32, tuple(attrs["shape"]))
    _need(out.numel == m * n, f"dense result {out} does not hold {m}x{n} values")
    _need(attrs["act"] == "none" or attrs["act"] in fmath.ACTIVATIONS, f"unknown act {attrs['act']}")
    return [out]


def _dense_eval(xs, attrs):
    w = xs[1]
    x = xs[0].reshape(-1, w.shape[0])
    y = fmath.matmul_seq(x, w)
    if "alpha" in attrs:
        y = np.float32(attrs["alpha"]) * y
    if len(xs) == 3:
        y = y + xs[2]
    y = fmath.activation(y, attrs["act"], attrs.get("act_params", {}))
    return [y.reshape(attrs["shape"])]


OPS["dense"] = OpDef("dense", _dense_infer, _dense_eval)


# ---- tree ensembles ---------------------------------------------------------
#   trees (x [R, F], threshold [N], leaf [L, K] | [L], feature [N], next [N, 2],
#          root [T], [leaf_target [L]], [flags [N]], [base [K]])
#         {targets: K, depth, branches: B, mode, aggregate, sparse, flags, base}
#         -> [R, K]
# N = B + L nodes: B branches, then the L leaves, whose both next entries
# are themselves.  Every row walks each of the T trees from its root for
# exactly ``depth`` steps (no tree is deeper: frontends/onnx_trees.py
# proves it; a leaf reached early stays): at node i it tests x[feature[i]]
# against threshold[i] (``mode``: le lt ge gt eq ne, or "mixed": flags[i]
# & 7 names the test, in that order) and goes to next[i][0] if the test
# holds, else next[i][1].  With ``flags``, bit 3 of flags[i] sends a NaN
# (missing) value to next[i][0] (float only).  Node B + l is leaf l.  The
# leaves' values are summed per target over the trees in order from 0.0:
# dense leaves [L, K] add a row to every target, sparse ones (``sparse``)
# add leaf[l] to target leaf_target[l].  aggregate "average" then divides
# the sums by T; with ``base``, base[k] is added last.  Float sums are
# float32, in that order; integer sums (fixed point: x, threshold and leaf
# integers) are exact (passes/bound_ranges.py proves the sums' bound).

TREE_MODES = ("le", "lt", "ge", "gt", "eq", "ne")


def _trees_infer(types, attrs):
    x, thr, leaf, feature, nxt, root = types[:6]
    _need(len(types) == 6 + bool(attrs["sparse"]) + bool(attrs["flags"]) + bool(attrs["base"]),
          "trees operands")
    _need(len(x.shape) == 2, f"trees input {x} is not [rows, features]")
    _need(x.dtype == F32 and thr.dtype == F32 and leaf.dtype == F32 or
          x.dtype in (I32, I64) and thr.dtype in (I32, I64) and leaf.dtype in (I32, I64),
          f"trees of {x} with thresholds {thr} and leaves {leaf}")
    n = thr.shape[0]
    _need(feature.shape == (n,) and nxt.shape == (n, 2), "trees node tables differ in length")
    _need(n == attrs["branches"] + leaf.shape[0], f"trees of {n} nodes: {attrs['branches']} "
          f"branches and {leaf.shape[0]} leaves")
    _need(attrs["mode"] in TREE_MODES + ("mixed",), f"unknown tree mode {attrs['mode']}")
    _need(len(leaf.shape) == (1 if attrs["sparse"] else 2), f"trees leaves {leaf}")
    k = attrs["targets"]
    _need(attrs["sparse"] or leaf.shape[1] == k, f"trees leaves {leaf} for {k} targets")
    _need(not attrs["base"] or types[-1].shape == (k,) and types[-1].dtype == leaf.dtype,
          f"trees base values {types[-1]} for {k} targets of {leaf.dtype}")
    return [TensorType(leaf.dtype, (x.shape[0], k))]


def _trees_eval(xs, attrs):
    x, thr, leaf, feature, nxt, root = xs[:6]
    rest = list(xs[6:])
    target = rest.pop(0) if attrs["sparse"] else None
    flags = rest.pop(0) if attrs["flags"] else np.zeros(thr.shape, np.uint8)
    base = rest.pop(0) if attrs["base"] else None
    n, rows = attrs["branches"], np.arange(x.shape[0])[:, None]
    idx = np.broadcast_to(root.astype(np.int64), (x.shape[0], root.shape[0])).copy()
    codes = flags & 7 if attrs["mode"] == "mixed" else \
        np.full(thr.shape, TREE_MODES.index(attrs["mode"]), np.uint8)
    for _ in range(attrs["depth"]):
        v, t = x[rows, feature[idx].astype(np.int64)], thr[idx]
        tests = [f(v, t) for f in (np.less_equal, np.less, np.greater_equal, np.greater,
                                   np.equal, np.not_equal)]
        go = np.choose(codes[idx], tests)
        if x.dtype == np.float32:
            go = go | (np.isnan(v) & (flags[idx] & 8 != 0))
        idx = np.where(go, nxt[idx, 0], nxt[idx, 1]).astype(np.int64)
    assert (idx >= n).all(), "a tree deeper than its depth"
    lv = idx - n
    k = attrs["targets"]
    # each row's leaves [row, tree, target] (a sparse leaf adds to its one
    # target, nothing to the others), summed in tree order from zero, as
    # the C: accumulate adds in sequence, in the leaves' type
    terms = np.zeros((x.shape[0], root.shape[0] + 1, k), leaf.dtype)
    if attrs["sparse"]:
        trees = np.arange(root.shape[0])[None, :]
        terms[rows, trees + 1, target[lv].astype(np.int64)] = leaf[lv]
    else:
        terms[:, 1:] = leaf[lv]
    acc = np.add.accumulate(terms, axis=1, dtype=leaf.dtype)[:, -1]
    if attrs["aggregate"] == "average":
        acc = (acc / np.float32(root.shape[0])).astype(leaf.dtype)
    if base is not None:
        acc = (acc + base).astype(leaf.dtype)
    return [acc]


OPS["trees"] = OpDef("trees", _trees_infer, _trees_eval)


# ---- fixed point ---------------------------------------------------------------
# Integer ops made by passes/quantize.py; passes/bound_ranges.py then proves
# their ranges and sets the integer multipliers (mult, shift) the evaluators
# and the C use.  Every evaluator is kml_fixed.h's arithmetic via kmlc.qmath.
#
#   qinput (x: i32 | i64) {center, shift}  per element of x, exact, no clamp:
#       y = round_shift(x - center, shift)   (i32: shift >= 1); an i64 x (an
#       integer feature) saturates to int32 first; with saturate (integer
#       features, whose shift may be 0) y saturates to int32 too
#   qdense (x: i16 | i32, w [N, K] i8|i16, b [N] i32|i64) {acc, mode, mult, shift, ...}
#       acc[n] = b[n] + x[0]*w[n,0] + x[1]*w[n,1] + ...   (exact integers; an
#       i32 x is a qinput's: its values beyond int16 take the exact wide path)
#       mode clamp: y = clamp(requant(acc, mult[n], shift[n]) + zp, lo, hi), and
#                   with mult_neg/shift_neg, acc < 0 uses those (leaky relu),
#                   on -acc when flip (a negative slope)
#       mode lut:   y = f_q15(clamp(requant(acc, mult[n], shift[n]), s32))
#   qact (x: i16) {mode, zp, ...}
#       clamp: y = clamp(x, lo, hi)
#       neg, abs: y = clamp(zp_out + requant(-(x - zp) or |x - zp|, mult, shift), i16)
#       round: y = zp_out + fn((x - zp) * mult / 2^shift), fn floor | ceil | round
#              (half to even), exact in integers; the compiler proves y in int16
#       leaky: y = x >= zp ? x : clamp(zp + requant(x - zp, mult, shift), i16)
#              (requant(zp - x, ...) when flip: a negative slope)
#       lut:   y = f_q15(clamp(requant(x - zp, mult, shift), s32))
#       requant: y = clamp(requant(x, mult, shift) + zp, lo, hi), x i32 or i64
#              (a tree ensemble's sums), y i16 or i32 as ``to`` says
#   qsoftmax (x: i16) {axis, mult, shift}: Q0.15 probabilities, see kml_fixed.h
# All results are i16, but qinput's (i32) and qact requant's (``to``).

S32 = (-(2**31), 2**31 - 1)
S16 = (-32768, 32767)


def _q_infer(dtype_in):
    def infer(types, attrs):
        _need(types[0].dtype == dtype_in, f"operand type {types[0]} is not {dtype_in}")
        return [TensorType(I16, tuple(attrs.get("shape", types[0].shape)))]
    return infer


# Saturations, counted as kml_fixed.h's kml_count16 and kml_sat_s32_n count
# them in the C (the entry point's return value): ``saturations`` turns the
# count on while it runs the graph.
_SATURATED: contextvars.ContextVar[list | None] = contextvars.ContextVar("saturated",
                                                                        default=None)


def _count(v, lo: int | None, hi: int | None, where=True) -> None:
    """Count the elements of ``v`` below ``lo`` or above ``hi`` (None: that
    side is not an encoding's end but an op's bound, and does not count)."""
    n = _SATURATED.get()
    if n is not None:
        out = np.zeros(np.shape(v), bool)
        if lo is not None:
            out |= v < lo
        if hi is not None:
            out |= v > hi
        n[0] += int(np.count_nonzero(out & where))


def _qinput_eval(xs, attrs):
    x = xs[0].reshape(-1).astype(np.int64)
    if attrs.get("saturate") and xs[0].dtype == np.int64:
        _count(x, *S32)
    x = qmath.clamp(x, *S32)                 # an int64 input saturates
    y = qmath.round_shift(x - np.array(attrs["center"]), np.array(attrs["shift"]))
    if attrs.get("saturate"):
        _count(y, *S32)
        y = qmath.clamp(y, *S32)
    return [y.reshape(xs[0].shape)]


def _activate(v: np.ndarray, attrs: dict, mult, shift, mult_neg=None, shift_neg=None):
    """Requantize accumulators ``v`` and apply the op's output stage."""
    if attrs["mode"] == "lut":
        r = qmath.clamp(qmath.requant(v, mult, shift), *S32)
        return qmath.LUT_EVAL[attrs["fn"]](r)
    r = qmath.requant(v, mult, shift)
    if mult_neg is not None:
        neg = -v if attrs.get("flip") else v       # a negative slope
        r = np.where(v < 0, qmath.requant(neg, mult_neg, shift_neg), r)
    # a floor at or above the zero point (ReLU, Clip from 0 up) is the op's
    # own: values below it are not saturated (passes/lower.py: "relu")
    floor_is_op = attrs["lo"] >= attrs["zp"] and mult_neg is None
    _count(r + attrs["zp"], -32768 if attrs["lo"] == -32768 and not floor_is_op else None,
           32767 if attrs["hi"] == 32767 else None)
    return qmath.clamp(r + attrs["zp"], attrs["lo"], attrs["hi"])


def _qdense_eval(xs, attrs):
    x, w = xs[0].reshape(-1).astype(np.int64), xs[1].astype(np.int64)
    acc = xs[2].astype(np.int64) if len(xs) == 3 else np.zeros(w.shape[0], np.int64)
    acc = acc + w @ x       # exact int64 (wrapping, as any order would)
    neg = (np.array(attrs["mult_neg"]), np.array(attrs["shift_neg"])) \
        if "mult_neg" in attrs else (None, None)
    y = _activate(acc, attrs, np.array(attrs["mult"]), np.array(attrs["shift"]), *neg)
    return [y.reshape(attrs["shape"])]


def _qdense_infer(types, attrs):
    x, w = types[0], types[1]
    _need(x.dtype in (I16, I32), f"qdense input {x} is neither i16 nor i32 (an input's)")
    _need(len(w.shape) == 2 and w.shape[1] == x.numel, f"qdense weight {w} vs input {x}")
    return [TensorType(I16, tuple(attrs["shape"]))]


def _qact_eval(xs, attrs):
    x = xs[0].astype(np.int64)
    if attrs["mode"] == "requant":
        r = qmath.requant(x, attrs["mult"], attrs["shift"]) + attrs["zp"]
        _count(r, *(S16 if attrs["to"] == "i16" else S32))
        return [qmath.clamp(r, attrs["lo"], attrs["hi"])]
    if attrs["mode"] == "clamp":
        return [qmath.clamp(x, attrs["lo"], attrs["hi"])]
    if attrs["mode"] in ("neg", "abs"):     # y = zp_out + requant(-d or |d|), d = x - zp
        d = x - attrs["zp"]
        d = -d if attrs["mode"] == "neg" else np.abs(d)
        r = attrs["zp_out"] + qmath.requant(d, attrs["mult"], attrs["shift"])
        _count(r, *S16)
        return [qmath.clamp(r, *S16)]
    if attrs["mode"] == "round":            # y = zp_out + fn((x - zp) * mult / 2^shift)
        k = qmath.round_q((x - attrs["zp"]) * attrs["mult"], attrs["shift"], attrs["fn"])
        return [attrs["zp_out"] + k]
    if attrs["mode"] == "leaky":
        d = attrs["zp"] - x if attrs.get("flip") else x - attrs["zp"]
        r = attrs["zp"] + qmath.requant(d, attrs["mult"], attrs["shift"])
        _count(r, *S16, where=x < attrs["zp"])
        return [np.where(x >= attrs["zp"], x, qmath.clamp(r, *S16))]
    return [_activate(x - attrs["zp"], attrs, attrs["mult"], attrs["shift"])]


def _qsoftmax_eval(xs, attrs):
    axis = _axis(attrs, xs[0].ndim)
    x = np.moveaxis(xs[0].astype(np.int64), axis, -1)
    m = x.max(axis=-1, keepdims=True)
    d = qmath.clamp(qmath.requant(x - m, attrs["mult"], attrs["shift"]), -32768, 0)
    e = qmath.exp_q15(d)
    s = e.sum(axis=-1, keepdims=True)
    y = np.minimum((e * 32768 + s // 2) // s, 32767)
    return [np.moveaxis(y, -1, axis)]


def _qinput_infer(types, attrs):
    _need(types[0].dtype in (I32, I64), f"qinput operand {types[0]} is not i32 or i64")
    return [TensorType(I32, types[0].shape)]


OPS["qinput"] = OpDef("qinput", _qinput_infer, _qinput_eval)
OPS["qdense"] = OpDef("qdense", _qdense_infer, _qdense_eval)
def _qact_infer(types, attrs):
    if attrs["mode"] != "requant":
        return _q_infer(I16)(types, attrs)
    _need(types[0].dtype in (I32, I64), f"requant of {types[0]}")
    _need(attrs["to"] in ("i16", "i32"), f"requant to {attrs['to']}")
    return [TensorType(DTYPES[attrs["to"]], types[0].shape)]


OPS["qact"] = OpDef("qact", _qact_infer, _qact_eval)


# qlin (a: i16[, b: i16 | i64 table]) {za, ma, zb?, mb?, table?, shift, zp}
#   y = clamp16(round(((a - za) * ma [+ (b - zb) * mb | + b]) / 2^shift) + zp),
#   or with table "mult" round((a - za) * b / 2^shift) + zp: a linear
#   function of one or two activations (broadcast as numpy does), a
#   constant operand's per-element multipliers or offsets in a table of
#   int64; ties away from zero (kml_round_shift), leaving int16 counted.
#   With prod, the product of two activations (kml_qmul):
#   y = clamp16(round((a - za) * (b - zb) * ma / 2^shift) + zp).

def _qlin_infer(types, attrs):
    _need(types[0].dtype == I16, f"qlin of {types[0]}")
    return [TensorType(I16, broadcast_shape(*(t.shape for t in types)))]


def _qlin_eval(xs, attrs):
    d = xs[0].astype(np.int64) - attrs["za"]
    b = xs[1].astype(np.int64) if len(xs) == 2 else None
    table = attrs.get("table")
    acc = d * (b - attrs["zb"]) * attrs["ma"] if attrs.get("prod") else \
        d * b if table == "mult" else d * attrs["ma"] + (
        0 if b is None else b if table == "offset" else (b - attrs["zb"]) * attrs["mb"])
    r = qmath.round_shift(acc, attrs["shift"]) + attrs["zp"]
    _count(r, *S16)
    return [qmath.clamp(r, *S16).astype(np.int16)]


OPS["qlin"] = OpDef("qlin", _qlin_infer, _qlin_eval)


# qtab (x: i16, t: i16) {o, down, m, k, umax}: y = kml_tab(t, x, o, down, m,
#   k, umax), a function of an activation (exp, log, sqrt, erf, reciprocal)
#   by a table of its encoded values, linear between them; with sat [A, B],
#   an input outside it (its exact result beyond the encoding) is counted.

def _qtab_infer(types, attrs):
    _need(types[0].dtype == I16 and types[1].dtype == I16, f"qtab of {types[0]}, {types[1]}")
    _need(attrs["m"] + attrs["k"] <= 16 and 0 <= attrs["umax"] < 65536, "qtab layout")
    need = int(qmath.tab_index(np.array([attrs["umax"]]), attrs["m"], attrs["k"])[0][0]) + 2
    _need(types[1].shape == (need,), f"qtab table {types[1]}, {need} entries needed")
    return [TensorType(I16, types[0].shape)]


def _qtab_eval(xs, attrs):
    a = attrs
    if a.get("sat"):          # inputs whose exact result lies beyond the encoding
        _count(xs[0], *a["sat"])
    return [qmath.tab(xs[1], xs[0], a["o"], a["down"], a["m"], a["k"], a["umax"]
                      ).astype(np.int16)]


OPS["qtab"] = OpDef("qtab", _qtab_infer, _qtab_eval)
OPS["qsoftmax"] = OpDef("qsoftmax", _q_infer(I16), _qsoftmax_eval)


# ---- whole graphs -------------------------------------------------------------

def interpret(g: Graph, *inputs: np.ndarray) -> list[np.ndarray]:
    """Run ``g`` on numpy inputs with the reference evaluator; float32
    outputs with their NaNs canonical, as the C's entry point leaves them
    (kml_canon_nan_f32, docs/numerics.md)."""
    env = run_all(g, *inputs)
    return [canon_nan(v.data if v.is_const else env[v]) for v in g.outputs]


CANONICAL_NAN = np.uint32(0x7FC00000).view(np.float32)


def canon_nan(a: np.ndarray) -> np.ndarray:
    """``a`` with every float32 NaN the quiet NaN 0x7fc00000."""
    a = np.asarray(a)
    if a.dtype != np.float32 or not np.isnan(a).any():
        return a
    return np.where(np.isnan(a), CANONICAL_NAN, a).astype(np.float32)


def saturations(g: Graph, *inputs: np.ndarray) -> int:
    """How many values an integer graph saturates on these inputs: what its
    C entry point returns."""
    token = _SATURATED.set([0])
    try:
        run_all(g, *inputs)
        return _SATURATED.get()[0]
    finally:
        _SATURATED.reset(token)


def run_all(g: Graph, *inputs: np.ndarray) -> dict[Value, np.ndarray]:
    """Every value ``g`` computes for these inputs (the evaluator's trace)."""
    env: dict[Value, np.ndarray] = {}
    for v, x in zip(g.inputs, inputs, strict=True):
        env[v] = np.asarray(x, dtype=v.type.dtype.np).reshape(v.type.shape)

    def get(v: Value) -> np.ndarray:
        return v.data if v.is_const else env[v]

    for op in g.ops:
        outs = evaluate(op.kind, [get(v) for v in op.inputs], op.attrs)
        for v, y in zip(op.outputs, outs, strict=True):
            env[v] = np.asarray(y, dtype=v.type.dtype.np).reshape(v.type.shape)
    return env
