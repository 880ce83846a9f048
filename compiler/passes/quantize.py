"""Quantization: a calibrated float graph to an integer graph.

Guarantees about the graph it returns (docs/numerics.md, "Fixed point"):
  * every graph input is int32 in a per-feature Q format (``frac_bits``:
    in[i] = x_i * 2^F_i) and passes first through ``qinput``, which maps it
    around the centre of the feature's calibrated range (widened by
    ``input_margin`` of its width on each side, never across zero) with a
    power-of-two step, so that the calibrated range lands in int16; it
    clamps nothing: every int32 value is encoded exactly (an int32 result,
    the step at least 2), and the first dense layer takes values beyond
    int16 on an exact int64 path (passes/bound_ranges.py proves both);
  * every activation is int16 with a per-tensor scale and zero point chosen
    from its calibrated range scaled by ``headroom`` around zero (values
    beyond saturate); sigmoid and tanh outputs are Q0.15;
  * dense weights are symmetric per output channel, int8 or int16 as
    ``weight_bits`` says (one width, or one per layer from
    passes/choose_widths.py; a layer it does not name is int8); the
    per-feature input steps and centres are folded into the first layer's
    weights and bias; biases are integers at the accumulator's scale with
    the input zero point's term folded in, and with the weights' rounding
    error at the layer's mean calibrated input taken off (bias correction:
    b - mean(x) . (w_int - w), so that the layer's rounding error has mean
    zero over the calibration rows; Nagel et al., ICCV 2019);
  * a tree ensemble tests its graph input's integers: each threshold t on
    feature i becomes the integer the test against in[i] = x_i * 2^F_i
    decides exactly as the test against t decides for x_i (floor or ceil
    of t * 2^F_i), and its leaf values and base values become integers at
    one step 2^-S, S the largest with every sum proven within 2^TREE_BITS;
    its sums are exact int64 (int16 activations, or int32 outputs, at a
    calibrated scale where another op or the caller reads them, class
    decisions on the sums themselves);
  * a product of two activations is one kml_qmul into the output's
    calibrated encoding, a quotient a product by the divisor's reciprocal;
    exp, log, sqrt, erf and 1/x of an activation are one kml_tab, a table
    of the function's encoded values checked over every int16 input code
    (``tab_table``: its worst error is the op's ``err``);
  * every requantization is recorded as a real scale (``scale`` attributes);
    passes/bound_ranges.py turns scales into integer multipliers once it has
    proven the accumulator ranges.
Ops fixed point cannot express raise ``KmlcError`` naming the node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..calibrate import Calibration
from ..errors import KmlcError
from ..ir import BOOL, DTYPES, F32, I8, I16, I32, I64, Graph, Op, TensorType, Value, const, \
    fresh_namer
from ..qmath import LUT_FUNCS, round_shift, tab, tab_index, tab_starts

F32_MAX = float(np.finfo(np.float32).max)
# Every activation's int16 encoding spans HEADROOM times its calibrated
# range around zero, so that inputs up to 10x beyond calibration move the
# hidden layers without saturating them (the decisions of Heimdall's
# published networks on such rows: tests/e2e/test_heimdall_published.py).
# The cost is a step 10x coarser, 20 dB of activation noise that stays far
# below the weights' (int8 weights give 44-50 dB; the seed models' layer
# SQNRs and decisions are unchanged, docs/numerics.md).
HEADROOM = 10.0
# A bias takes at most 2^BIAS_BITS accumulator steps: past that the weight
# step of its channel grows (the weights' share is negligible beside the
# bias), so that requantization keeps at least 63 - 42 = 21 multiplier bits.
# A bias whose weights are all zero takes 2^ZERO_COLUMN_BITS steps.
BIAS_BITS = 40
ZERO_COLUMN_BITS = 30
# A tree ensemble's exact sums stay within 2^TREE_BITS: 2^-40 of their
# largest value per step, and 22 multiplier bits left to requantize them.
TREE_BITS = 40
# Functions of one activation that fixed point computes by a table of
# their encoded values on the input's int16 grid (qtab), and the functions'
# derivatives (passes/error_bound.py).  Outside its domain a function takes
# its value at the domain's edge: sqrt 0, log -inf (the output's lowest
# code); ONNX gives NaN there, which no integer holds.
TAB_FUNCS = {"exp": np.exp, "log": lambda r: np.log(np.maximum(r, 0.0)),
             "sqrt": lambda r: np.sqrt(np.maximum(r, 0.0)),
             "erf": np.vectorize(math.erf, otypes=[np.float64]),
             "reciprocal": lambda r: 1.0 / r}
TAB_DERIV = {"exp": np.exp, "log": lambda r: 1.0 / r, "sqrt": lambda r: 0.5 / np.sqrt(r),
             "erf": lambda r: 2.0 / math.sqrt(math.pi) * np.exp(-r * r),
             "reciprocal": lambda r: -1.0 / (r * r)}
# where the derivative is defined: log and sqrt for r > 0, 1/r for r != 0
TAB_DOMAIN = {"log": lambda r: r > 0, "sqrt": lambda r: r > 0, "reciprocal": lambda r: r != 0}
# A table has at most TAB_MAX segments (2 KiB of int16), and the fewest
# 2^k wide whose result stays within TAB_TARGET output steps of the exact
# encoded value on every input code (half a step of it the entries' own
# rounding).
TAB_MAX = 1024
TAB_TARGET = 1.0
SUPPORTED_FIXED = ("dense (MatMul/Gemm + bias)", "tree ensembles on graph inputs", "Relu",
                   "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Floor/Ceil/Round", "Abs/Neg",
                   "Softmax", "ArgMax", "Reshape/Flatten/Identity", "comparisons with a constant",
                   "Not/And/Or", "Where", "Max/Min of values on one scale", "Cast of integers "
                   "and bools, and of an integer input to float", "Transpose, Slice, Split, "
                   "Expand, Concat, ReduceMax and ReduceMin of values on one scale",
                   "Gather by integer indices", "ReduceSum and ReduceMean (as a dense layer)",
                   "Add, Sub, Mul and Div of activations and constants (a quotient by an "
                   "activation of one sign)", "Exp, Log, Sqrt, Erf and Reciprocal (by a table)")


def same_scale(*qs) -> bool:
    """Operands one integer op may combine: all exact, or all on one scale
    and zero point."""
    if all(q is EXACT for q in qs):
        return True
    return all(isinstance(q, QParams) for q in qs) and len({(q.scale, q.zp) for q in qs}) == 1


def plain_integer(v: Value, q) -> bool:
    """An integer whose value is itself: exact, or an index (scale 1, zero
    point 0, as ArgMax's), so that two compare exactly."""
    return v.type.dtype in (I32, I64) and (q is EXACT or (
        isinstance(q, QParams) and q.scale == 1.0 and q.zp == 0))


class Exact:
    """The marker of a value that fixed point holds as it is: an integer
    or bool graph input, or an integer op's result (no scale, no rounding)."""


EXACT = Exact()


@dataclass
class QParams:
    """real = scale * (q - zp); q is proven to lie in [lo, hi].  ``span``:
    the calibrated values' span (around zero), which the encoding spans
    ``headroom`` times; 0 where the encoding is not from calibration."""
    scale: float
    zp: int
    lo: int = -32768
    hi: int = 32767
    span: float = 0.0


@dataclass
class FirstLayer:
    """An encoded graph input: element k is centre[k] + step[k] * q[k]."""
    step: np.ndarray
    centre: np.ndarray


@dataclass
class QuantOptions:
    weight_bits: str | dict = "auto"           # auto | 8 | 16 | {node: 8 or 16}
    input_frac_bits: list[int] | None = None   # per input element, or one for all
    headroom: float = HEADROOM
    input_margin: float = 0.0                  # inputs' range widened by this, each side
    # the formats of a compiled model (QuantInfo.formats, from its kmlc.json):
    # every range is taken from here instead of the calibration rows, and
    # every dense layer keeps its accumulator, so that a retrained model
    # quantizes to the same structure (kmlc pack)
    pinned: dict | None = None


@dataclass
class QuantInfo:
    """What the rest of kmlc needs to know about a quantized graph.  The
    ``inputs`` and ``outputs`` entries (keyed by value name) are the fixed
    point interface: they go into the generated header and kmlc.json."""
    inputs: dict[str, dict] = field(default_factory=dict)    # frac_bits, lo, hi per element
    outputs: dict[str, dict] = field(default_factory=dict)   # scale, zp, lo, hi | index
    float_of: dict[Value, Value] = field(default_factory=dict)   # int value -> float value
    params: dict[Value, QParams] = field(default_factory=dict)
    weight_bits: dict[str, int] = field(default_factory=dict)   # node -> 8 | 16
    sqnr_int8: dict[str, float] = field(default_factory=dict)
    decision_agreement: float | None = None   # with these widths, percent (choose_widths)
    input_margin: float = 0.0                 # what the inputs' encoding was widened by
    # per qdense output: what passes/error_bound.py needs of the layer, in
    # its input's real coordinates (the first layer: the encoded steps)
    dense_error: dict[Value, dict] = field(default_factory=dict)
    output_bounds: dict[str, dict] = field(default_factory=dict)  # error_bound's result
    layer_bounds: list = field(default_factory=list)              # (layer, requant, total)
    float_graph: Graph | None = None   # the float graph that was quantized
    int_graph: Graph | None = None     # the proven integer graph
    calibration_rows: int = 0
    # the calibrated ranges quantization used (value name -> [lo, hi], lists
    # per element for graph inputs): with the dense layers' accumulators
    # (emit.fixed_interface), the formats ``QuantOptions.pinned`` replays
    formats: dict = field(default_factory=lambda: {"ranges": {}, "inputs": {}})


def _fail(op: Op, msg: str):
    raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: {msg} with --numerics fixed; "
                    f"fixed point compiles {', '.join(SUPPORTED_FIXED)}")


def layer_name(op: Op) -> str:
    """A dense layer's name in reports and ``weight_bits``: its MatMul or
    Gemm node."""
    return next((o for o in op.origin if o.endswith(("(Gemm)", "(MatMul)"))),
                op.origin[0] if op.origin else op.kind)


def layer_names(ops: list[Op]) -> list[str]:
    """Dense layers' names, in order: ``layer_name``, then " #2", " #3",
    ... after a name an earlier layer has (one ONNX node lowered to
    several layers: LayerNormalization's two means), so that widths and
    pinned formats name each layer once."""
    seen: dict[str, int] = {}
    out = []
    for op in ops:
        n = layer_name(op)
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def _check_alpha(op: Op, alpha: float) -> None:
    if not np.isfinite(alpha):
        _fail(op, f"LeakyRelu with alpha {alpha}")


def choose_frac_bits(lo: np.ndarray, hi: np.ndarray) -> list[int]:
    """Largest F in [0, 30] with max(|lo|, |hi|) * 2^F <= 2^30."""
    mag = np.maximum(np.maximum(np.abs(lo), np.abs(hi)), 1e-30)
    f = np.floor(30 - np.log2(mag)).astype(int)
    if (f < 0).any():
        i = int(np.argmax(f < 0))
        raise KmlcError(f"input feature {i} reaches {float(mag[i]):.6g} in the calibration data, "
                        "beyond what an int32 input can encode; scale it down in the model")
    return np.minimum(f, 30).tolist()


def widen(lo, hi, margin: float):
    """Per element: [lo, hi] widened by ``margin`` of its width on each
    side, without crossing zero (a non-negative feature stays one)."""
    pad = margin * (hi - lo)
    return (np.where(lo >= 0, np.maximum(lo - pad, 0), lo - pad),
            np.where(hi <= 0, np.minimum(hi + pad, 0), hi + pad))


def encode_input(lo, hi, frac_bits, min_shift: int = 1):
    """Per element: centre and shift (qinput's attributes), so that the
    calibrated range [lo, hi] maps into int16 around 0.  The shift is at
    least ``min_shift``: 1 for encoded float features, so that
    round_shift(x - centre, shift) of every int32 x fits int32 (|x - centre|
    < 2^32), exactly, with no clamp; 0 for integer features, whose unit
    steps stay exact (and whose x - centre saturates to int32, 2^31 away
    from the calibrated range)."""
    scale = np.ldexp(1.0, np.array(frac_bits))
    qlo = np.clip(np.floor(lo * scale), -2**31, 2**31 - 1).astype(np.int64)
    qhi = np.clip(np.ceil(hi * scale), -2**31, 2**31 - 1).astype(np.int64)
    centre = (qlo + qhi) // 2
    half = np.maximum(qhi - centre, centre - qlo)
    shift = np.full_like(half, min_shift)
    for i, h in enumerate(half):
        while int(round_shift(h, int(shift[i]))) > 32767:
            shift[i] += 1
    return centre, shift


def encode_rows(x: np.ndarray, frac_bits) -> np.ndarray:
    """Float feature rows as a fixed model's int32 input: in[i] =
    round(x_i * 2^F_i), ties away from zero, saturated to int32 (what the
    twin's encode and the hooks' features give the module)."""
    v = np.asarray(x, np.float64) * np.ldexp(1.0, np.asarray(frac_bits))
    v = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return np.clip(v, -2**31, 2**31 - 1).astype(np.int32)


def quantize_weights(w: np.ndarray, bits: int):
    """Symmetric per output channel (columns of w [K, N])."""
    qmax = 2 ** (bits - 1) - 1
    amax = np.abs(w).max(axis=0)
    step = np.where(amax > 0, amax / qmax, 1.0)
    q = np.clip(np.round(w / step), -qmax, qmax).astype(np.int64)
    return q, step


def rescale_for_bias(wq: np.ndarray, sw: np.ndarray, wf: np.ndarray, bias: np.ndarray,
                     sx: float) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel, a weight step at which the bias is an integer of
    at most 2^BIAS_BITS accumulator steps (a coarser step, and weights
    requantized at it, when the bias dwarfs the weights: tiny weights, a
    huge bias), and at which a bias whose weights are all zero keeps
    2^ZERO_COLUMN_BITS steps of precision instead of rounding to nothing."""
    wq, sw = wq.copy(), sw.astype(np.float64).copy()
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        steps = np.abs(bias) / (sx * sw)
    big = ~(steps <= 2.0 ** BIAS_BITS)
    zero = ~wq.any(axis=0) & (bias != 0)
    for n in np.flatnonzero(big | zero):
        sw[n] = abs(float(bias[n])) / (sx * 2.0 ** (BIAS_BITS if big[n] else ZERO_COLUMN_BITS))
        wq[:, n] = np.round(wf[:, n] / sw[n])       # |wq| only shrinks: the step grew
    return wq, sw


def exact_bias(op: Op, bias: np.ndarray, sa: np.ndarray, zx: int, wq: np.ndarray) -> np.ndarray:
    """The integer biases at accumulator scales ``sa``, the input zero
    point's term folded in: exact integers (Python ints), which must fit
    the s64 accumulator with room for the sums."""
    out = []
    for n in range(len(bias)):
        r = float(bias[n]) / float(sa[n]) if sa[n] > 0 else float("inf")
        if not np.isfinite(r):
            raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: bias {bias[n]:.6g} of "
                            f"output {n} has no integer value at its accumulator scale "
                            f"{sa[n]:.6g} with --numerics fixed")
        out.append(int(round(r)) - zx * int(wq[:, n].sum()))
    if max(map(abs, out), default=0) >= 2**62:
        raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: a bias does not fit the "
                        "64-bit accumulator with --numerics fixed")
    return np.array(out, dtype=np.int64)


def sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    noise = np.sum((ref - approx) ** 2)
    signal = np.sum(ref ** 2)
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(max(signal, 1e-300) / noise))


def clip_bounds(q: QParams, mn: float, mx: float) -> tuple[int, int]:
    """Clip(min=mn, max=mx) on int16 values of scale and zero point ``q``:
    the clamp bounds [lo, hi] inside int16, with ONNX's rule that max wins
    when mn > mx (y = min(max(x, mn), mx)), so lo <= hi always."""
    def at(v: float) -> int:
        r = q.zp + v / q.scale
        return int(min(max(round(r), -32768), 32767)) if np.isfinite(r) else \
            (32767 if r > 0 else -32768)
    hi = at(mx)
    return min(at(mn), hi), hi


def activation_params(lo: float, hi: float, headroom: float) -> QParams:
    """int16 scale and zero point for values calibrated in [lo, hi]: the
    encoding spans [headroom * min(lo, 0), headroom * max(hi, 0)], within
    float32's range (what a float model's value can reach, and what an
    output decodes to)."""
    span = max(hi, 0.0) - min(lo, 0.0)
    lo, hi = max(headroom * min(lo, 0.0), -F32_MAX), min(headroom * max(hi, 0.0), F32_MAX)
    if hi - lo <= 0:
        hi = lo + 1.0
    scale = (hi - lo) / 65535
    zp = int(np.clip(round(-32768 - lo / scale), -32768, 32767))
    return QParams(scale, zp, span=span)


def qlin_shift(largest: float) -> int:
    """The largest requantization shift S (0..62) with every multiplier
    round(m * 2^S) below 2^30, ``largest`` the greatest |m|
    (docs/numerics.md, "Arithmetic")."""
    return int(np.clip(29 - np.floor(np.log2(max(largest, 1e-300))), 0, 62))


def tab_ideal(fn: str, codes: np.ndarray, qx: QParams, qy: QParams) -> np.ndarray:
    """fn of the real values of int16 codes ``codes`` (scale and zero
    point ``qx``), in output codes of ``qy``, unrounded (inf, -inf where
    the function is)."""
    with np.errstate(all="ignore"):
        return TAB_FUNCS[fn]((codes - qx.zp) * qx.scale) / qy.scale + qy.zp


def tab_window(c: np.ndarray) -> tuple[int, int]:
    """The indices [a, b] of the codes where a function, encoded and
    saturated (``c``), is not flat: every value before a is within half a
    step of c[a], every value after b within half a step of c[b] (a
    saturated end, erf's tails, a square root's or a logarithm's edge), so
    a table need only span [a, b] and hold its ends beyond."""
    lo_max, lo_min = np.maximum.accumulate(c), np.minimum.accumulate(c)
    hi_max, hi_min = np.maximum.accumulate(c[::-1])[::-1], np.minimum.accumulate(c[::-1])[::-1]
    a = int(np.flatnonzero(lo_max - lo_min <= 0.5)[-1])
    b = int(np.flatnonzero(hi_max - hi_min <= 0.5)[0])
    return (a, max(a, b))


def tab_layouts(x0: int, x1: int):
    """kml_tab's candidate layouts for the input codes [x0, x1]: the origin
    at either end; segments 2^k wide throughout (m = 16 - k), or 2^k wide
    then 2^m to an octave (dense near the origin)."""
    umax = x1 - x0
    for o, down in ((x0, False), (x1, True)):
        for m in range(3, 17):
            for k in range(0, 17 - m):
                if m + k < 16 and (m > 10 or (umax >> (m + k)) == 0):
                    continue                   # the same segments as m = 16 - k
                count = int(tab_index(np.array([umax]), m, k)[0][0]) + 2
                if count <= TAB_MAX + 1:
                    yield o, down, m, k, umax, count


def tab_table(fn: str, qx: QParams, qy: QParams) -> dict:
    """The table of ``fn`` over the input codes [qx.lo, qx.hi] (kml_tab):
    entries at each segment's start rounded and saturated to int16, over
    the codes where ``fn`` is not flat (tab_window); of the layouts
    (tab_layouts), the one with the fewest entries within
    TAB_TARGET output steps of the exact value, else the one closest to it,
    the error measured over every input code whose exact value lies inside
    the output's encoding (the others saturate, and count as beyond it)."""
    codes = np.arange(qx.lo, qx.hi + 1, dtype=np.int64)
    ideal = tab_ideal(fn, codes, qx, qy)
    inside = np.isfinite(ideal) & (ideal >= -32768) & (ideal <= 32767)
    a, b = tab_window(np.clip(np.nan_to_num(ideal, nan=-32768.0), -32768, 32767))
    x0, x1 = qx.lo + a, qx.lo + b
    codes, ideal = codes[inside], ideal[inside]

    def error(c, on=slice(None)):
        return float(np.abs(tab(c["table"], codes[on], c["o"], c["down"], c["m"], c["k"],
                                c["umax"]) - ideal[on]).max(initial=0.0))

    best = None
    for o, down, m, k, umax, count in sorted(tab_layouts(x0, x1), key=lambda c: c[-1]):
        u = tab_starts(count, m, k)
        e = tab_ideal(fn, o - u if down else o + u, qx, qy)
        t = np.clip(np.nan_to_num(np.round(e), nan=-32768.0, posinf=32767.0, neginf=-32768.0),
                    -32768, 32767).astype(np.int16)
        c = {"o": o, "down": down, "m": m, "k": k, "umax": umax, "table": t}
        c["err"] = error(c, slice(None, None, 13))    # a lower bound of the whole error
        if c["err"] <= TAB_TARGET:
            c["err"] = error(c)
        if best is None or c["err"] < best["err"]:
            best = c
        if c["err"] <= TAB_TARGET:
            break
    best["err"] = error(best)           # over every input code
    # the input codes whose exact value the encoding holds: one range for
    # every function tabulated (a reciprocal's inputs keep one sign); the
    # kernel counts the codes beyond it as saturations
    a, b = (int(codes.min()), int(codes.max())) if len(codes) else (qx.hi + 1, qx.hi)
    best["sat"] = [a if a > qx.lo else None, b if b < qx.hi else None] \
        if a > qx.lo or b < qx.hi else None
    return best


def tree_leaves(nxt: np.ndarray, root: np.ndarray, branches: int) -> list[list[int]]:
    """Each tree's leaves (leaf indices) from its node table: node
    ``branches`` + l is leaf l, every smaller index a branch.  Each node
    is visited once (a BRANCH_MEMBER node's chain of tests shares its two
    children)."""
    out = []
    for r in root.astype(np.int64):
        stack, leaves, seen = [int(r)], [], set()
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            if i >= branches:
                leaves.append(i - branches)
            else:
                stack += [int(nxt[i, 0]), int(nxt[i, 1])]
        out.append(leaves)
    return out


def tree_sum_bound(leaf, target, leaves: list[list[int]], base, k: int):
    """max over the k targets of |base| + the sum over trees of the largest
    |vote| among the tree's ``leaves`` (exact for integers: Python ints)."""
    total = np.zeros(k, dtype=object) + (np.abs(base).astype(object) if base is not None
                                         else 0)
    for ls in leaves:
        v = np.abs(leaf[ls]).astype(object)
        if target is None:
            total = total + v.max(axis=0)
        else:
            for j in range(k):
                m = [x for x, tg in zip(v, target[ls]) if tg == j]
                total[j] = total[j] + (max(m) if m else 0)
    return max(total.tolist())


class _Quantizer:
    def __init__(self, g: Graph, cal: Calibration, opts: QuantOptions):
        if opts.pinned is not None:     # the compiled model's scaling of its ranges too
            opts = replace(opts, headroom=float(opts.pinned["headroom"]),
                           input_margin=float(opts.pinned["input_margin"]))
        self.g, self.cal, self.opts = g, cal, opts
        self.fresh = fresh_namer(g)
        self.env: dict[Value, tuple[Value, QParams | FirstLayer]] = {}
        self.ops: list[Op] = []
        self.info = QuantInfo()

    def emit(self, kind, inputs, attrs, origin, like: Value, q: QParams | FirstLayer,
             dtype=I16) -> Value:
        out = Value(self.fresh(f"{like.name}_q"), TensorType(dtype, like.type.shape))
        self.ops.append(Op(kind, inputs, [out], attrs, origin))
        self.env[like] = (out, q)
        self.info.float_of[out] = like
        if isinstance(q, QParams):
            self.info.params[out] = q
        return out

    def per_tensor(self, op: Op, v: Value) -> tuple[Value, QParams]:
        xq, q = self.narrow(v)
        if isinstance(q, FirstLayer):
            _fail(op, f"{op.kind} on a graph input (inputs must feed a dense layer)")
        if q is EXACT:
            _fail(op, f"{op.kind} on integers (Cast them to float first)")
        return xq, q

    def narrow(self, v: Value, to=I16):
        """``v`` as fixed point holds it, a tree ensemble's int64 sums
        requantized to an int16 activation (or, ``to`` I32, an int32
        output) at a scale from their calibrated range, once."""
        xq, q = self.env[v]
        if xq not in self.wide:
            return xq, q
        key = (v, to)
        if key not in self.narrowed:
            p = self.producer_of(xq)
            if to == I16:
                nq = activation_params(*self.range(v), self.opts.headroom)
            else:                      # an output: int32 steps over the same span
                mag = max(map(abs, self.range(v))) * self.opts.headroom or 1.0
                nq = QParams(mag / 2**30, 0, -2**31, 2**31 - 1)
            out = Value(self.fresh(f"{xq.name}_{to.name}"), TensorType(to, xq.type.shape))
            self.ops.append(Op("qact", [xq], [out], {"mode": "requant", "to": to.name,
                                                    "zp": nq.zp, "lo": nq.lo, "hi": nq.hi,
                                                    "scale": q.scale / nq.scale}, p.origin))
            self.info.float_of[out] = v
            self.info.params[out] = nq
            self.narrowed[key] = (out, nq)
        return self.narrowed[key]

    def producer_of(self, v: Value) -> Op:
        return next(op for op in reversed(self.ops) if v in op.outputs)

    # -- ranges: calibrated, or pinned to a compiled model's ------------------------

    def _pinned(self, kind: str, v: Value):
        pins = self.opts.pinned
        if pins is None:
            return None
        got = pins.get(kind, {}).get(v.name)
        if got is None:
            raise KmlcError(f"value '{self.g.source_name(v)}' has no recorded range in the "
                            "compiled model: its graph differs")
        return got

    def range(self, v: Value) -> tuple[float, float]:
        got = self._pinned("ranges", v)
        lo, hi = got if got is not None else self.cal.range(v)
        self.info.formats["ranges"][v.name] = [float(lo), float(hi)]
        return float(lo), float(hi)

    def input_range(self, v: Value) -> tuple[np.ndarray, np.ndarray]:
        got = self._pinned("inputs", v)
        lo, hi = (np.asarray(got[0], np.float64), np.asarray(got[1], np.float64)) \
            if got is not None else self.cal.input_range(v)
        if lo.shape != (v.type.numel,) or hi.shape != lo.shape:
            raise KmlcError(f"input '{self.g.source_name(v)}': the compiled model's recorded "
                            "range has another shape: its graph differs")
        self.info.formats["inputs"][v.name] = [lo.tolist(), hi.tolist()]
        return lo, hi

    # -- decision ops -------------------------------------------------------------------

    def operand(self, op: Op, v: Value, like: QParams | None = None):
        """``v`` as fixed point computes it: (integer value, QParams or
        EXACT).  A float constant takes the scale and zero point ``like``
        (the op's runtime operand's), and is rounded to its grid."""
        if v.is_const:
            if v.type.dtype != F32:
                return v, EXACT
            if like is None:
                _fail(op, "an op on float constants only")
            q = np.clip(np.round(v.data.astype(np.float64) / like.scale) + like.zp,
                        -32768, 32767).astype(np.int16)
            return const(self.fresh(f"{v.name}_q"), q), like
        return self.per_tensor(op, v) if self.env[v][1] is not EXACT else self.env[v]

    def runtime_q(self, op: Op) -> QParams | None:
        qs = [self.env[v][1] for v in op.inputs if not v.is_const and v in self.env]
        return next((q for q in qs if isinstance(q, QParams)), None)

    def real_operand(self, op: Op, v: Value) -> tuple[Value, float, int] | None:
        """A runtime float operand as integers q with real value (q - zp) *
        scale: an activation, or an integer input cast to float (the raw
        integers, scale 1), or None for anything else."""
        if v.is_const:
            return None
        if v in self.int_source:
            return self.int_source[v], 1.0, 0
        xq, q = self.env[v]
        return (xq, q.scale, q.zp) if isinstance(q, QParams) else None

    def compare(self, op: Op) -> None:
        """Exact against the real threshold: real(x) = (q - zp) * scale, so
        x >= t is q >= ceil(zp + t / scale), computed in rationals."""
        from fractions import Fraction

        a, b = op.inputs
        cmp = op.attrs["cmp"]
        if (a.is_const or b.is_const) and a.type.dtype == F32:
            x, t = (b, a) if a.is_const else (a, b)
            if a.is_const:                     # t OP x is x (mirrored OP) t
                cmp = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq"}[cmp]
            real = self.real_operand(op, x)
            if real is None:
                _fail(op, "a comparison of a float graph input (inputs must feed a dense "
                      "layer) or of two constants")
            xq, scale, zp = real
            thr = []
            for tv in t.data.reshape(-1).astype(np.float64):
                r = Fraction(zp) + Fraction(float(tv)) / Fraction(scale)
                fl, ce = r.numerator // r.denominator, -((-r.numerator) // r.denominator)
                thr.append({"ge": ce, "lt": ce, "gt": fl, "le": fl}.get(cmp, fl if fl == ce
                                                                          else 2**40))
            tc = const(self.fresh(f"{t.name}_thr"), np.array(thr, np.int64).reshape(t.type.shape))
            self.emit("compare", [xq, tc], {"cmp": cmp}, op.origin, op.output, EXACT,
                      dtype=BOOL)
            return
        (aq, qa), (bq, qb) = self.operand(op, a), self.operand(op, b)
        if not same_scale(qa, qb) and not (plain_integer(aq, qa) and plain_integer(bq, qb)):
            _fail(op, "a comparison of two values on different scales")
        self.emit("compare", [aq, bq], {"cmp": cmp}, op.origin, op.output, EXACT, dtype=BOOL)

    def one_scale(self, op: Op, vals: list[Value], like: QParams | None):
        """The operands of a choice or a copy on one encoding: their own
        when they share one (a float constant rounded to it), else each
        activation requantized (a qlin of one operand: one rounding) to an
        encoding of the hull of their calibrated ranges, and constants
        rounded to it; exact integers beside activations, and graph inputs,
        are refused."""
        got = [self.operand(op, v, like) for v in vals]
        if same_scale(*(q for _, q in got)):
            return got
        if not all(isinstance(q, QParams) for _, q in got):
            _fail(op, f"{op.kind} of integers and fixed-point values together")
        # the hull of the operands' calibrated ranges, so that no operand
        # saturates where its own encoding would not (a Max's smaller one)
        ends = [self.range(v) if not v.is_const else (float(v.data.min()), float(v.data.max()))
                for v in vals]
        q = activation_params(min(e[0] for e in ends), max(e[1] for e in ends),
                              self.opts.headroom)
        out = []
        for v, (vq, qv) in zip(vals, got):
            if v.is_const:
                out.append(self.operand(op, v, q))
                continue
            m = qv.scale / q.scale
            shift = qlin_shift(m)
            r = Value(self.fresh(f"{vq.name}_to_{op.output.name}"), TensorType(I16, v.type.shape))
            attrs = {"za": qv.zp, "ma": int(np.round(m * 2.0 ** shift)), "shift": shift,
                     "zp": q.zp, "coef": [1.0]}
            self.ops.append(Op("qlin", [vq], [r], attrs, op.origin))
            self.info.params[r] = q
            out.append((r, q))
        return out

    def select(self, op: Op) -> None:
        """Where, Max, Min: the result keeps its operands' scale (a float
        constant is rounded to it), or the output's own when they have two
        (``one_scale``)."""
        vals = op.inputs[1:] if op.kind == "where" else op.inputs
        like = self.runtime_q(op)
        if like is None and any(v.is_const and v.type.dtype == F32 for v in vals):
            like = activation_params(*self.range(op.output), self.opts.headroom)
        got = self.one_scale(op, vals, like)
        q = got[0][1]
        if q is not EXACT:               # the hull of the operands' proven ranges
            q = QParams(q.scale, q.zp, min(g.lo for _, g in got), max(g.hi for _, g in got))
        ins = ([self.operand(op, op.inputs[0])[0]] if op.kind == "where" else []) + \
            [v for v, _ in got]
        # the IR's type rule gave the operands one type: int16 on a scale,
        # or the exact integers' own
        self.emit(op.kind, ins, {}, op.origin, op.output, q,
                  dtype=ins[-1].type.dtype if q is EXACT else I16)

    def move(self, op: Op) -> None:
        """Transpose, Slice, Expand, Concat (copies) and ReduceMax/Min (a
        choice among its operand's values): the result keeps the encoding
        of its operands when they share one (a float constant is rounded
        to it), else the output's own (``one_scale``); graph inputs (each
        feature has its own encoding, folded into the first dense layer)
        are refused."""
        if op.kind == "reduce" and op.attrs["fn"] not in ("max", "min"):
            _fail(op, f"a reduction by {op.attrs['fn']} (its partial products have no "
                  "calibrated range to encode them in)")
        got = self.one_scale(op, op.inputs, self.runtime_q(op))
        q = got[0][1]
        if q is not EXACT:
            q = QParams(q.scale, q.zp, min(g.lo for _, g in got), max(g.hi for _, g in got))
        out = self.emit(op.kind, [v for v, _ in got], dict(op.attrs), op.origin, op.output, q,
                        dtype=got[0][0].type.dtype)
        self.copied(out, [v for v, _ in got])

    def gather(self, op: Op) -> None:
        """Gather by exact integer indices: a constant float table becomes
        int16 on its own scale (each value within half a step: the table is
        known, so no headroom), a runtime one keeps its encoding, an integer
        table stays exact; an index outside the table gives the zero point,
        the real 0 float gives.  A graph input's features (each with its own
        encoding) and float indices are refused."""
        x, idx = op.inputs
        iq, qi = self.operand(op, idx)
        if qi is not EXACT:
            _fail(op, "a gather by indices computed in float (fixed point takes integer "
                  "indices: an integer input or a Cast of one)")
        if x.is_const and x.type.dtype == F32:
            xq, q = self.operand(op, x, activation_params(float(x.data.min()),
                                                          float(x.data.max()), 1.0))
            q = replace(q, lo=min(int(xq.data.min()), q.zp), hi=max(int(xq.data.max()), q.zp))
        else:
            xq, q = self.operand(op, x)
            if isinstance(q, FirstLayer):
                _fail(op, "a gather from a graph input (its features have encodings of their "
                      "own, folded into the first dense layer)")
            if q is not EXACT:
                q = replace(q, lo=min(q.lo, q.zp), hi=max(q.hi, q.zp))
        fill = q.zp if isinstance(q, QParams) else 0
        self.emit("gather", [xq, iq], {**op.attrs, "fill": fill}, op.origin, op.output, q,
                  dtype=xq.type.dtype)

    def arith(self, op: Op) -> None:
        """Add, Sub of activations and constants, Mul and Div by constants:
        one ``qlin``, y = round(sum of (q_k - z_k) * M_k [+ C] / 2^S) + zp_y
        with M_k = s_k * c_k / s_y * 2^S (c_k the operand's coefficient: 1,
        -1, a constant's element or its reciprocal) and C = c / s_y * 2^S
        for an added constant, each rounded to an integer, S the largest
        with every |M_k| < 2^30 (docs/numerics.md, "Arithmetic").  A
        product or quotient of two activations is ``product``'s."""
        a, b = op.inputs
        kind = op.kind
        if not a.is_const and not b.is_const:
            if kind in ("mul", "div"):
                self.product(op)
                return
            (aq, qa), (bq, qb) = self.per_tensor(op, a), self.per_tensor(op, b)
            coef = [(aq, qa, 1.0), (bq, qb, 1.0 if kind == "add" else -1.0)]
            table = None
        else:
            x, c = (b, a) if a.is_const else (a, b)
            if kind == "div" and a.is_const:      # c / x: c times x's reciprocal
                xq, qx = self.reciprocal(op, x)
                kind = "mul"
            else:
                xq, qx = self.per_tensor(op, x)
            cv = c.data.astype(np.float64)
            if kind in ("mul", "div"):
                if kind == "div" and np.any(cv == 0):
                    _fail(op, "a division by a constant 0")
                coef, table = [(xq, qx, cv if kind == "mul" else 1.0 / cv)], "mult"
            else:        # x + c, x - c, c - x
                coef = [(xq, qx, -1.0 if (kind == "sub" and a.is_const) else 1.0)]
                table = "offset"
                cv = -cv if (kind == "sub" and not a.is_const) else cv
        q = activation_params(*self.range(op.output), self.opts.headroom)
        exact = [np.asarray(r, np.float64) * qk.scale / q.scale for _, qk, r in coef]
        shift = qlin_shift(max(float(np.abs(e).max()) for e in exact))
        m = [np.round(e * 2.0 ** shift) for e in exact]
        attrs = {"za": coef[0][1].zp, "shift": shift, "zp": q.zp,
                 "coef": [float(np.abs(np.asarray(r, np.float64)).max()) for _, _, r in coef]}
        ins = [coef[0][0]]
        if table == "mult":
            ins.append(const(self.fresh(f"{op.output.name}_m"), m[0].astype(np.int64)))
            attrs.update(table="mult", ma=0)
        else:
            attrs["ma"] = int(m[0])
            if table == "offset":
                off = np.round(cv / q.scale * 2.0 ** shift)
                ins.append(const(self.fresh(f"{op.output.name}_c"), off.astype(np.int64)))
                attrs["table"] = "offset"
            else:
                ins.append(coef[1][0])
                attrs.update(zb=coef[1][1].zp, mb=int(m[1]))
        self.emit("qlin", ins, attrs, op.origin, op.output, q)

    def product(self, op: Op) -> None:
        """a * b and a / b of two activations: one kml_qmul, y = round((a -
        za) * (b - zb) * M / 2^S) + zp_y, M = s_a * s_b / s_y * 2^S rounded,
        S the largest with M < 2^30; a quotient multiplies by b's
        reciprocal, a table (``function``) whose encoding spans the
        calibrated reciprocals (``reciprocal``)."""
        a, b = op.inputs
        aq, qa = self.per_tensor(op, a)
        bq, qb = self.reciprocal(op, b) if op.kind == "div" else self.per_tensor(op, b)
        q = activation_params(*self.range(op.output), self.opts.headroom)
        exact = qa.scale * qb.scale / q.scale
        shift = qlin_shift(exact)
        attrs = {"prod": True, "za": qa.zp, "zb": qb.zp, "ma": int(np.round(exact * 2.0 ** shift)),
                 "shift": shift, "zp": q.zp, "scale": exact}
        self.emit("qlin", [aq, bq], attrs, op.origin, op.output, q)

    def reciprocal(self, op: Op, b: Value):
        """1 / b, a divisor, by a table into an encoding that spans its
        calibrated values (which must keep one sign)."""
        def calibrated():
            s = self.one_sign(op, b, "a quotient by")
            return float((1.0 / s).min()), float((1.0 / s).max())

        rng = self.derived_range(f"{b.name}:reciprocal", calibrated)
        like = Value(self.fresh(f"{b.name}_recip"), b.type)   # named by no float value
        return self.function(op, b, "reciprocal", activation_params(*rng, self.opts.headroom),
                             like)

    def one_sign(self, op: Op, v: Value, what: str) -> np.ndarray:
        """``v``'s calibration samples, refused (naming ``op``) unless they
        keep one sign: a reciprocal of them has a bounded encoding."""
        s = self.cal.samples[v]
        if not (np.all(s > 0) or np.all(s < 0)):
            _fail(op, f"{what} a value whose calibrated range reaches 0 (1/x has no bounded "
                  "encoding there)")
        return s

    def derived_range(self, key: str, compute) -> tuple[float, float]:
        """The range of an intermediate the float graph does not name,
        recorded under ``key`` (and replayed from a compiled model's)."""
        pins = self.opts.pinned
        got = pins.get("ranges", {}).get(key) if pins is not None else None
        if pins is not None and got is None:
            raise KmlcError(f"{key} has no recorded range in the compiled model: its graph "
                            "differs")
        lo, hi = got if got is not None else compute()
        self.info.formats["ranges"][key] = [float(lo), float(hi)]
        return float(lo), float(hi)

    def function(self, op: Op, x: Value, fn: str, q: QParams | None = None,
                 like: Value | None = None):
        """exp, log, sqrt, erf or 1/x of an activation by a table of its
        encoded values (tab_table; kml_tab), into ``q`` (default: the
        output's calibrated encoding) as ``like`` (default: the output)."""
        xq, qx = self.per_tensor(op, x)
        if fn == "reciprocal" and like is None:
            self.one_sign(op, x, "a reciprocal of")
        q = q or activation_params(*self.range(op.output), self.opts.headroom)
        t = tab_table(fn, qx, q)
        lo, hi = int(t["table"].min()), int(t["table"].max())
        attrs = {"fn": fn, **{k: t[k] for k in ("o", "down", "m", "k", "umax", "err", "sat")},
                 "in": [qx.scale, qx.zp], "out": [q.scale, q.zp]}
        table = const(self.fresh(f"{(like or op.output).name}_tab"), t["table"])
        q = QParams(q.scale, q.zp, lo, hi, q.span)
        if like is None:
            return self.emit("qtab", [xq, table], attrs, op.origin, op.output, q), q
        out = Value(self.fresh(f"{like.name}_q"), TensorType(I16, like.type.shape))
        self.ops.append(Op("qtab", [xq, table], [out], attrs, op.origin))
        self.info.params[out] = q
        return out, q

    def copied(self, out: Value, ins: list[Value]) -> None:
        """Records ``out`` as a copy of graph input integers (a slice,
        reshape, ... of them), which a Cast to float then encodes as it
        encodes the input itself: every int32/int64 value, none clamped."""
        runtime = [v for v in ins if not v.is_const]
        if runtime and all(v in self.graph_inputs | self.input_copies for v in runtime):
            self.input_copies.add(out)

    def rounding(self, op: Op) -> None:
        """Floor, Ceil, Round: the integer k the real value (q - zp) * scale
        rounds to, computed exactly from (q - zp) * M / 2^S with M / 2^S the
        scale to 31 bits, held on a grid of 1 (k + zp_out) when every k the
        input's int16 range gives fits int16."""
        from ..qmath import round_q

        xq, qx = self.per_tensor(op, op.inputs[0])
        shift = int(30 - np.floor(np.log2(qx.scale)))
        if not 1 <= shift <= 60:
            _fail(op, f"{op.kind} of values of scale {qx.scale:.3g}")
        mult = int(round(qx.scale * 2.0 ** shift))
        ks = round_q(np.array([qx.lo - qx.zp, qx.hi - qx.zp]) * mult, shift, op.kind)
        lo, hi = int(ks.min()), int(ks.max())
        if hi - lo > 65535:
            _fail(op, f"{op.kind} of values reaching {lo}..{hi}, beyond what int16 holds")
        zp_out = 0 if -32768 <= lo and hi <= 32767 else -32768 - lo
        attrs = {"mode": "round", "fn": op.kind, "zp": qx.zp, "zp_out": zp_out, "mult": mult,
                 "shift": shift, "lo": lo + zp_out, "hi": hi + zp_out}
        self.emit("qact", [xq], attrs, op.origin, op.output,
                  QParams(1.0, zp_out, lo + zp_out, hi + zp_out))

    def cast(self, op: Op) -> None:
        x, to = op.inputs[0], op.attrs["to"]
        xq, q = self.env[x]
        if isinstance(q, FirstLayer):
            _fail(op, "a Cast of a float graph input (inputs must feed a dense layer)")
        if xq.type.dtype != I16:           # integers, bools, class indices: exact
            q = EXACT
        if q is EXACT and to != "f32":
            self.emit("cast", [xq], {"to": to}, op.origin, op.output, EXACT, dtype=DTYPES[to])
        elif q is EXACT and xq in self.graph_inputs | self.input_copies and \
                xq.type.dtype in (I32, I64):
            self.first_layer(op.output, xq, [0] * x.type.numel, op.origin, integer=True)
            self.int_source[op.output] = xq     # comparisons use the raw integers
        elif q is EXACT:                   # bools and small integers: exact in int16
            lo, hi = self.range(op.output)
            if xq.type.dtype != BOOL and not (-32768 <= lo and hi <= 32767):
                _fail(op, "a Cast to float of integers beyond int16")
            self.emit("cast", [xq], {"to": "i16"}, op.origin, op.output, QParams(1.0, 0))
        elif to == "bool":                  # real != 0 is q != zp
            zp = const(self.fresh(f"{x.name}_zp"), np.array(q.zp, np.int16))
            self.emit("compare", [xq, zp], {"cmp": "ne"}, op.origin, op.output, EXACT,
                      dtype=BOOL)
        else:
            _fail(op, f"a Cast of a fixed-point value to {to} (its real value is approximate)")

    def raw_input(self, op: Op, x: Value) -> tuple[Value, list[int]]:
        """The integers a tree ensemble tests for its float operand ``x``:
        the graph input (in[i] = x_i * 2^F_i, or an integer feature and
        F_i = 0), reshaped to ``x``'s shape, and the F_i."""
        xq, q = self.env[x]
        raw = None
        if x in self.int_source:
            raw, frac = self.int_source[x], [0] * x.type.numel
        elif isinstance(q, FirstLayer):
            p = self.producer_of(xq)
            while p.kind == "reshape":
                p = self.producer_of(p.inputs[0])
            if p.kind == "qinput" and p.inputs[0] in self.graph_inputs:
                raw = p.inputs[0]
                frac = self.info.inputs[raw.name]["frac_bits"]
        if raw is None:
            _fail(op, "a tree ensemble over computed values (its tests are exact on graph "
                  "inputs; compile with --numerics float)")
        if raw.type.shape != x.type.shape:
            out = Value(self.fresh(f"{raw.name}_rows"), TensorType(raw.type.dtype, x.type.shape))
            self.ops.append(Op("reshape", [raw], [out], {"shape": list(x.type.shape)},
                               op.origin))
            raw = out
        return raw, list(frac)

    def trees(self, op: Op) -> None:
        """Integer tests and leaves (see the module's docstring)."""
        from ..ops import TREE_MODES

        a = op.attrs
        raw, frac = self.raw_input(op, op.inputs[0])
        thr, leaf, feature, nxt, root = (v.data for v in op.inputs[1:6])
        rest = [v.data for v in op.inputs[6:]]
        target = rest.pop(0) if a["sparse"] else None
        flags = rest.pop(0) if a["flags"] else None
        base = rest.pop(0).astype(np.float64) if a["base"] else None
        n, trees = a["branches"], root.shape[0]
        if base is not None and a["aggregate"] == "average":
            base = base * trees         # added to the sum, which the scale divides by T
        codes = flags & 7 if a["mode"] == "mixed" else \
            np.full(thr.shape, TREE_MODES.index(a["mode"]), np.uint8)
        # x <= t is in <= floor(t 2^F), x < t is in < ceil(t 2^F), and so on;
        # x == t (!=) can hold only for t 2^F an integer (t * 2^F is exact)
        t = np.ldexp(thr.astype(np.float64), np.asarray(frac)[feature.astype(np.int64)])
        fl, ce = np.floor(t), np.ceil(t)
        never = 2.0 ** 62 + 1                     # beyond every proven int32 or clamped input
        tq = np.select([codes == 0, codes == 1, codes == 2, codes == 3],
                       [fl, ce, ce, fl], np.where(fl == ce, fl, never))
        tq = np.clip(tq, -2.0 ** 62, 2.0 ** 62 + 1).astype(np.int64)
        fits = np.all(np.abs(tq) < 2**31)
        ins = [raw, const(self.fresh(f"{op.inputs[1].name}_q"),
                          tq.astype(np.int32 if fits else np.int64))]
        # leaves at step 2^-S: every sum within 2^TREE_BITS, proven per target
        # on the integers themselves (rounding may carry a sum past the
        # real-valued bound's power of two: then one step coarser)
        leaves = tree_leaves(nxt, root, n)
        bound = tree_sum_bound(leaf, target, leaves, base, a["targets"])
        shift = TREE_BITS - int(np.ceil(np.log2(bound))) if bound > 0 else 0
        while True:
            lq = np.round(np.ldexp(leaf.astype(np.float64), shift)).astype(np.int64)
            bq = None if base is None else np.round(np.ldexp(base, shift)).astype(np.int64)
            hi = tree_sum_bound(lq, target, leaves, bq, a["targets"])
            if hi < 2**TREE_BITS:
                break
            shift -= 1
        ins += [const(self.fresh(f"{op.inputs[2].name}_q"), lq)] + list(op.inputs[3:6])
        if a["sparse"]:
            ins.append(op.inputs[6])
        mixed = a["mode"] == "mixed"
        if mixed:                         # integers are never missing: the tests alone
            ins.append(const(self.fresh(f"{op.inputs[1].name}_modes"), codes.astype(np.uint8)))
        if bq is not None:
            ins.append(const(self.fresh(f"{op.inputs[-1].name}_q"), bq))
        scale = 2.0 ** -shift / (trees if a["aggregate"] == "average" else 1)
        q = QParams(scale, 0, -hi, hi)
        attrs = dict(a, aggregate="sum", flags=mixed, leaf_error=scale * 0.5 * (
            trees + (base is not None)))
        self.wide.add(self.emit("trees", ins, attrs, op.origin, op.output, q, dtype=I64))

    # -- inputs ---------------------------------------------------------------------

    def input(self, v: Value) -> None:
        if v.type.dtype != F32:     # integer features: taken as they are
            iv = Value(self.fresh(f"{v.name}_{v.type.dtype}"), v.type)
            self.env[v] = (iv, EXACT)
            self.info.inputs[iv.name] = {"frac_bits": [0] * v.type.numel,
                                         "onnx_dtype": v.type.dtype.name}
            self.info.float_of[iv] = v
            return iv
        lo, hi = widen(*self.input_range(v), self.opts.input_margin)
        fb = self.opts.input_frac_bits
        if fb is None:
            frac = choose_frac_bits(lo, hi)
        else:
            frac = list(fb) * v.type.numel if len(fb) == 1 else list(fb)
            if len(frac) != v.type.numel or not all(0 <= f <= 30 for f in frac):
                raise KmlcError(f"--input-frac-bits needs one value or {v.type.numel} values "
                                "in 0..30")
        iv = Value(self.fresh(f"{v.name}_i32"), TensorType(I32, v.type.shape))
        self.first_layer(v, iv, frac, (f"input {self.g.source_name(v)}",))
        self.info.inputs[iv.name] = {"frac_bits": [int(f) for f in frac]}
        self.info.float_of[iv] = v
        return iv

    def first_layer(self, v: Value, iv: Value, frac, origin, integer: bool = False) -> None:
        """Float features ``v``, held as integers ``iv`` = v * 2^frac (an
        encoded input, or an integer input cast to float: frac 0), centred
        and scaled by a qinput for the first dense layer."""
        lo, hi = widen(*self.input_range(v), self.opts.input_margin)
        centre, shift = encode_input(lo, hi, frac, min_shift=0 if integer else 1)
        step = np.ldexp(1.0, shift - np.array(frac))
        attrs = {"center": centre.tolist(), "shift": shift.tolist()}
        if integer:
            attrs["saturate"] = True
        self.emit("qinput", [iv], attrs, origin, v,
                  FirstLayer(step, centre * np.ldexp(1.0, -np.array(frac))), dtype=I32)

    # -- ops --------------------------------------------------------------------------

    def dense(self, op: Op) -> None:
        x, w = op.inputs[0], op.inputs[1]
        if x.type.numel != w.type.shape[0]:
            _fail(op, "a dense layer over several rows")
        xq, qx = self.narrow(x)
        wf = w.data.astype(np.float64)
        bias = (op.inputs[2].data.astype(np.float64).reshape(-1) if len(op.inputs) == 3
                else np.zeros(wf.shape[1]))
        xs = self.cal.samples[x]
        if not (np.all(np.isfinite(wf)) and np.all(np.isfinite(bias))):
            _fail(op, "weights or biases that are not finite (a normalization dividing by "
                  "zero folded into them?)")
        if isinstance(qx, FirstLayer):
            bias = bias + op.attrs.get("alpha", 1.0) * (qx.centre @ wf)
            xs = (xs - qx.centre) / qx.step            # the encoded input's real steps
            wf = wf * qx.step[:, None]
            sx, zx = 1.0, 0
        else:
            sx, zx = qx.scale, qx.zp
        wf = wf * op.attrs.get("alpha", 1.0)
        wq, sw, bits = self.weights(op, wf, xs)
        wq, sw = rescale_for_bias(wq, sw, wf, bias, sx)
        # bias correction: the rounded weights' error at the mean input,
        # which the bias absorbs (passes/error_bound.py bounds what is left
        # by |x - mean(x)| instead of |x|)
        x_mean = xs.mean(axis=0)
        bias = bias - x_mean @ (wq * sw - wf)
        sa = sx * sw                                   # accumulator scale per channel
        bq = exact_bias(op, bias, sa, zx, wq)
        act = op.attrs["act"]
        params = op.attrs.get("act_params", {})
        if act in LUT_FUNCS:
            attrs = {"mode": "lut", "fn": act, "scale": (sa * 2.0 ** LUT_FUNCS[act]).tolist()}
            q = QParams(2.0 ** -15, 0, 0 if act == "sigmoid" else -32767, 32767)
        else:
            q = activation_params(*self.range(op.output), self.opts.headroom)
            lo, hi = -32768, 32767
            if act == "relu" or (act == "leaky_relu" and params["alpha"] == 0):
                lo = q.zp
            elif act == "clip":
                lo, hi = clip_bounds(q, params["min"], params["max"])
            q = QParams(q.scale, q.zp, lo, hi, q.span)
            attrs = {"mode": "clamp", "scale": (sa / q.scale).tolist(), "zp": q.zp,
                     "lo": q.lo, "hi": q.hi}
            if act == "leaky_relu" and params["alpha"] != 0:
                # negative sums: |alpha| scales them, and a negative alpha
                # flips their sign (requant is symmetric: -requant(a) = requant(-a))
                _check_alpha(op, params["alpha"])
                attrs["scale_neg"] = (abs(params["alpha"]) * sa / q.scale).tolist()
                if params["alpha"] < 0:
                    attrs["flip"] = True
        attrs["shape"] = list(op.output.type.shape)
        pin = (self.opts.pinned or {}).get("dense", {})
        if pin:
            if self.layer[id(op)] not in pin:
                _fail(op, "a dense layer the compiled model does not have")
            attrs["acc_pin"], attrs["wide_pin"] = pin[self.layer[id(op)]]
        weff = wq * sw                              # the weights the integers stand for
        rec = {"w_abs": np.abs(weff), "w_err": np.abs(weff - wf), "b_err": sa / 2,
               "x_mean": x_mean,
               "lipschitz": max(1.0, abs(params.get("alpha", 1.0))) if act == "leaky_relu"
               else 1.0, "clip": act == "clip"}
        wconst = const(self.fresh(f"{w.name}_q{bits}"),
                       np.ascontiguousarray(wq.T).astype(I8.np if bits == 8 else I16.np))
        bconst = const(self.fresh(f"{w.name}_bq"), bq.astype(np.int64))
        out = self.emit("qdense", [xq, wconst, bconst], attrs, op.origin, op.output, q)
        self.info.dense_error[out] = rec

    def weights(self, op: Op, wf: np.ndarray, xs: np.ndarray):
        node = self.layer[id(op)]
        ref = xs @ wf
        q8, s8 = quantize_weights(wf, 8)
        self.info.sqnr_int8[node] = sqnr_db(ref, xs @ (q8 * s8))
        forced = self.opts.weight_bits     # "8", "16", or a width per node
        bits = forced.get(node, 8) if isinstance(forced, dict) else int(forced)
        self.info.weight_bits[node] = bits
        if bits == 8:
            return q8, s8, 8
        q16, s16 = quantize_weights(wf, 16)
        return q16, s16, 16

    def activation(self, op: Op) -> None:
        xq, qx = self.per_tensor(op, op.inputs[0])
        kind = op.kind
        if kind == "relu":
            q = QParams(qx.scale, qx.zp, max(qx.lo, qx.zp), max(qx.hi, qx.zp))
            attrs = {"mode": "clamp", "lo": q.lo, "hi": q.hi}
        elif kind == "clip":
            mn, mx = op.attrs["min"], op.attrs["max"]
            top, bottom = (32767 - qx.zp) * qx.scale, (-32768 - qx.zp) * qx.scale
            if min(mn, mx) > top or mx < bottom:
                raise KmlcError(f"node {' + '.join(op.origin)}: Clip to [{mn:.6g}, {mx:.6g}] "
                                f"lies outside [{bottom:.6g}, {top:.6g}], what its input's int16 "
                                "encoding can hold, so with --numerics fixed its output cannot "
                                "be represented; compile with --numerics float")
            lo, hi = clip_bounds(qx, mn, mx)
            # y = clamp(x, lo, hi) is monotone: x in [qx.lo, qx.hi] maps onto
            q = QParams(qx.scale, qx.zp, min(max(qx.lo, lo), hi), min(max(qx.hi, lo), hi))
            attrs = {"mode": "clamp", "lo": lo, "hi": hi}
        elif kind == "leaky_relu" and op.attrs["alpha"] == 0:      # ReLU
            q = QParams(qx.scale, qx.zp, max(qx.lo, qx.zp), max(qx.hi, qx.zp))
            attrs = {"mode": "clamp", "lo": q.lo, "hi": q.hi}
        elif kind == "leaky_relu":
            alpha = op.attrs["alpha"]
            _check_alpha(op, alpha)
            # its output keeps its input's encoding: a slope over 1 or below
            # 0 maps negative inputs beyond it unless calibration shows not
            lo, hi = self.range(op.output)
            if lo < (-32769 - qx.zp) * qx.scale or hi > (32768 - qx.zp) * qx.scale:
                _fail(op, f"a LeakyRelu of slope {alpha:g} that does not follow a dense layer, "
                      "whose outputs leave its input's int16 encoding (move it right after "
                      "the MatMul/Gemm)")
            q = QParams(qx.scale, qx.zp)
            attrs = {"mode": "leaky", "zp": qx.zp, "scale": abs(float(alpha))}
            if alpha < 0:
                attrs["flip"] = True
        else:
            q = QParams(2.0 ** -15, 0, 0 if kind == "sigmoid" else -32767, 32767)
            attrs = {"mode": "lut", "fn": kind, "zp": qx.zp,
                     "scale": qx.scale * 2.0 ** LUT_FUNCS[kind]}
        self.emit("qact", [xq], attrs, op.origin, op.output, q)

    def run(self) -> tuple[Graph, QuantInfo]:
        g = self.g
        self.info.input_margin = self.opts.input_margin
        self.info.formats.update(headroom=self.opts.headroom, input_margin=self.opts.input_margin)
        self.int_source: dict[Value, Value] = {}
        self.narrowed: dict = {}
        self.wide: set[Value] = set()   # tree ensembles' int64 sums (and their reshapes)
        self.input_copies: set[Value] = set()   # graph input integers moved (copied)
        dense = [op for op in g.ops if op.kind == "dense"]
        self.layer = {id(op): n for op, n in zip(dense, layer_names(dense))}
        inputs = [self.input(v) for v in g.inputs]
        self.graph_inputs = set(inputs)
        for op in g.ops:
            if op.kind == "dense":
                self.dense(op)
            elif op.kind in ("relu", "clip", "leaky_relu", "sigmoid", "tanh"):
                self.activation(op)
            elif op.kind == "softmax":
                xq, qx = self.per_tensor(op, op.inputs[0])
                self.emit("qsoftmax", [xq], {"axis": op.attrs["axis"],
                                             "scale": qx.scale * 2.0 ** 11},
                          op.origin, op.output, QParams(2.0 ** -15, 0, 0, 32767))
            elif op.kind == "trees":
                self.trees(op)
            elif op.kind == "argmax":      # a tree ensemble's sums: on the exact int64
                xq, q = self.env[op.inputs[0]]
                if xq not in self.wide:
                    xq, _ = self.per_tensor(op, op.inputs[0])
                self.emit("argmax", [xq], dict(op.attrs), op.origin, op.output,
                          QParams(1.0, 0), dtype=I64)
            elif op.kind == "compare":
                self.compare(op)
            elif op.kind in ("where", "max", "min"):
                self.select(op)
            elif op.kind == "cast":
                self.cast(op)
            elif op.kind in ("neg", "abs"):
                xq, qx = self.per_tensor(op, op.inputs[0])
                q = activation_params(*self.range(op.output), self.opts.headroom)
                self.emit("qact", [xq], {"mode": op.kind, "zp": qx.zp, "zp_out": q.zp,
                                         "scale": qx.scale / q.scale}, op.origin, op.output, q)
            elif op.kind in ("floor", "ceil", "round"):
                self.rounding(op)
            elif op.kind in TAB_FUNCS:
                self.function(op, op.inputs[0], op.kind)
            elif op.kind in ("transpose", "slice", "expand", "concat", "reduce"):
                self.move(op)
            elif op.kind == "gather":
                self.gather(op)
            elif op.kind in ("add", "sub", "mul", "div"):
                self.arith(op)
            elif op.kind in ("not", "and", "or"):
                self.emit(op.kind, [self.env[v][0] for v in op.inputs], {}, op.origin, op.output,
                          EXACT, dtype=BOOL)
            elif op.kind == "reshape":
                xq, q = self.env[op.inputs[0]]
                out = self.emit("reshape", [xq], dict(op.attrs), op.origin, op.output, q,
                                dtype=xq.type.dtype)
                self.copied(out, [xq])
                if xq in self.wide:
                    self.wide.add(out)
            else:
                _fail(op, f"op '{op.kind}' is not supported")
        outputs = []
        for v in g.outputs:
            if v.is_const or v not in self.env:
                raise KmlcError(f"output '{g.source_name(v)}' is a constant or a graph input; "
                                "nothing to compile with --numerics fixed")
            ov, q = self.narrow(v, I32)
            if isinstance(q, FirstLayer):
                raise KmlcError(f"output '{g.source_name(v)}' is a graph input")
            outputs.append(ov)
            if q is EXACT:
                self.info.outputs[ov.name] = {"integer": True}
            elif ov.type.dtype == I64:
                src = next(op for op in self.ops if ov in op.outputs)
                while src.kind == "reshape":
                    src = next(op for op in self.ops if src.inputs[0] in op.outputs)
                x = src.inputs[0].type.shape
                self.info.outputs[ov.name] = {"index": True,
                                              "classes": x[src.attrs["axis"] % len(x)]}
            else:
                self.info.outputs[ov.name] = {"scale": q.scale, "zp": q.zp, "lo": q.lo,
                                              "hi": q.hi, "q15": q.scale == 2.0 ** -15}
        qg = Graph(g.name, inputs, outputs, self.ops)
        qg.source_names = {iv: g.source_name(self.info.float_of[iv]) for iv in inputs}
        qg.source_names.update({ov: g.source_name(self.info.float_of[ov]) for ov in outputs})
        return qg, self.info


def quantize(g: Graph, cal: Calibration, opts: QuantOptions | None = None
             ) -> tuple[Graph, QuantInfo]:
    return _Quantizer(g, cal, opts or QuantOptions()).run()
