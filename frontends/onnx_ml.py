"""ONNX-ML (``ai.onnx.ml``) nodes as kmlc IR: the linear and preprocessing
operators, each written with default-domain IR ops in the order of
onnxruntime's CPU kernels, whose results are these operators' reference
(the ONNX-ML specification leaves the binary cases open):

  Scaler            (x - offset) * scale, per feature (x cast to float first)
  Binarizer         x > threshold ? 1 : 0, in float
  LinearRegressor   x @ coefficients^T + intercepts (post_transform NONE)
  Normalizer        L1: x / sum(|x|) per row (summed in index order), x
                    where the sum is 0
  LinearClassifier  raw scores s = x @ coefficients^T + intercepts;
                    the label is the class label of the first highest raw
                    score (one row of coefficients: labels[1] if s > 0, else
                    labels[0]); the scores output is NONE: s, LOGISTIC:
                    sigmoid(s), SOFTMAX: softmax(s); with one row and two
                    labels, [1 - t, t], t = sigmoid(s) for LOGISTIC and s
                    otherwise, as onnxruntime writes it

What the converter guarantees: every node becomes IR ops of ``kmlc.ops``
with the node's name as their origin, or a one-line refusal naming the node
and why (string labels: kmlc outputs numbers; PROBIT and SOFTMAX_ZERO;
Normalizer MAX and L2; ZipMap: a sequence of maps; any other ai.onnx.ml op).
"""
from __future__ import annotations

import numpy as np

from ..ir import F32, c_identifier, const

DOMAIN = "ai.onnx.ml"
SUPPORTED = ("Binarizer", "LinearClassifier", "LinearRegressor", "Normalizer", "Scaler",
             "TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor")
WHY_NOT = {
    "ZipMap": "it outputs a sequence of maps; convert without it (skl2onnx: "
              "options={'zipmap': False}) and use the probabilities tensor",
}


def convert(conv, node) -> None:
    """Converts ``node`` (domain ai.onnx.ml) with the ONNX frontend's
    converter ``conv`` (its emit, get, attrs and fail)."""
    op = node.op_type
    if op not in SUPPORTED:
        why = WHY_NOT.get(op, "kmlc does not compile it")
        conv.fail(f"{why}; supported ai.onnx.ml ops: {', '.join(SUPPORTED)}", node)
    a = conv.attrs(node)
    x = _float_input(conv, node)
    if op == "Scaler":
        f = x.type.shape[-1]
        for attr, kind, default in (("offset", "sub", 0.0), ("scale", "mul", 1.0)):
            v = np.asarray(a.get(attr, [default]), np.float32)
            if v.size not in (1, f):
                conv.fail(f"{attr} has {v.size} values for {f} features", node)
            x = _op(conv, node, kind, [x, _const(conv, node, attr, v)],
                    last=kind == "mul")
    elif op == "Binarizer":
        t = np.asarray([a.get("threshold", 0.0)], np.float32)
        b = _op(conv, node, "compare", [x, _const(conv, node, "threshold", t)], {"cmp": "gt"})
        _op(conv, node, "cast", [b], {"to": F32.name}, last=True)
    elif op == "Normalizer":
        _normalizer(conv, node, a, x)
    elif op.startswith("TreeEnsemble"):
        from . import onnx_trees

        onnx_trees.convert(conv, node, a, x)
    elif op == "LinearRegressor":
        if _text(a.get("post_transform", "NONE")) != "NONE":
            conv.fail("post_transform other than NONE (onnxruntime applies PROBIT to a "
                      "single target only); kmlc compiles NONE", node)
        _linear(conv, node, a, x, int(a.get("targets", 1)), last=True)
    else:
        _classifier(conv, node, a, x)


def _normalizer(conv, node, a, x) -> None:
    """L1: each row over the sum of its absolute values, taken in index
    order from 0 (a Gemm with a column of ones adds them in that order, each
    product exact), the row unchanged where the sum is 0."""
    norm = _text(a.get("norm", "MAX"))
    if norm != "L1":
        conv.fail(f"norm {norm}: kmlc compiles L1 (MAX needs a maximum over each row, L2 a "
                  "square root, neither compiled yet)", node)
    if len(x.type.shape) != 2:
        conv.fail(f"input of rank {len(x.type.shape)}; Normalizer takes rows", node)
    n = x.type.shape[1]
    mag = _op(conv, node, "abs", [x])
    s = _gemm(conv, node, [mag, _const(conv, node, "ones", np.ones((n, 1), np.float32))])
    nz = _op(conv, node, "compare", [s, _const(conv, node, "zero", np.zeros(1, np.float32))],
             {"cmp": "ne"})
    q = _op(conv, node, "div", [x, s])
    _op(conv, node, "where", [nz, q, x], last=True)


def _gemm(conv, node, ins, trans_b: int = 0, **where):
    """x @ w (+ b), or x @ w^T (+ b) with ``trans_b``: ONNX Gemm, alpha = beta = 1."""
    return _op(conv, node, "gemm", ins, {"alpha": 1.0, "beta": 1.0, "transA": 0,
                                         "transB": trans_b}, **where)


def _name(node, what: str) -> str:
    return f"{node.output[0]}#{what}"


def _op(conv, node, kind, inputs, attrs=None, last=False, out=None):
    """One IR op of ``node``: its result bound to the node's output when
    ``last``, to ``out`` if given, else to an intermediate name."""
    name = out or (node.output[0] if last else _name(node, f"{kind}{len(conv.ops)}"))
    conv.emit(node, kind, inputs, attrs or {}, out=name)
    return conv.env[name]


def _const(conv, node, what: str, data: np.ndarray):
    return const(conv.fresh(c_identifier(f"{node.output[0]}_{what}", "c")), data)


def _float_input(conv, node):
    x = conv.get(node, 0)
    if x.type.dtype != F32:           # onnxruntime casts every input to float first
        x = _op(conv, node, "cast", [x], {"to": F32.name})
    if len(x.type.shape) == 1:
        x = _op(conv, node, "reshape", [x], {"shape": [1, x.type.shape[0]]})
    return x


def _linear(conv, node, a, x, rows: int, last: bool = False, out=None):
    f = x.type.shape[-1]
    w = np.asarray(a.get("coefficients", []), np.float32)
    if rows < 1 or w.size != rows * f:
        conv.fail(f"{w.size} coefficients for {rows} rows of {f} features", node)
    ins = [x, _const(conv, node, "coefficients", w.reshape(rows, f))]
    if a.get("intercepts"):
        b = np.asarray(a["intercepts"], np.float32)
        if b.size != rows:
            conv.fail(f"{b.size} intercepts for {rows} rows", node)
        ins.append(_const(conv, node, "intercepts", b))
    return _gemm(conv, node, ins, 1, last=last, out=out)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _classifier(conv, node, a, x) -> None:
    if a.get("classlabels_strings"):
        conv.fail("string class labels: kmlc outputs numbers (use classlabels_ints)", node)
    post = _text(a.get("post_transform", "NONE"))
    if post not in ("NONE", "LOGISTIC", "SOFTMAX"):
        conv.fail(f"post_transform {post}: kmlc compiles NONE, LOGISTIC and SOFTMAX", node)
    f = x.type.shape[-1]
    rows = np.asarray(a.get("coefficients", []), np.float32).size // max(f, 1)
    labels = [int(v) for v in a.get("classlabels_ints", [])]
    scores_out = node.output[1] if len(node.output) > 1 and node.output[1] else None
    s = _linear(conv, node, a, x, rows)
    if rows == 1:
        pos, neg = (labels[1], labels[0]) if len(labels) == 2 else (1, 0)
        flat = _op(conv, node, "reshape", [s], {"shape": [s.type.shape[0]]})
        zero = _const(conv, node, "zero", np.zeros(1, np.float32))
        win = _op(conv, node, "compare", [flat, zero], {"cmp": "gt"})
        _op(conv, node, "where", [win, _const(conv, node, "positive", np.array([pos], np.int64)),
                                  _const(conv, node, "negative", np.array([neg], np.int64))],
            last=True)
        if scores_out:
            if len(labels) == 2:      # [1 - t, t] = t @ [[-1, 1]] + [1, 0], exact in float
                t = _op(conv, node, "sigmoid", [s]) if post == "LOGISTIC" else s
                sign = _const(conv, node, "sign", np.array([[-1, 1]], np.float32))
                one = _const(conv, node, "one", np.array([1, 0], np.float32))
                _gemm(conv, node, [t, sign, one], out=scores_out)
            else:
                _op(conv, node, "reshape", [s], {"shape": list(s.type.shape)}, out=scores_out)
        return
    if len(labels) != rows:
        conv.fail(f"{len(labels)} class labels for {rows} rows of coefficients", node)
    idx = _op(conv, node, "argmax", [s], {"axis": 1, "keepdims": 0, "select_last_index": 0})
    _label_of(conv, node, idx, labels)
    if scores_out:
        _scores(conv, node, s, post, scores_out)


def _scores(conv, node, s, post: str, out: str) -> None:
    """A classifier's scores output ``out``: its raw scores ``s`` under
    post_transform NONE, LOGISTIC or SOFTMAX."""
    if post == "NONE":
        _op(conv, node, "reshape", [s], {"shape": list(s.type.shape)}, out=out)
    elif post == "LOGISTIC":
        _op(conv, node, "sigmoid", [s], out=out)
    else:
        _op(conv, node, "softmax", [s], {"axis": -1}, out=out)


def _label_of(conv, node, idx, labels: list[int]) -> None:
    """The node's first output: labels[idx], by a chain of selects."""
    if labels == list(range(len(labels))):
        _op(conv, node, "reshape", [idx], {"shape": list(idx.type.shape)}, last=True)
        return
    acc = _const(conv, node, "label0", np.array([labels[0]], np.int64))
    for k in range(1, len(labels)):
        hit = _op(conv, node, "compare", [idx, _const(conv, node, f"row{k}",
                                                      np.array([k], np.int64))], {"cmp": "eq"})
        acc = _op(conv, node, "where", [hit, _const(conv, node, f"label{k}", np.array(
            [labels[k]], np.int64)), acc], last=k == len(labels) - 1)
