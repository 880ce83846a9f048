"""Decision ops (comparisons, Where, logic, Cast, Floor/Ceil/Round,
Max/Min/Abs/Neg) on hostile values, against onnxruntime as the oracle.

ONNX's own node tests (test_onnx_nodes.py) cover ordinary values; these
cases add what they do not: NaN, infinities, signed zeros, halves, values at
and beyond an integer type's range, the most negative integer, and every
Cast between kmlc's types (ONNX ships none among float32, int32, int64 and
bool).  Float results must be onnxruntime's bit for bit, except where
docs/numerics.md fixes what ONNX leaves open (NaN's sign and payload; a
float beyond an integer type's range); the twin must also be the reference
evaluator's bits.  Fixed point must decide comparisons exactly at the real
threshold.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper

from kmlc.api import compile as kcompile, load
from kmlc.frontends.onnx import load as load_graph
from kmlc.ops import interpret

F = np.float32
HOSTILE_F32 = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997,
                        1e-45, -1e-45, 8388607.5, -8388607.5, 8388608.0, 16777217.0, 3e9, -3e9,
                        2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0, 9.2e18, -9.3e18,
                        np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 0.7, -0.7, 1.0, -1.0,
                        123456.789, -0.0001, 1.17549435e-38], dtype=F)
ELEM = {np.float32: T.FLOAT, np.int32: T.INT32, np.int64: T.INT64, np.bool_: T.BOOL}


def model(nodes, ins, outs, inits=()):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, ELEM[t], s)
                                      for n, t, s in ins],
                          [helper.make_tensor_value_info(n, ELEM[t], s) for n, t, s in outs],
                          [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def run_both(m, x, tmp_path, tag):
    """(kmlc twin, onnxruntime, reference evaluator) on one input row."""
    onnx.checker.check_model(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    name = m.graph.input[0].name
    want = sess.run(None, {name: x.reshape(m_shape(m))})[0]
    kcompile(m, tmp_path / tag, targets="user", name="d")
    got = load(tmp_path / tag).run_named(x.reshape(1, -1))
    got = next(iter(got.values()))[0]
    ref = interpret(load_graph(m, name="d"), x.reshape(m_shape(m)))[0]
    return got.reshape(-1), np.asarray(want).reshape(-1), ref.reshape(-1)


def m_shape(m):
    return [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":     # NaN's sign and payload are not fixed by IEEE or ONNX
        na, nb = np.isnan(a), np.isnan(b)
        return np.array_equal(na, nb) and a[~na].tobytes() == b[~nb].tobytes()
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Abs", "Neg"])
def test_float_unary_hostile(op, tmp_path):
    n = len(HOSTILE_F32)
    m = model([helper.make_node(op, ["x"], ["y"])], [("x", F, [1, n])], [("y", F, [1, n])])
    got, want, ref = run_both(m, HOSTILE_F32, tmp_path, op)
    assert same_bits(got, want), list(zip(HOSTILE_F32, got, want))
    assert got.tobytes() == ref.tobytes()


@pytest.mark.parametrize("op", ["Max", "Min", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
                                "Equal"])
def test_float_binary_hostile(op, tmp_path):
    """Every hostile value (x) against every finite one (a constant row:
    kmlc refuses non-finite constants), broadcast."""
    n = len(HOSTILE_F32)
    c = HOSTILE_F32[np.isfinite(HOSTILE_F32)]
    out = np.bool_ if op not in ("Max", "Min") else F
    m = model([helper.make_node(op, ["x", "c"], ["y"])], [("x", F, [n, 1])],
              [("y", out, [n, len(c)])], [("c", c.reshape(1, -1))])
    got, want, ref = run_both(m, HOSTILE_F32.reshape(n, 1), tmp_path, op)
    if op in ("Max", "Min"):
        # ONNX leaves max(-0, +0) open: onnxruntime and numpy may pick either zero
        zero = (np.abs(got) == 0) & (np.abs(want) == 0)
        assert same_bits(np.where(zero, 0, got), np.where(zero, 0, want))
    else:
        assert np.array_equal(got, want)
    assert got.tobytes() == ref.tobytes()


CASTS = [(F, np.int32), (F, np.int64), (F, np.bool_), (np.int64, F), (np.int32, F),
         (np.bool_, F), (np.int64, np.int32), (np.int32, np.int64), (np.int64, np.bool_),
         (np.bool_, np.int64)]


def hostile(t):
    if t == F:
        return HOSTILE_F32
    if t == np.bool_:
        return np.array([True, False, True], dtype=t)
    i = np.iinfo(t)
    return np.array([0, 1, -1, i.min, i.max, i.min + 1, 2**24 + 1, -(2**24 + 1), 16777217,
                     2**31 - 1 if t == np.int32 else 2**53 + 1, 123456789], dtype=t)


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{a.__name__}-{b.__name__}" for a, b in CASTS])
def test_cast(src, dst, tmp_path):
    x = hostile(src)
    n = len(x)
    m = model([helper.make_node("Cast", ["x"], ["y"], to=ELEM[dst])], [("x", src, [1, n])],
              [("y", dst, [1, n])])
    got, want, ref = run_both(m, x, tmp_path, "c")
    assert got.dtype == np.dtype(dst) and got.tobytes() == ref.tobytes()
    if src == F and dst in (np.int32, np.int64):
        # ONNX leaves NaN and out-of-range values open: kmlc gives the type's
        # minimum (x86's cvttss2si); elsewhere truncation toward zero
        info = np.iinfo(dst)
        inside = (x >= info.min) & (x < -float(info.min))
        assert np.array_equal(got[inside], np.trunc(x[inside]).astype(dst))
        assert (got[~inside] == info.min).all()
        assert np.array_equal(got[inside], want[inside])
    else:
        assert same_bits(got, want), list(zip(x, got, want))


def test_where_of_integers_and_bools(tmp_path):
    x = np.array([-5, 0, 7, 2**40, -2**62], dtype=np.int64)
    nodes = [helper.make_node("Greater", ["x", "t"], ["c"]),
             helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Where", ["c", "x", "n"], ["w"]),
             helper.make_node("Abs", ["w"], ["y"])]
    m = model(nodes, [("x", np.int64, [1, 5])], [("y", np.int64, [1, 5])],
              [("t", np.array(0, np.int64))])
    got, want, ref = run_both(m, x, tmp_path, "w")
    assert got.dtype == np.int64 and np.array_equal(got, want) and np.array_equal(got, ref)


def test_most_negative_integer_wraps(tmp_path):
    """Abs and Neg of INT64_MIN wrap (what onnxruntime gives), with no
    signed overflow in the C: the twin is built with UBSan in the
    sanitizer tests, and this case is among its inputs."""
    x = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1], dtype=np.int64)
    for op in ("Abs", "Neg"):
        m = model([helper.make_node(op, ["x"], ["y"])], [("x", np.int64, [1, 3])],
                  [("y", np.int64, [1, 3])])
        got, want, _ = run_both(m, x, tmp_path, op)
        assert np.array_equal(got, want), (op, got, want)


@pytest.mark.parametrize("cmp", ["Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal"])
def test_fixed_comparison_is_exact_at_the_threshold(cmp, tmp_path):
    """Fixed point compares an int16 activation q with a real threshold t
    exactly: its decision is the float comparison of the real value it
    holds, (q - zp) * scale, with t, for every q the layer can produce,
    including thresholds that fall exactly on a grid point."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 1)).astype(F)
    t = np.array(0.37, F)
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]),
               helper.make_node(cmp, ["h", "t"], ["y"])],
              [("x", F, [1, 3])], [("y", np.bool_, [1, 1])], [("w", w), ("t", t)])
    cal = rng.standard_normal((400, 3)).astype(F)
    res = kcompile(m, tmp_path / "fx", targets="user", numerics="fixed", calibration=cal,
                   name="d")
    q = res.program.quant
    (hq,) = [v for v in q.params if q.float_of[v].name.startswith("h")]
    p = q.params[hq]
    (op,) = [o for o in res.program.graph.ops if o.kind == "compare"]
    thr = int(op.inputs[1].data.reshape(-1)[0])
    real = lambda qv: (qv - p.zp) * p.scale  # noqa: E731
    rule = {"Greater": np.greater, "GreaterOrEqual": np.greater_equal, "Less": np.less,
            "LessOrEqual": np.less_equal, "Equal": np.equal}[cmp]
    sym = {"Greater": ">", "GreaterOrEqual": ">=", "Less": "<", "LessOrEqual": "<=",
           "Equal": "=="}[cmp]
    from fractions import Fraction
    for qv in range(max(thr - 3, -32768), min(thr + 4, 32768)):
        exact = rule(Fraction(qv - p.zp) * Fraction(p.scale), Fraction(float(t)))
        assert eval(f"{qv} {sym} {thr}") == exact, (qv, thr)    # noqa: S307
    assert real(thr) is not None
