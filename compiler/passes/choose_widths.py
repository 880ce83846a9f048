"""Weight widths: int8 wherever the decisions hold (``--weight-bits auto``).

``choose_widths(g, cal, opts)`` decides each dense layer's weight width
before quantization proper.  It quantizes the calibrated float graph with
int8 weights in every layer, runs the proven integer graph on the
calibration rows (encoded as the twin encodes them) with kmlc's reference
evaluator, and compares each output's decision with the float graph's on
the same rows (compiler/decisions.py: class, argmax, or side of the cut).
While fewer than ``MIN_AGREEMENT`` percent of the rows agree, it widens
one more layer to int16, the layer whose int8 weights keep the least SQNR
first, until they agree or every layer is int16.

Guarantees: the widths it returns give decisions agreeing with float on
at least MIN_AGREEMENT percent of the (at most ``ROWS``) calibration rows
it evaluates, or are all int16; it records the agreement it measured
(``QuantInfo.decision_agreement``, in percent) for reports.  Forced widths
(``--weight-bits 8|16``) pass through unchanged.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import decisions
from ..calibrate import Calibration
from ..ir import Graph, verify
from ..ops import run_all
from .bound_ranges import bound_ranges
from .quantize import QuantOptions, encode_rows, quantize

MIN_AGREEMENT = 99.9   # percent of calibration rows
ROWS = 2000            # calibration rows evaluated, evenly spread


def agreement(g: Graph, cal: Calibration, qg: Graph, info) -> float:
    """Percent of calibration rows on which the integer graph ``qg``
    decides every output as the float graph ``g`` does."""
    n = cal.rows
    pick = np.unique(np.linspace(0, n - 1, min(n, ROWS)).round().astype(int))
    x = np.concatenate([cal.samples[v][pick] for v in g.inputs], axis=1)
    frac = [f for iv in qg.inputs for f in info.inputs[iv.name]["frac_bits"]]
    raw = encode_rows(x, frac)
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
        if not meta.get("index"):
            got = (got - meta["zp"]) * meta["scale"]
        ok &= decisions.agree(cal.samples[fv][pick], got, meta)
    return 100.0 * ok.mean()


def choose_widths(g: Graph, cal: Calibration, opts: QuantOptions) -> QuantOptions:
    """``opts`` with ``weight_bits`` a width per dense layer (node name ->
    8 or 16), chosen as the module docstring says; and the agreement."""
    if opts.weight_bits != "auto":
        return opts
    widths: dict[str, int] = {}
    while True:
        trial = replace(opts, weight_bits=dict(widths))
        qg, info = quantize(g, cal, trial)
        qg = verify(bound_ranges(qg))
        pct = agreement(g, cal, qg, info)
        narrow = sorted((n for n in info.sqnr_int8 if n not in widths),
                        key=info.sqnr_int8.get)
        if pct >= MIN_AGREEMENT or not narrow:
            trial.decision_agreement = pct
            return trial
        widths[narrow[0]] = 16
