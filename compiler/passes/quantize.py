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
    from its calibrated range widened by ``margin`` on each side (values
    beyond saturate); sigmoid and tanh outputs are Q0.15;
  * dense weights are symmetric per output channel, int8 or int16 as
    ``weight_bits`` says (one width, or one per layer from
    passes/choose_widths.py; a layer it does not name is int8); the
    per-feature input steps and centres are folded into the first layer's
    weights and bias; biases are integers at the accumulator's scale with
    the input zero point's term folded in;
  * every requantization is recorded as a real scale (``scale`` attributes);
    passes/bound_ranges.py turns scales into integer multipliers once it has
    proven the accumulator ranges.
Ops fixed point cannot express raise ``KmlcError`` naming the node.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..calibrate import Calibration
from ..errors import KmlcError
from ..ir import I8, I16, I32, I64, Graph, Op, TensorType, Value, const, fresh_namer
from ..qmath import LUT_FUNCS, round_shift

MARGIN = 0.25
# A bias takes at most 2^BIAS_BITS accumulator steps: past that the weight
# step of its channel grows (the weights' share is negligible beside the
# bias), so that requantization keeps at least 63 - 42 = 21 multiplier bits.
# A bias whose weights are all zero takes 2^ZERO_COLUMN_BITS steps.
BIAS_BITS = 40
ZERO_COLUMN_BITS = 30
SUPPORTED_FIXED = ("dense (MatMul/Gemm + bias)", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh",
                   "Softmax", "ArgMax", "Reshape/Flatten/Identity")


@dataclass
class QParams:
    """real = scale * (q - zp); q is proven to lie in [lo, hi]."""
    scale: float
    zp: int
    lo: int = -32768
    hi: int = 32767


@dataclass
class FirstLayer:
    """An encoded graph input: element k is centre[k] + step[k] * q[k]."""
    step: np.ndarray
    centre: np.ndarray


@dataclass
class QuantOptions:
    weight_bits: str | dict = "auto"           # auto | 8 | 16 | {node: 8 or 16}
    input_frac_bits: list[int] | None = None   # per input element, or one for all
    margin: float = MARGIN
    input_margin: float = 0.0                  # inputs' range widened by this, each side


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


def _fail(op: Op, msg: str):
    raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: {msg} with --numerics fixed; "
                    f"fixed point compiles {', '.join(SUPPORTED_FIXED)}")


def layer_name(op: Op) -> str:
    """A dense layer's name in reports and ``weight_bits``: its MatMul or
    Gemm node."""
    return next((o for o in op.origin if o.endswith(("(Gemm)", "(MatMul)"))),
                op.origin[0] if op.origin else op.kind)


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


def encode_input(lo, hi, frac_bits):
    """Per element: centre and shift (qinput's attributes), so that the
    calibrated range [lo, hi] maps into int16 around 0.  The shift is at
    least 1, so that round_shift(x - centre, shift) of every int32 x fits
    int32 (|x - centre| < 2^32), exactly, with no clamp."""
    scale = np.ldexp(1.0, np.array(frac_bits))
    qlo = np.clip(np.floor(lo * scale), -2**31, 2**31 - 1).astype(np.int64)
    qhi = np.clip(np.ceil(hi * scale), -2**31, 2**31 - 1).astype(np.int64)
    centre = (qlo + qhi) // 2
    half = np.maximum(qhi - centre, centre - qlo)
    shift = np.ones_like(half)
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


def activation_params(lo: float, hi: float, margin: float) -> QParams:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    pad = margin * (hi - lo)
    lo, hi = (lo - pad if lo < 0 else 0.0), hi + pad
    if hi - lo <= 0:
        hi = lo + 1.0
    scale = (hi - lo) / 65535
    zp = int(np.clip(round(-32768 - lo / scale), -32768, 32767))
    return QParams(scale, zp)


class _Quantizer:
    def __init__(self, g: Graph, cal: Calibration, opts: QuantOptions):
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
        xq, q = self.env[v]
        if isinstance(q, FirstLayer):
            _fail(op, f"{op.kind} on a graph input (inputs must feed a dense layer)")
        return xq, q

    # -- inputs ---------------------------------------------------------------------

    def input(self, v: Value) -> None:
        lo, hi = widen(*self.cal.input_range(v), self.opts.input_margin)
        fb = self.opts.input_frac_bits
        if fb is None:
            frac = choose_frac_bits(lo, hi)
        else:
            frac = list(fb) * v.type.numel if len(fb) == 1 else list(fb)
            if len(frac) != v.type.numel or not all(0 <= f <= 30 for f in frac):
                raise KmlcError(f"--input-frac-bits needs one value or {v.type.numel} values "
                                "in 0..30")
        centre, shift = encode_input(lo, hi, frac)
        iv = Value(self.fresh(f"{v.name}_i32"), TensorType(I32, v.type.shape))
        step = np.ldexp(1.0, shift - np.array(frac))
        attrs = {"center": centre.tolist(), "shift": shift.tolist()}
        self.emit("qinput", [iv], attrs, (f"input {self.g.source_name(v)}",), v,
                  FirstLayer(step, centre * np.ldexp(1.0, -np.array(frac))), dtype=I32)
        self.info.inputs[iv.name] = {"frac_bits": [int(f) for f in frac]}
        self.info.float_of[iv] = v
        return iv

    # -- ops --------------------------------------------------------------------------

    def dense(self, op: Op) -> None:
        x, w = op.inputs[0], op.inputs[1]
        if x.type.numel != w.type.shape[0]:
            _fail(op, "a dense layer over several rows")
        xq, qx = self.env[x]
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
        sa = sx * sw                                   # accumulator scale per channel
        bq = exact_bias(op, bias, sa, zx, wq)
        act = op.attrs["act"]
        params = op.attrs.get("act_params", {})
        if act in LUT_FUNCS:
            attrs = {"mode": "lut", "fn": act, "scale": (sa * 2.0 ** LUT_FUNCS[act]).tolist()}
            q = QParams(2.0 ** -15, 0, 0 if act == "sigmoid" else -32767, 32767)
        else:
            q = activation_params(*self.cal.range(op.output), self.opts.margin)
            lo, hi = -32768, 32767
            if act == "relu" or (act == "leaky_relu" and params["alpha"] == 0):
                lo = q.zp
            elif act == "clip":
                lo, hi = clip_bounds(q, params["min"], params["max"])
            q = QParams(q.scale, q.zp, lo, hi)
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
        weff = wq * sw                              # the weights the integers stand for
        rec = {"w_abs": np.abs(weff), "w_err": np.abs(weff - wf), "b_err": sa / 2,
               "lipschitz": max(1.0, abs(params.get("alpha", 1.0))) if act == "leaky_relu"
               else 1.0, "clip": act == "clip"}
        wconst = const(self.fresh(f"{w.name}_q{bits}"),
                       np.ascontiguousarray(wq.T).astype(I8.np if bits == 8 else I16.np))
        bconst = const(self.fresh(f"{w.name}_bq"), bq.astype(np.int64))
        out = self.emit("qdense", [xq, wconst, bconst], attrs, op.origin, op.output, q)
        self.info.dense_error[out] = rec

    def weights(self, op: Op, wf: np.ndarray, xs: np.ndarray):
        node = layer_name(op)
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
            lo, hi = self.cal.range(op.output)
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
        inputs = [self.input(v) for v in g.inputs]
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
            elif op.kind == "argmax":
                xq, _ = self.per_tensor(op, op.inputs[0])
                self.emit("argmax", [xq], dict(op.attrs), op.origin, op.output,
                          QParams(1.0, 0), dtype=I64)
            elif op.kind == "reshape":
                xq, q = self.env[op.inputs[0]]
                self.emit("reshape", [xq], dict(op.attrs), op.origin, op.output, q,
                          dtype=xq.type.dtype)
            else:
                _fail(op, f"op '{op.kind}' is not supported")
        outputs = []
        for v in g.outputs:
            if v.is_const or v not in self.env:
                raise KmlcError(f"output '{g.source_name(v)}' is a constant or a graph input; "
                                "nothing to compile with --numerics fixed")
            ov, q = self.env[v]
            if isinstance(q, FirstLayer):
                raise KmlcError(f"output '{g.source_name(v)}' is a graph input")
            outputs.append(ov)
            if ov.type.dtype == I64:
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
