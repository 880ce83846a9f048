"""What a policy decides from a model's outputs, one rule for all of kmlc.

A class-index output (ArgMax) is its decision; an output of two or more
values decides by its argmax; a single value decides by its side of the
cut: 0.5 for a Q0.15 output (a sigmoid's probability), 0 otherwise (a
logit or a score).  ``kmlc verify --numerics fixed`` judges fixed point by
this rule and passes/choose_widths.py picks weight widths by it.
"""
from __future__ import annotations

import numpy as np


def cut(meta: dict) -> float:
    return 0.5 if meta.get("q15") else 0.0


def decisions(y: np.ndarray, meta: dict) -> np.ndarray:
    """Per row of real values ``y`` (rows, elems) of one output: its
    decision, with ``meta`` the output's fixed-point entry (index, q15)."""
    y = np.asarray(y).reshape(len(y), -1)
    if meta.get("index") or meta.get("integer"):
        return y.astype(np.int64)
    if y.shape[1] >= 2:
        return np.argmax(y, axis=1)[:, None]
    return (y >= cut(meta)).astype(np.int64)


def how(y_elems: int, meta: dict) -> str:
    """How ``decisions`` decides, for reports."""
    if meta.get("index"):
        return "class"
    if meta.get("integer"):
        return "value"
    return "argmax" if y_elems >= 2 else f"decision (>= {cut(meta):g})"


def agree(ref: np.ndarray, got: np.ndarray, meta: dict) -> np.ndarray:
    """Rows on which two evaluations of one output decide the same."""
    return (decisions(ref, meta) == decisions(got, meta)).all(axis=1)
