"""The compiler's own error bound for a fixed-point graph.

Runs after bound_ranges (it needs the integer multipliers and the proven
ranges) and changes no op.  It propagates, layer by layer, a bound on
|decoded integer value - the float graph's value in exact arithmetic| for
every element, and records in ``QuantInfo``:
  * ``output_bounds``: per output, ``error_bound`` (real units; for a class
    index output, ``gap``: the class agrees with float on every row whose
    float top-2 gap exceeds it);
  * ``layer_bounds``: per layer, (output value, node names, the error its
    own requantization adds, the total bound at its output).

The bound holds on every input row whose features lie in the calibrated
input ranges and whose activations stay inside their int16 encodings (the
calibration rows do: each encoding is their range widened by ``margin``).
It counts, in this order for each layer:
  * input encoding: round(x * 2^F) then round_shift, at most half a step;
  * dense: sum_k |w_int[k,n]| E[k] + sum_k |w_int - w|[k,n] max|x_k - m_k|
    + |b_int - b'| (weights and biases as the integers stand for them; b'
    the corrected bias b - m . (w_int - w), m the mean calibrated input, so
    that the weights' rounding counts only at x's distance from m);
  * requantization: half a step of rounding plus max|acc| * |mult / 2^shift
    - scale| (the multiplier's own error, large when a huge proven
    accumulator leaves it few bits), max|acc| taken over the accumulators
    whose output does not saturate;
  * activations: their Lipschitz constants (ReLU, Clip 1 plus half a step
    for Clip's rounded bounds; LeakyRelu max(1, |alpha|); sigmoid 1/4;
    tanh 1) times the input's bound, plus for table lookups the table's own
    error, computed from kml_lut.h over every index;
  * tree ensembles: half a step of the sums per leaf and base value added
    (their tests are exact on the encoded inputs); their requantization
    like a dense layer's;
  * products of two activations: A E_b + B E_a + E_a E_b (A, B the
    operands' largest magnitudes) plus the requantization's;
  * functions by a table (exp, log, sqrt, erf, 1/x): the steepest slope
    over the input's reach times its bound, plus the table's largest error
    over every input code (computed at compile time, exhaustively);
  * softmax: 1/2 times the input's bound (softmax's gradient rows have
    1-norm 2 p (1 - p) <= 1/2), plus the exp table's error eta relayed
    through the division: eta (n + 1) / (1 - n eta), plus the division's
    rounding.
Float32 rounding of the reference itself is not counted; the checks in
tests add onnxruntime's float32 tolerance.  docs/numerics.md, "The
compiler's error bound", says how to read the bound.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..ir import Graph
from .. import qmath

Q15 = 2.0 ** -15


@lru_cache(maxsize=None)
def lut_error(fn: str) -> float:
    """max |f_q15(t) / 2^15 - f(t / 2^F)| over every int32 t (the table
    saturates at |t| = 32767; the tail beyond is added), in real units."""
    t = np.arange(-32768, 32768, dtype=np.int64)
    if fn == "exp":
        t = t[t <= 0]
        got = qmath.exp_q15(t) * Q15
        ref = np.exp(t / 2.0 ** qmath.EXP_IN_FRAC)
        tail = math.exp(-32767 / 2.0 ** qmath.EXP_IN_FRAC)
    else:
        frac = qmath.LUT_FUNCS[fn]
        got = qmath.LUT_EVAL[fn](t) * Q15
        ref = (1 / (1 + np.exp(-t / 2.0 ** frac))) if fn == "sigmoid" else np.tanh(t / 2.0 ** frac)
        edge = 32767 / 2.0 ** frac
        tail = (1 - 1 / (1 + math.exp(-edge))) if fn == "sigmoid" else 1 - math.tanh(edge)
    return float(np.abs(got - ref).max()) + tail


LIPSCHITZ = {"sigmoid": 0.25, "tanh": 1.0}


def tab_lipschitz(a: dict, lo: int, hi: int, ex: float) -> float:
    """max |f'| of a qtab's function over its input codes [lo, hi] widened
    by ``ex`` (real units) on each side, at the codes inside f's domain whose
    exact value lies inside the output's encoding.  Between two codes |f'|
    is monotone for every function tabulated (erf's extremum, at 0, is a
    code), so the codes' largest is the range's; for log, sqrt and 1/x the
    bound holds for float values at least one input step from 0."""
    from .quantize import TAB_DERIV, TAB_DOMAIN, QParams, tab_ideal

    sx, zx = a["in"]
    qx, qy = QParams(sx, zx), QParams(*a["out"])
    ext = int(min(math.ceil(ex / sx), 65536)) if math.isfinite(ex) else 65536
    codes = np.arange(lo - ext, hi + ext + 1, dtype=np.int64)
    r = (codes - zx) * sx
    ok = TAB_DOMAIN.get(a["fn"], lambda v: np.ones(v.shape, bool))(r)
    y = tab_ideal(a["fn"], codes, qx, qy)
    ok &= np.isfinite(y) & (y >= -32768) & (y <= 32767)
    with np.errstate(all="ignore"):
        d = np.abs(TAB_DERIV[a["fn"]](r[ok]))
    return float(d.max(initial=0.0))


def _requant_error(acc_max: float, mult, shift, scale) -> np.ndarray:
    """In output steps: rounding plus the multiplier's error at the worst
    proven accumulator."""
    m = np.asarray(mult, dtype=np.float64) * np.ldexp(1.0, -np.asarray(shift))
    return 0.5 + acc_max * np.abs(m - np.asarray(scale, dtype=np.float64))


def _flat(x, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float64).reshape(-1), (n,)).copy() \
        if np.size(x) in (1, n) else np.asarray(x, dtype=np.float64).reshape(-1)


def error_bound(g: Graph, info) -> Graph:
    E: dict = {}
    iv = {**g.intervals, **g.in_range}     # inputs in their calibrated ranges
    scale_of = lambda v: info.params[v].scale if v in info.params else 1.0  # noqa: E731
    zp_of = lambda v: info.params[v].zp if v in info.params else 0  # noqa: E731
    for op in g.ops:
        a, x, y = op.attrs, op.inputs[0], op.output
        n = y.type.numel
        layer = " + ".join(op.origin) or op.kind
        req = 0.0
        if op.kind == "qinput":
            E[y] = 0.5 + 0.5 * np.ldexp(1.0, -np.array(a["shift"], dtype=np.int64)).astype(float)
            continue
        if op.kind == "reshape":
            E[y] = E.get(x, 0.0)
            continue
        if op.kind in ("compare", "not", "and", "or", "cast"):
            # integers and bools: exact from their operands (a comparison
            # with a real threshold flips only where its operand is within
            # that operand's own bound of it)
            E[y] = np.zeros(n)
            continue
        if op.kind in ("where", "max", "min", "transpose", "slice", "expand", "concat",
                       "reduce", "gather"):
            # a selection or a copy: one operand's error, or a rounded
            # constant's half step (the largest: E per element is not tracked
            # through the moves)
            vals = op.inputs[1:] if op.kind == "where" else op.inputs
            if op.kind == "gather":    # the table's values (the indices are exact)
                vals = [x] if y in info.params else []
            E[y] = np.full(n, max((float(np.max(E[v])) if v in E else
                                   0.5 * scale_of(y) if v.is_const else 0.0 for v in vals),
                                  default=0.0))
            continue
        if op.kind == "trees":
            # each leaf and base value rounded to the sums' step (the tests
            # are exact on the encoded inputs, so rows take float's paths
            # wherever the encoding holds their features exactly)
            E[y] = np.full(n, a["leaf_error"])
            info.layer_bounds.append((y, layer, a["leaf_error"], a["leaf_error"]))
            continue
        xl, xh = iv[x]
        sx, zx = (scale_of(x), zp_of(x))
        if op.kind == "qdense":
            r = info.dense_error[y]
            m = r["x_mean"]
            reach_x = np.maximum(sx * (xh - zx) - m, m - sx * (xl - zx)) + float(E[x].max())
            z = E[x] @ r["w_abs"] + reach_x @ r["w_err"] + r["b_err"]
            # only accumulators whose output is not saturated carry a
            # requantization error: past the clamp (or the table's end) the
            # rounded and the exact value saturate alike
            reach = 32768.0 if a["mode"] == "lut" else \
                max(abs(a["lo"] - a["zp"]), abs(a["hi"] - a["zp"])) + 1.0
            acc_max = lambda sc: np.minimum(float(a["acc_bound"]),  # noqa: E731
                                            reach / np.asarray(sc, dtype=np.float64))
            steps = _requant_error(acc_max(a["scale"]), a["mult"], a["shift"], a["scale"])
            if "mult_neg" in a:
                steps = np.maximum(steps, _requant_error(acc_max(a["scale_neg"]), a["mult_neg"],
                                                         a["shift_neg"], a["scale_neg"]))
            if a["mode"] == "lut":
                step_in = 2.0 ** -qmath.LUT_FUNCS[a["fn"]]
                req = steps * step_in * LIPSCHITZ[a["fn"]] + lut_error(a["fn"])
                E[y] = LIPSCHITZ[a["fn"]] * z + req
            else:
                sy = scale_of(y)
                req = sy * (steps + (0.5 if r["clip"] else 0.0))
                E[y] = r["lipschitz"] * z + req
        elif op.kind == "qact":
            ex = E[x]
            dev = max(abs(xl - zx), abs(xh - zx))
            if a["mode"] == "requant":
                req = scale_of(y) * float(_requant_error(dev, a["mult"], a["shift"],
                                                         a["scale"]).max())
                E[y] = ex + req
            elif a["mode"] == "clamp":
                req = 0.5 * sx           # Clip's bounds are rounded to its input's steps
                E[y] = ex + req
            elif a["mode"] in ("neg", "abs"):
                req = scale_of(y) * float(_requant_error(dev, a["mult"], a["shift"],
                                                         a["scale"]).max())
                E[y] = ex + req
            elif a["mode"] == "round":   # a step of 1 when the error crosses an integer
                req = 1.0
                E[y] = ex + req
            elif a["mode"] == "leaky":
                req = sx * float(_requant_error(dev, a["mult"], a["shift"], a["scale"]).max())
                E[y] = max(1.0, a["scale"]) * ex + req
            else:
                step_in = 2.0 ** -qmath.LUT_FUNCS[a["fn"]]
                steps = float(_requant_error(dev, a["mult"], a["shift"], a["scale"]).max())
                req = LIPSCHITZ[a["fn"]] * steps * step_in + lut_error(a["fn"])
                E[y] = LIPSCHITZ[a["fn"]] * ex + req
        elif op.kind == "qlin" and a.get("prod"):
            # a b - a' b' = a E_b + b E_a + E_a E_b (the real operands' reach
            # A, B), half an output step, and the multiplier's error over
            # the product's reach
            b = op.inputs[1]
            da = max(abs(xl - a["za"]), abs(xh - a["za"]))
            db = max(abs(iv[b][0] - a["zb"]), abs(iv[b][1] - a["zb"]))
            ea, eb = float(np.max(E[x])), float(np.max(E[b]))
            A, B = da * sx, db * scale_of(b)
            req = scale_of(y) * float(_requant_error(da * db, a["ma"], a["shift"],
                                                     a["scale"]).max())
            E[y] = A * eb + B * ea + ea * eb + req
        elif op.kind == "qtab":
            # the table's own error, and the function's steepest slope over
            # the input codes within the input's error of its proven range
            # where the exact result lies inside the output's encoding
            req = a["err"] * a["out"][0]
            E[y] = tab_lipschitz(a, xl, xh, float(np.max(E[x]))) * E[x] + req
        elif op.kind == "qlin":
            # the operands' errors times their coefficients, half an output
            # step, and each integer multiplier's and offset's rounding (at
            # most half a unit of 2^-shift) over the operand's reach
            runtime = [v for v in op.inputs if not v.is_const]
            reach = [max(abs(iv[v][0] - zp_of(v)), abs(iv[v][1] - zp_of(v))) for v in runtime]
            steps = 0.5 + (sum(reach) * 0.5 + (0.5 if a.get("table") == "offset" else 0.0)) \
                * 2.0 ** -a["shift"]
            req = scale_of(y) * steps
            E[y] = sum(c * float(np.max(E[v])) for c, v in zip(a["coef"], runtime)) + req
        elif op.kind == "qsoftmax":
            k = x.type.shape[a["axis"] % len(x.type.shape)]
            steps = float(_requant_error(xh - xl, a["mult"], a["shift"], a["scale"]).max())
            eta = lut_error("exp") + steps * 2.0 ** -qmath.EXP_IN_FRAC
            ratio = eta * (k + 1) / (1 - k * eta) if k * eta < 1 else 1.0
            req = min(1.0, ratio + 1.5 * Q15)
            E[y] = np.minimum(1.0, 0.5 * float(E[x].max()) + req)
        elif op.kind == "argmax":
            E[y] = np.full(n, float(E[x].max()))
            continue
        E[y] = _flat(E[y], n)
        info.layer_bounds.append((y, layer, float(np.max(req)), float(E[y].max())))
    for v in g.outputs:
        o = info.outputs[v.name]
        if o.get("integer"):
            continue
        if o.get("index"):
            info.output_bounds[v.name] = {"gap": 2.0 * float(E[v].max())}
        else:
            info.output_bounds[v.name] = {"error_bound": float(E[v].max())}
    return g


def requant_warnings(info, min_sqnr_db: float) -> list[str]:
    """Layers whose own requantization error bound, against the half-width
    of their calibrated range (of their int16 range where the encoding is
    not calibrated: a table's output), exceeds the noise that ``kmlc
    verify``'s SQNR threshold allows: said at compile time."""
    out = []
    limit = 10 ** (-min_sqnr_db / 20)
    for v, layer, req, _ in info.layer_bounds:
        q = info.params[v]
        half = q.span / 2 if q.span else q.scale * (q.hi - q.lo) / 2
        if half > 0 and req > limit * half:
            out.append(f"node {layer}: its requantization may be off by up to {req:.3g} "
                       f"({100 * req / half:.1f}% of its range), more than the "
                       f"{100 * limit:.1f}% that kmlc verify's {min_sqnr_db:g} dB SQNR allows")
    return out
