"""Static overflow proof for integer graphs.

Propagates integer intervals from the inputs (any int32 value at all: the
proof does not trust calibration) through every op, and for each one:
  * ``qinput``: round_shift(x - centre, shift) of every int32 x, exactly
    (shift >= 1 keeps it in int32);
  * ``qdense``: bounds every partial sum of every output channel by
    |b[n]| + sum_k |w[n, k]| * max|x| (so the bound holds whatever the
    order of the additions; ``x_max`` records max|x|), picks an int32
    accumulator when that fits and int64 otherwise (or the one ``acc_pin``
    names, for kmlc pack: failing where the bound does not fit it), and
    fails naming the node if even int64 does not; a
    layer on an encoded input (int32) is bounded twice: for inputs within
    int16 (its accumulator and multipliers, as above) and over every int32
    input (``wide_bound`` and ``x_max_wide``, below 2^62: the exact path,
    whose requantization multiplies in 128 bits; ``wide_pin`` forces the
    choice);
  * every requantization: chooses the integer multiplier for the recorded
    real scale with ``qmath.multiplier`` under the proven bound, so that
    |acc| * mult < 2^63 and kml_requant is exact; the multiplier keeps 31
    bits where it can, 26 in dense layers (packed with the shift in one
    u32 per channel);
  * ``trees``: |sum| <= |base| + the sum over trees of the largest |leaf|
    (exact integers, below 2^TREE_BITS), whatever path a row takes;
  * ``qsoftmax``: differences from the maximum fit in 17 bits and the sum of
    at most 65535 Q0.15 values fits in 32;
  * ``qlin``: its sum, or a product's (a - za) * (b - zb) * M, below 2^62;
  * ``qtab``: between its table's least and greatest entries.
Afterwards every integer op carries its accumulator type and its
(mult, shift) pairs, ``intervals`` holds the proven range of every value,
and ``in_range`` the encoded inputs' range for inputs in the calibrated
ranges (int16).
"""
from __future__ import annotations

import numpy as np

from ..errors import KmlcError
from ..ir import I32, I64, Graph, Op, Value, const
from ..qmath import multiplier, requant, round_shift
from .quantize import TREE_BITS, tree_leaves, tree_sum_bound

S32_MAX = 2**31 - 1
S64_LIMIT = 2**62  # keep accumulators well clear of the s64 edge
# A dense layer stores each channel's (mult, shift) as one u32 word,
# mult << 6 | shift (kml_rq_mult/kml_rq_shift): multipliers keep 26 bits.
RQ_MULT_BITS = 26


def _mults(op: Op, scales, bound: int, bits: int = 31) -> tuple[list[int], list[int]]:
    try:
        pairs = [multiplier(float(s), bound, mult_bits=bits) for s in np.atleast_1d(scales)]
    except ValueError as e:      # a scale that is not finite, positive and < 2^30
        _fail(op, f"{e}; fixed point cannot requantize it (compile with --numerics float)")
    return [m for m, _ in pairs], [s for _, s in pairs]


def _bits(bound: int) -> int:
    """The multiplier bits ``qmath.multiplier`` can keep under ``bound``."""
    return min(31, 63 - max(bound, 1).bit_length())


def _fail(op: Op, msg: str):
    raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: {msg}")


def bound_ranges(g: Graph) -> Graph:
    iv: dict[Value, tuple[int, int]] = {
        v: (0, 1) if v.type.dtype.name == "bool" else (int(np.iinfo(v.type.dtype.np).min),
                                                       int(np.iinfo(v.type.dtype.np).max))
        for v in g.inputs}
    for op in g.ops:
        x = op.inputs[0]
        xl, xh = (int(x.data.min()), int(x.data.max())) if x.is_const else iv[x]
        a = op.attrs
        if op.kind == "qinput":
            # an int64 input saturates to int32 first (kml_sat_s32)
            xl, xh = max(xl, -2**31), min(xh, S32_MAX)
            c, s = np.array(a["center"]), np.array(a["shift"])
            out = (int(round_shift(xl - c, s).min()), int(round_shift(xh - c, s).max()))
            if a.get("saturate"):
                out = (max(out[0], -2**31), min(out[1], S32_MAX))
            if out[0] < -2**31 or out[1] > S32_MAX:
                _fail(op, f"encoded inputs reach {out}, beyond int32")
        elif op.kind == "qdense":
            w, b = op.inputs[1], op.inputs[2]
            wsum = np.abs(w.data.astype(np.int64)).sum(axis=1).astype(object)
            bias = np.abs(b.data).astype(object)
            x_max = max(abs(xl), abs(xh))
            worst = int(max(bias + wsum * x_max))
            a["x_max"] = x_max
            pinned = "acc_pin" in a     # kmlc pack: the compiled model's choices
            if x.type.dtype == I32:
                # an encoded input: where its whole int32 range would cost
                # the int32 accumulator or multiplier bits, values within
                # int16 take the proven paths below and any other the exact
                # wide path, whose sums ``worst`` bounds
                fast = int(max(bias + wsum * 32768))
                if worst >= S64_LIMIT:
                    _fail(op, f"accumulator bound {worst} over every int32 input does not fit "
                          "in int64")
                wide = worst > S32_MAX and (fast <= S32_MAX or _bits(worst) < _bits(fast))
                if a.get("wide_pin", wide):
                    a["wide_bound"], a["x_max_wide"], a["x_max"] = worst, x_max, 32768
                    worst = fast
            if worst >= S64_LIMIT:
                _fail(op, f"accumulator bound {worst} does not fit in int64")
            acc = "i32" if worst <= S32_MAX else "i64"
            if pinned and acc != a["acc_pin"]:
                if a["acc_pin"] == "i32":
                    _fail(op, f"the new weights bound |acc| by {worst}, beyond the compiled "
                          "model's 32-bit accumulator; recompile the model instead")
                acc = "i64"
            a["acc"] = acc
            a["acc_bound"] = worst
            op.inputs[2] = const(b.name, b.data.astype(I32.np if acc == "i32" else I64.np))
            a["mult"], a["shift"] = _mults(op, a["scale"], worst, RQ_MULT_BITS)
            if "scale_neg" in a:
                a["mult_neg"], a["shift_neg"] = _mults(op, a["scale_neg"], worst, RQ_MULT_BITS)
            out = (a["lo"], a["hi"]) if a["mode"] == "clamp" else \
                ((0, 32767) if a["fn"] == "sigmoid" else (-32767, 32767))
        elif op.kind == "qact":
            if a["mode"] == "requant":       # |x| * mult < 2^63: kml_requant is exact
                dev = max(abs(xl), abs(xh))
                (m,), (s,) = _mults(op, a["scale"], dev)
                a["mult"], a["shift"] = m, s
                ends = requant(np.array([xl, xh]), m, s) + a["zp"]
                out = (max(int(ends.min()), a["lo"]), min(int(ends.max()), a["hi"]))
            elif a["mode"] == "clamp":
                out = (max(xl, a["lo"]), min(xh, a["hi"]))
            elif a["mode"] == "round":       # quantize.py sized zp_out for the whole input
                out = (a["lo"], a["hi"])
            else:
                dev = max(abs(xl - a["zp"]), abs(xh - a["zp"]))
                (m,), (s,) = _mults(op, a["scale"], dev)
                a["mult"], a["shift"] = m, s
                out = (-32768, 32767) if a["mode"] in ("leaky", "neg", "abs") else \
                    ((0, 32767) if a["fn"] == "sigmoid" else (-32767, 32767))
        elif op.kind == "trees":
            # every sum: |base| + the largest |leaf| of each tree, from the tables
            rest = op.inputs[6:]
            leaves = tree_leaves(op.inputs[4].data, op.inputs[5].data, a["branches"])
            hi = tree_sum_bound(op.inputs[2].data, rest[0].data if a["sparse"] else None, leaves,
                                rest[-1].data if a["base"] else None, a["targets"])
            if hi >= 2**TREE_BITS:
                _fail(op, f"tree sums reach {hi}, beyond 2^{TREE_BITS}")
            out = (-int(hi), int(hi))
        elif op.kind == "qsoftmax":
            n = x.type.shape[a["axis"] % len(x.type.shape)]
            if n >= 65536:
                _fail(op, f"softmax over {n} values: the Q0.15 sum needs n < 65536")
            (m,), (s,) = _mults(op, a["scale"], xh - xl)
            a["mult"], a["shift"] = m, s
            out = (0, 32767)
        elif op.kind == "argmax":
            n = x.type.shape[a["axis"] % len(x.type.shape)]
            out = (0, n - 1)
        elif op.kind == "reshape":
            out = (xl, xh)
        elif op.kind in ("compare", "not", "and", "or"):
            out = (0, 1)
        elif op.kind in ("where", "max", "min", "transpose", "slice", "expand", "concat",
                         "reduce"):      # a choice among, or copies of, the operands' values
            vals = [iv[v] if not v.is_const else (int(v.data.min()), int(v.data.max()))
                    for v in (op.inputs[1:] if op.kind == "where" else op.inputs)]
            out = (min(v[0] for v in vals), max(v[1] for v in vals))
        elif op.kind == "qlin":        # |acc| < 2^62: every term of kml_round_shift's
            da = max(abs(xl - a["za"]), abs(xh - a["za"]))
            if len(op.inputs) == 1:
                acc = da * abs(a["ma"])
            else:
                t = op.inputs[1]
                tl, th = (int(t.data.min()), int(t.data.max())) if t.is_const else iv[t]
                tm = max(abs(tl), abs(th))
                acc = da * max(abs(tl - a["zb"]), abs(th - a["zb"])) * abs(a["ma"]) \
                    if a.get("prod") else da * tm if a.get("table") == "mult" else \
                    da * abs(a["ma"]) + (
                    tm if a.get("table") == "offset" else
                    max(abs(tl - a["zb"]), abs(th - a["zb"])) * abs(a["mb"]))
            if acc >= 2**62:
                _fail(op, f"its sums reach {acc}, beyond 2^62")
            a["acc_bound"] = int(acc)
            out = (-32768, 32767)
        elif op.kind == "qtab":        # between two of its table's entries
            t = op.inputs[1].data
            out = (int(t.min()), int(t.max()))
        elif op.kind == "gather":      # a table's values, or the fill
            out = (min(xl, a.get("fill", 0)), max(xh, a.get("fill", 0)))
        elif op.kind == "cast":
            t = op.output.type.dtype
            lim = (0, 1) if t.name == "bool" else (int(np.iinfo(t.np).min),
                                                    int(np.iinfo(t.np).max))
            out = lim if t.name == "bool" or not (lim[0] <= xl and xh <= lim[1]) else (xl, xh)
        else:
            raise KmlcError(f"bound_ranges: unexpected op {op.kind}")
        iv[op.output] = out
    g.intervals = iv
    # what the encoded inputs reach from the calibrated ranges: int16 (the
    # domain of passes/error_bound.py's bound)
    g.in_range = {op.output: (-32768, 32767) for op in g.ops if op.kind == "qinput"}
    return g
