"""``kmlc verify``: the twin against onnxruntime, an independent oracle.

A model passes when, on every row and every output element,
``|twin - ort| <= atol + rtol * |ort|`` (defaults 1e-5 and 1e-5; NaN must
meet NaN), and, for every output of two or more values, the twin's argmax
equals onnxruntime's on every row whose top-2 gap in onnxruntime exceeds
1e-4.  docs/numerics.md explains why these bounds hold for float models.
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

    @property
    def ok(self) -> bool:
        return self.violations == 0 and all(a == c for a, c in self.argmax.values())

    def text(self) -> str:
        lines = [f"kmlc verify {self.model}: {self.rows} rows, twin vs onnxruntime",
                 f"  max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}, "
                 f"{self.violations} element(s) beyond {self.atol:g} + {self.rtol:g}*|ref|"]
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


def reference_outputs(model, prog, x: np.ndarray) -> np.ndarray:
    """onnxruntime's outputs for rows ``x``, laid out like the twin's."""
    sess = _session(model)
    rows = []
    for row in x:
        feed = {p.name: row[p.buffer.offset:p.buffer.offset + p.buffer.numel]
                .reshape(p.type.shape) for p in prog.inputs}
        outs = sess.run([p.name for p in prog.outputs], feed)
        rows.append(np.concatenate([np.asarray(o, dtype=np.float32).reshape(-1) for o in outs]))
    return np.stack(rows)


def compare(prog, y: np.ndarray, ref: np.ndarray, atol: float, rtol: float,
            model: str) -> VerifyReport:
    rep = VerifyReport(model, len(y), atol, rtol)
    both_nan = np.isnan(y) & np.isnan(ref)
    with np.errstate(all="ignore"):
        err = np.where(both_nan, 0.0, np.abs(y.astype(np.float64) - ref))
        rel = np.where(both_nan, 0.0, err / np.maximum(np.abs(ref), 1e-30))
    err = np.where(np.isnan(err), np.inf, err)
    rep.max_abs = float(err.max(initial=0.0))
    rep.max_rel = float(rel[np.isfinite(rel)].max(initial=0.0))
    rep.violations = int((err > atol + rtol * np.abs(ref)).sum())
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
    from .api import _check_rows, compile, load

    with tempfile.TemporaryDirectory(prefix="kmlc-verify-") as d:
        res = compile(model, Path(d) / "out", targets="user")
        twin = load(Path(d) / "out")
        if data is not None:
            x = _check_rows(data, twin.in_elems, "data")
        else:
            x = np.random.default_rng(seed).standard_normal((samples, twin.in_elems))
            x = x.astype(np.float32)
        y = twin.run(x)
    ref = reference_outputs(model, res.program, x)
    name = model if isinstance(model, (str, Path)) else res.program.name
    return compare(res.program, y, ref, atol, rtol, str(name))
