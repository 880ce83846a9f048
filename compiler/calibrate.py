"""Calibration: the values every tensor of a float graph takes on user data.

``calibrate`` runs the graph with the reference evaluator on each row of
the calibration data and keeps, for every value, its samples (up to
``MAX_ROWS`` rows) and its range: element-wise for graph inputs (each input
feature gets its own clamp range and encoding), tensor-wide for the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import KmlcError
from .ir import Graph, Value
from .ops import run_all

MAX_ROWS = 4096


@dataclass
class Calibration:
    rows: int
    samples: dict[Value, np.ndarray]   # value -> (rows, numel) float64

    def range(self, v: Value) -> tuple[float, float]:
        s = self.samples[v]
        return float(s.min()), float(s.max())

    def input_range(self, v: Value) -> tuple[np.ndarray, np.ndarray]:
        s = self.samples[v]
        return s.min(axis=0), s.max(axis=0)


def check_rows(data, in_elems: int, what: str = "calibration data") -> np.ndarray:
    x = np.asarray(data)
    if x.ndim != 2 or x.shape[1] != in_elems:
        raise KmlcError(f"{what} has shape {tuple(x.shape)}; expected rows of {in_elems} "
                        f"values, shape (N, {in_elems}), like `kmlc run` input")
    if x.shape[0] == 0:
        raise KmlcError(f"{what} has no rows")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise KmlcError(f"{what} has dtype {x.dtype}; expected float32 rows")
    x = x.astype(np.float64)
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise KmlcError(f"{what} holds a non-finite value (row {r}, column {c})")
    return x.astype(np.float32)


def calibrate(g: Graph, data: np.ndarray) -> Calibration:
    in_elems = sum(v.type.numel for v in g.inputs)
    x = check_rows(data, in_elems)
    if len(x) > MAX_ROWS:  # an even spread over the data, not its head
        x = x[np.linspace(0, len(x) - 1, MAX_ROWS).round().astype(int)]
    traces: dict[Value, list[np.ndarray]] = {}
    for row in x:
        parts, off = [], 0
        for v in g.inputs:
            parts.append(row[off:off + v.type.numel].reshape(v.type.shape))
            off += v.type.numel
        with np.errstate(all="ignore"):
            values = run_all(g, *parts)
        for v, val in values.items():
            traces.setdefault(v, []).append(np.asarray(val, dtype=np.float64).reshape(-1))
    samples = {v: np.stack(t) for v, t in traces.items()}
    for op in g.ops:                     # fixed point needs finite ranges
        for v in op.outputs:
            s = samples.get(v)
            if s is not None and not np.all(np.isfinite(s)):
                r = int(np.argwhere(~np.isfinite(s))[0][0])
                raise KmlcError(f"node {' + '.join(op.origin) or op.kind}: calibration row {r} "
                                "drives it to infinity or NaN in float32, so it has no range "
                                "to quantize; scale the model or the data down")
    return Calibration(len(x), samples)
