"""``kmlc verify``: the twin against onnxruntime, an independent oracle.

Float models are held to the arithmetic.  onnxruntime also runs the model
converted to float64 (the reference), and ``float_bound`` bounds, from the
magnitudes each output was computed from, how far the twin's float32 may
be from it.  An element passes when the twin is within that bound of the
float64 reference, or no further from it than onnxruntime's float32 is,
or within ``atol + rtol * |ort|`` of onnxruntime (defaults 1e-5 and 1e-5;
NaN must meet NaN); and for every output of two or more values the twin's
argmax equals onnxruntime's on every row whose top-2 gap exceeds 1e-4.
The report gives the largest bound and both errors against float64.
docs/numerics.md explains why these bounds hold.

Fixed-point models are approximations of the float model, so they are
judged by what a policy uses: they pass when the decision agrees with
onnxruntime's float result on at least ``min_agreement`` percent of the
rows (argmax for outputs of two or more values; for a single value, the
side of 0.5 for a probability output and of 0 otherwise), and the
output's SQNR is at least ``min_sqnr`` dB.  The report adds the max and
mean output error and the SQNR of every layer.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import KmlcError

ARGMAX_GAP = 1e-4


@dataclass
class VerifyReport:
    model: str
    rows: int
    atol: float
    rtol: float
    max_abs: float = 0.0
    max_rel: float = 0.0
    violations: int = 0
    argmax: dict = field(default_factory=dict)  # output name -> (agree, considered)
    reference: str = ""       # what the float64 reference was, if any
    bound_max: float = 0.0    # the largest arithmetic bound (finite ones)
    twin64: float = 0.0       # max |twin - float64|
    ort64: float = 0.0        # max |onnxruntime float32 - float64|

    @property
    def ok(self) -> bool:
        return self.violations == 0 and all(a == c for a, c in self.argmax.values())

    def text(self) -> str:
        lines = [f"kmlc verify {self.model}: {self.rows} rows, twin vs onnxruntime",
                 f"  max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}"]
        if self.reference:
            lines.append(f"  against {self.reference}: twin {self.twin64:.3g}, onnxruntime "
                         f"{self.ort64:.3g}; arithmetic bound up to {self.bound_max:.3g}")
        lines.append(f"  {self.violations} element(s) beyond the bound, onnxruntime's own "
                     f"error and {self.atol:g} + {self.rtol:g}*|ref|")
        for name, (agree, considered) in self.argmax.items():
            pct = 100.0 * agree / considered if considered else 100.0
            lines.append(f"  argmax '{name}': {agree}/{considered} agree ({pct:.2f}%) on rows "
                         f"with top-2 gap > {ARGMAX_GAP:g}")
        lines.append("  PASS" if self.ok else "  FAIL")
        return "\n".join(lines)


def _session(model):
    import onnx
    import onnxruntime as ort

    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    for _ in range(2):
        try:
            return ort.InferenceSession(m.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as e:
            found = re.search(r"max supported IR version: (\d+)", str(e))
            if not found or m.ir_version <= int(found.group(1)):
                raise KmlcError(f"onnxruntime cannot run this model: "
                                f"{str(e).strip().splitlines()[-1]}") from None
            m = onnx.ModelProto.FromString(m.SerializeToString())
            m.ir_version = int(found.group(1))  # same ops, older container version


ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
             "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def reference_outputs(model, prog, x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """onnxruntime's outputs for rows ``x``, laid out like the twin's."""
    sess = _session(model)
    types = {i.name: ORT_TYPES.get(i.type, np.float32) for i in sess.get_inputs()}
    rows = []
    for row in x:
        feed = {p.name: row[p.buffer.offset:p.buffer.offset + p.buffer.numel]
                .reshape(p.type.shape).astype(types.get(p.name, np.float32)) for p in prog.inputs}
        outs = sess.run([p.name for p in prog.outputs], feed)
        rows.append(np.concatenate([np.asarray(o, dtype=dtype).reshape(-1) for o in outs]))
    return np.stack(rows)


def double_model(model):
    """The ONNX model with every float32 tensor, type and Cast made float64."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for i in g.initializer:
        if i.data_type == TensorProto.FLOAT:
            i.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(i).astype(np.float64),
                                               i.name))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in g.node:
        for at in n.attribute:
            if n.op_type == "Cast" and at.name == "to" and at.i == TensorProto.FLOAT:
                at.i = TensorProto.DOUBLE
            if at.type == onnx.AttributeProto.TENSOR and at.t.data_type == TensorProto.FLOAT:
                at.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(at.t).astype(np.float64), at.t.name))
    return m


def reference64(model, prog, x: np.ndarray) -> np.ndarray | None:
    """onnxruntime's float64 outputs, or None when it cannot run the model
    in float64."""
    try:
        return reference_outputs(double_model(model), prog, x.astype(np.float64),
                                 dtype=np.float64)
    except Exception:   # an op onnxruntime has no float64 kernel for
        return None


def compare(prog, y: np.ndarray, ref: np.ndarray, atol: float, rtol: float,
            model: str, ref64: np.ndarray | None = None,
            bound: np.ndarray | None = None) -> VerifyReport:
    rep = VerifyReport(model, len(y), atol, rtol)
    both_nan = np.isnan(y) & np.isnan(ref)
    with np.errstate(all="ignore"):
        err = np.where(both_nan, 0.0, np.abs(y.astype(np.float64) - ref))
        # relative error where it means something: |ref| above 1e-6
        rel = np.where(both_nan | (np.abs(ref) < 1e-6), 0.0, err / np.maximum(np.abs(ref), 1e-6))
    err = np.where(np.isnan(err), np.inf, err)
    rep.max_abs = float(err.max(initial=0.0))
    rep.max_rel = float(rel[np.isfinite(rel)].max(initial=0.0))
    ok = err <= atol + rtol * np.abs(ref)
    if ref64 is not None and bound is not None:
        with np.errstate(all="ignore"):
            e_twin = np.abs(y.astype(np.float64) - ref64)
            e_ort = np.abs(ref.astype(np.float64) - ref64)
        fin = np.isfinite(e_twin)
        ok |= fin & ((e_twin <= bound) | (e_twin <= e_ort))
        rep.reference = "onnxruntime float64"
        rep.twin64 = float(e_twin[fin].max(initial=0.0))
        rep.ort64 = float(e_ort[np.isfinite(e_ort)].max(initial=0.0))
        rep.bound_max = float(bound[np.isfinite(bound)].max(initial=0.0))
    for p in prog.outputs:      # integers and bools: exactly one of the references'
        if p.type.dtype.name in ("f32", "i16"):
            continue
        sl = slice(p.buffer.offset, p.buffer.offset + p.buffer.numel)
        same = y[:, sl] == ref[:, sl]
        if ref64 is not None:
            same |= y[:, sl] == ref64[:, sl]
        ok[:, sl] = same
    rep.violations = int((~ok).sum())
    for p in prog.outputs:
        if p.buffer.numel < 2 or p.type.dtype.name != "f32":
            continue
        sl = slice(p.buffer.offset, p.buffer.offset + p.buffer.numel)
        r, t = ref[:, sl], y[:, sl]
        top2 = np.sort(r, axis=1)[:, -2:]
        considered = (top2[:, 1] - top2[:, 0]) > ARGMAX_GAP
        agree = (np.argmax(r, axis=1) == np.argmax(t, axis=1)) & considered
        rep.argmax[p.name] = (int(agree.sum()), int(considered.sum()))
    return rep


def verify_model(model, *, data: np.ndarray | None = None, samples: int = 1000, seed: int = 0,
                 atol: float = 1e-5, rtol: float = 1e-5) -> VerifyReport:
    from .api import compile, load
    from .calibrate import check_rows

    with tempfile.TemporaryDirectory(prefix="kmlc-verify-") as d:
        res = compile(model, Path(d) / "out", targets="user")
        twin = load(Path(d) / "out")
        if data is not None:
            x = check_rows(data, twin.in_elems, "data")
            x = np.asarray(data) if twin.integer_inputs else x
        elif twin.integer_inputs:
            x = np.random.default_rng(seed).integers(-1000, 1000, (samples, twin.in_elems))
            x = x.astype(twin.in_dtype)
        else:
            x = np.random.default_rng(seed).standard_normal((samples, twin.in_elems))
            x = x.astype(np.float32)
        y = twin.run(x)
    from .float_bound import float_bound

    prog = res.program
    ref = reference_outputs(model, prog, x)
    ref64 = reference64(model, prog, x)
    bound = np.concatenate([b for _, b in float_bound(prog.graph, x)], axis=1)
    name = model if isinstance(model, (str, Path)) else prog.name
    return compare(prog, y, ref, atol, rtol, str(name), ref64, bound)


MIN_AGREEMENT = 99.0  # percent, fixed point
MIN_SQNR = 30.0       # dB, fixed point


@dataclass
class FixedReport:
    model: str
    rows: int
    max_abs: float
    mean_abs: float
    agreement: dict        # output -> (agree, rows, how)
    output_sqnr: dict      # output -> dB
    layer_sqnr: list       # (layer, dB)
    min_agreement: float
    min_sqnr: float

    @property
    def ok(self) -> bool:
        return all(100.0 * a / n >= self.min_agreement for a, n, _ in self.agreement.values()) \
            and all(v >= self.min_sqnr for v in self.output_sqnr.values())

    def text(self) -> str:
        lines = [f"kmlc verify {self.model}: {self.rows} rows, fixed-point twin vs onnxruntime "
                 "(float)",
                 f"  output error: max {self.max_abs:.4g}, mean {self.mean_abs:.4g}"]
        for name, (a, n, how) in self.agreement.items():
            lines.append(f"  {how} agreement '{name}': {a}/{n} ({100.0 * a / n:.2f}%, "
                         f"needs >= {self.min_agreement:g}%)")
        for name, db in self.output_sqnr.items():
            lines.append(f"  output SQNR '{name}': {db:.1f} dB (needs >= {self.min_sqnr:g} dB)")
        lines.append("  per-layer SQNR (dB):")
        for layer, db in self.layer_sqnr:
            lines.append(f"    {db:7.1f}  {layer}")
        lines.append("  PASS" if self.ok else "  FAIL")
        return "\n".join(lines)


def layer_sqnr(info, x_float: np.ndarray, x_raw: np.ndarray) -> list:
    """SQNR of every quantized layer against the float layer it replaces,
    both run by kmlc's reference evaluators on the same rows."""
    from .ops import run_all
    from .passes.quantize import sqnr_db

    fg, ig = info.float_graph, info.int_graph
    ref: dict = {}
    got: dict = {}
    for xf, xr in zip(x_float, x_raw):
        fvals = run_all(fg, *_split(fg, xf))
        ivals = run_all(ig, *_split(ig, xr))
        for iv, fv in info.float_of.items():
            if iv in info.params and iv in ivals:
                q = info.params[iv]
                ref.setdefault(iv, []).append(np.asarray(fvals[fv], np.float64).reshape(-1))
                got.setdefault(iv, []).append((ivals[iv].astype(np.float64).reshape(-1) - q.zp)
                                              * q.scale)
    out = []
    for op in ig.ops:
        v = op.output
        if v in ref and op.kind != "reshape":
            out.append((f"{op.kind} {' + '.join(op.origin)}",
                        sqnr_db(np.stack(ref[v]), np.stack(got[v]))))
    return out


def _split(g, row):
    parts, off = [], 0
    for v in g.inputs:
        parts.append(row[off:off + v.type.numel].reshape(v.type.shape))
        off += v.type.numel
    return parts


def verify_fixed(model, *, calibration: np.ndarray, data: np.ndarray,
                 min_agreement: float = MIN_AGREEMENT, min_sqnr: float = MIN_SQNR,
                 weight_bits: str | list = "auto", input_margin: float = 0.0,
                 headroom: float | None = None) -> FixedReport:
    from . import decisions
    from .api import compile, load
    from .calibrate import check_rows
    from .passes.quantize import sqnr_db

    with tempfile.TemporaryDirectory(prefix="kmlc-verify-") as d:
        res = compile(model, Path(d) / "out", targets="user", numerics="fixed",
                      calibration=calibration, weight_bits=weight_bits,
                      input_margin=input_margin, headroom=headroom)
        twin = load(Path(d) / "out")
        x = check_rows(data, twin.in_elems, "data")
        x = np.asarray(data) if twin.integer_inputs else x   # int64 beyond float32's 2^24
        raw = twin.encode(x)
        y = twin.decode(twin.run_raw(raw))
    prog = res.program
    ref = reference_outputs(model, prog, x)
    agreement, out_sqnr = {}, {}
    for p, o in zip(prog.outputs, twin.fixed["outputs"]):
        sl = slice(p.buffer.offset, p.buffer.offset + p.buffer.numel)
        r, t = ref[:, sl], y[:, sl]
        agreement[p.name] = (int(decisions.agree(r, t, o).sum()), len(x),
                             decisions.how(p.buffer.numel, o))
        if "scale" in o:        # not class indices, integers or bools
            out_sqnr[p.name] = sqnr_db(r.astype(np.float64), t.astype(np.float64))
    err = np.abs(y.astype(np.float64) - ref)
    name = model if isinstance(model, (str, Path)) else prog.name
    return FixedReport(str(name), len(x), float(err.max()), float(err.mean()), agreement,
                       out_sqnr, layer_sqnr(prog.quant, x, raw), min_agreement, min_sqnr)
