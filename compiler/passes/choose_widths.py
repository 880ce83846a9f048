"""Weight widths: int8 wherever the decisions hold (``--weight-bits auto``).

``choose_widths(g, cal, opts)`` decides each dense layer's weight width
before quantization proper.  It quantizes the calibrated float graph with
int8 weights in every layer, runs the proven integer graph on the
calibration rows (encoded as the twin encodes them) with kmlc's reference
evaluator, and compares each output's decision with the float graph's on
the same rows (compiler/decisions.py: class, argmax, or side of the cut).
While fewer than ``MIN_AGREEMENT`` percent of the rows agree, it widens
one more layer to int16, the layer whose int8 weights keep the least SQNR
first, until they agree or every layer is int16 (but those whose int8
weights are exact, which stay int8).

Guarantees: the widths it returns give decisions agreeing with float on
at least MIN_AGREEMENT percent of the (at most ``ROWS``) calibration rows
it evaluates, or are all int16 but the exact int8 layers; it returns the agreement it measured
(percent; None for forced widths) for reports.  Forced widths
(``--weight-bits 8|16``) pass through unchanged; a list of widths, one per
dense layer in graph order (``--weight-bits 16,16,8``: what auto printed,
pinned), becomes the per-layer widths, or a one-line error when its count
or values do not fit the model.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import decisions
from ..calibrate import Calibration
from ..errors import KmlcError
from ..ir import Graph, c_text, verify
from ..ops import run_all
from .bound_ranges import bound_ranges
from .quantize import QuantOptions, encode_rows, layer_names, quantize

MIN_AGREEMENT = 99.9   # percent of calibration rows
ROWS = 2000            # calibration rows evaluated, evenly spread


def agreement(g: Graph, cal: Calibration, qg: Graph, info) -> float:
    """Percent of calibration rows on which the integer graph ``qg``
    decides every output as the float graph ``g`` does."""
    n = cal.rows
    pick = np.unique(np.linspace(0, n - 1, min(n, ROWS)).round().astype(int))
    x = np.concatenate([cal.samples[v][pick] for v in g.inputs], axis=1)
    frac = [f for iv in qg.inputs for f in info.inputs[iv.name]["frac_bits"]]
    integer = any("onnx_dtype" in info.inputs[iv.name] for iv in qg.inputs)
    raw = np.round(x).astype(np.int64) if integer else encode_rows(x, frac)
    outs = [[] for _ in qg.outputs]
    for row in raw:
        parts, off = [], 0
        for v in qg.inputs:
            parts.append(row[off:off + v.type.numel].reshape(v.type.shape))
            off += v.type.numel
        env = run_all(qg, *parts)
        for i, v in enumerate(qg.outputs):
            outs[i].append(env[v].reshape(-1).astype(np.float64))
    ok = np.ones(len(pick), bool)
    for v, fv, got in zip(qg.outputs, g.outputs, outs):
        meta = info.outputs[v.name]
        got = np.stack(got)
        if "scale" in meta:
            got = (got - meta["zp"]) * meta["scale"]
        ok &= decisions.agree(cal.samples[fv][pick], got, meta)
    return 100.0 * ok.mean()


def pinned(g: Graph, widths) -> dict[str, int]:
    """Widths given one per dense layer, in graph order, as node -> bits."""
    items = widths.split(",") if isinstance(widths, str) else list(widths)
    layers = layer_names([op for op in g.ops if op.kind == "dense"])
    bad = [str(w).strip() for w in items if str(w).strip() not in ("8", "16")]
    if bad or len(items) != len(layers):
        raise KmlcError(f"--weight-bits {c_text(','.join(map(str, items)))}: expected one width "
                        f"(8 or 16) for each of the model's {len(layers)} dense layer(s), in "
                        "order: " + ", ".join(c_text(n) for n in layers))
    return {n: int(str(w).strip()) for n, w in zip(layers, items)}


def choose_widths(g: Graph, cal: Calibration,
                  opts: QuantOptions) -> tuple[QuantOptions, float | None]:
    """``opts`` with ``weight_bits`` a width per dense layer (node name ->
    8 or 16), chosen as the module docstring says, and the agreement."""
    wb = opts.weight_bits
    if isinstance(wb, (list, tuple)) or (isinstance(wb, str) and "," in wb):
        return replace(opts, weight_bits=pinned(g, wb)), None
    if wb not in ("auto", "8", "16"):
        raise KmlcError(f"--weight-bits {c_text(str(wb))}: expected auto, 8, 16, or one "
                        "width (8 or 16) per dense layer, comma-separated")
    if wb != "auto":
        return opts, None
    widths: dict[str, int] = {}
    while True:
        trial = replace(opts, weight_bits=dict(widths))
        qg, info = quantize(g, cal, trial)
        qg = verify(bound_ranges(qg))
        pct = agreement(g, cal, qg, info)
        # a layer whose int8 weights are exact (infinite SQNR: the sums of
        # passes/reduce_to_dense.py) gains nothing from int16
        narrow = sorted((n for n, db in info.sqnr_int8.items()
                         if n not in widths and np.isfinite(db)), key=info.sqnr_int8.get)
        if pct >= MIN_AGREEMENT or not narrow:
            return trial, pct
        widths[narrow[0]] = 16
