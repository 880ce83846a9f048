"""Ops on runtime tensors: data movement (Transpose, Slice, Split, Concat,
Expand, Squeeze, Unsqueeze, Gather by runtime indices), float math (Exp,
Log, Sqrt, Pow by constants, Reciprocal, Erf), reductions (opset 13 and 18
forms), Sum and Mean, CastLike, and the ops written as several
(BatchNormalization, LayerNormalization, Gelu, LogSoftmax, HardSigmoid).

Each model runs in the twin on hostile rows and is compared with
onnxruntime (within a tolerance from the values' magnitude: kmlc's exp, log
and erf are within 1 ulp, and its sums run in its documented order) and
with kmlc's reference evaluator, bit for bit.  Gather's out-of-range
indices, which onnxruntime refuses, are held to a numpy oracle.  The
models then build as kernel modules (W=1, checkpatch, stack, no libm) and
equal their twins under KUnit.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import check_refused, fixed_math, float_bound_holds, make_model
from kmlc.api import compile as kcompile, load
from kmlc.frontends.onnx import load as load_graph
from kmlc.ops import interpret

ort = pytest.importorskip("onnxruntime")


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def i64(*v):
    return np.array(v, np.int64)


def features():
    """A feature pipeline: log1p of the first four features' magnitudes,
    the square root of the next two, the last two reversed, concatenated
    and reduced; then a dense layer."""
    n = helper.make_node
    nodes = [n("Slice", ["x", "s0", "e0", "ax"], ["a"], name="first4"),
             n("Abs", ["a"], ["aa"]), n("Add", ["aa", "one"], ["a1"]), n("Log", ["a1"], ["la"]),
             n("Slice", ["x", "s1", "e1", "ax"], ["b"], name="mid2"),
             n("Abs", ["b"], ["ab"]), n("Sqrt", ["ab"], ["sb"]),
             n("Slice", ["x", "s2", "e2", "ax", "st"], ["c"], name="last2_reversed"),
             n("Concat", ["la", "sb", "c", "x"], ["f"], axis=1, name="features"),
             n("ReduceMean", ["f"], ["mu"], axes=[1], keepdims=1, name="mean"),
             n("Sub", ["f", "mu"], ["fc"]),
             n("Gemm", ["fc", "w", "bias"], ["y"], transB=1, name="fc")]
    rng = np.random.default_rng(1)
    inits = {"s0": i64(0), "e0": i64(4), "ax": i64(1), "one": np.float32(1), "s1": i64(4),
             "e1": i64(6), "s2": i64(-1), "e2": i64(-3), "st": i64(-1),
             "w": rng.normal(size=(3, 16)).astype(np.float32), "bias": np.float32([1, -1, 0])}
    return make_model(nodes, [("x", [1, 8])], [("y", [1, 3])], inits, opset=13)


def reductions(opset, configs=(("a02", 0), ("a1", 1))):
    """Every reduction over two non-adjacent axes and over one, kept and
    dropped, in the opset's form (axes an attribute before 18, an input
    from 18; ReduceSum's an input from 13)."""
    n = helper.make_node
    ops = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
    nodes, outs, inits = [], [], {"a02": i64(0, 2), "a1": i64(-2)}
    for i, op in enumerate(ops):
        for axes, keep in configs:
            y = f"{op}_{axes}_{keep}"
            src = "xa" if op in ("ReduceLogSum", "ReduceL1") else "x"
            if opset >= 18 or op == "ReduceSum":
                nodes.append(n(op, [src, axes], [y], keepdims=keep, name=y))
            else:
                nodes.append(n(op, [src], [y], axes=inits[axes].tolist(), keepdims=keep, name=y))
            outs.append((y, [3] if keep == 0 else [2, 1, 4]))
    nodes.insert(0, n("Abs", ["x"], ["xa"]))
    cat = [n("Reshape", [y, "flat"], [y + "_f"]) for y, _ in outs]
    nodes += cat + [n("Concat", [y + "_f" for y, _ in outs], ["y"], axis=0)]
    inits["flat"] = i64(-1)
    total = sum(int(np.prod(s)) for _, s in outs)
    return make_model(nodes, [("x", [2, 3, 4])], [("y", [total])], inits, opset=opset)


def movement():
    """Transpose, Split (sizes, and opset 18's num_outputs), Expand,
    Squeeze/Unsqueeze, CastLike, Sum and Mean of three."""
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[2, 0, 1]),             # [4, 2, 3]
             n("Split", ["t", "sp"], ["p", "q"], axis=0),               # [1,2,3] [3,2,3]
             n("Split", ["q"], ["q0", "q1", "q2"], axis=0, num_outputs=3),
             n("Sum", ["q0", "q1", "q2"], ["s"]), n("Mean", ["q0", "q1", "p"], ["m"]),
             n("Squeeze", ["s", "ax0"], ["s2"]), n("Unsqueeze", ["s2", "ax2"], ["s3"]),  # [2,3,1]
             n("Expand", ["s3", "shape"], ["e"]),                        # [2,3,4]
             n("CastLike", ["e", "x"], ["c"]),
             n("Concat", ["c", "x"], ["y"], axis=0)]
    inits = {"sp": i64(1, 3), "ax0": i64(0), "ax2": i64(2), "shape": i64(2, 1, 4)}
    return make_model(nodes, [("x", [2, 3, 4])], [("y", [4, 3, 4]), ("m", [1, 2, 3])], inits,
                      opset=18)


def norms():
    """LayerNormalization (its Mean and InvStdDev outputs too), inference
    BatchNormalization, Gelu (both forms), LogSoftmax, HardSigmoid, Erf,
    Reciprocal and Pow by constants."""
    n = helper.make_node
    rng = np.random.default_rng(2)
    nodes = [n("Reshape", ["x", "s4"], ["x4"]),
             n("LayerNormalization", ["x", "g", "b"], ["ln", "lm", "li"], axis=-1, epsilon=1e-3),
             n("BatchNormalization", ["x4", "bs", "bb", "bm", "bv"], ["bn"], epsilon=1e-4),
             n("Gelu", ["x"], ["ge"]), n("Gelu", ["x"], ["gt"], approximate="tanh"),
             n("LogSoftmax", ["x"], ["ls"], axis=1), n("HardSigmoid", ["x"], ["hs"], alpha=0.3),
             n("Erf", ["x"], ["er"]), n("Reciprocal", ["x"], ["rc"]),
             n("Pow", ["x", "two"], ["p2"]), n("Pow", ["x", "three"], ["p3"]),
             n("Pow", ["x", "mhalf"], ["pm"]), n("Pow", ["x", "mtwo"], ["pn"]),
             n("Pow", ["x", "e15"], ["pe"]), n("Pow", ["x", "etab"], ["pt"]),
             n("Reshape", ["bn", "s6"], ["bn6"])]
    outs = ["ln", "lm", "li", "bn6", "ge", "gt", "ls", "hs", "er", "rc", "p2", "p3", "pm", "pn",
            "pe", "pt"]
    inits = {"g": rng.normal(size=6).astype(np.float32),
             "b": rng.normal(size=6).astype(np.float32),
             "bs": np.float32([0.5, 2, -1]), "bb": np.float32([0, 1, -2]),
             "bm": np.float32([0.1, -0.3, 2]), "bv": np.float32([1, 0.25, 4]),
             "two": np.float32(2), "three": np.float32(3), "mhalf": np.float32(-0.5),
             "mtwo": np.float32(-2), "e15": np.float32(1.5),
             "etab": np.float32([2, 3, 0.5, 1.5, -1, 4]), "s4": i64(1, 3, 2, 1),
             "s6": i64(1, 6)}
    shapes = {"lm": [1, 1], "li": [1, 1]}
    return make_model(nodes, [("x", [1, 6])], [(o, shapes.get(o, [1, 6])) for o in outs],
                      inits, opset=20)


def embedding():
    """An embedding lookup by a runtime index (the first feature, cast to
    int64) beside the other features: Gather of a constant table."""
    n = helper.make_node
    rng = np.random.default_rng(3)
    nodes = [n("Slice", ["x", "z", "one", "ax"], ["i"]), n("Cast", ["i"], ["ii"], to=7),
             n("Squeeze", ["ii", "ax"], ["k"]),
             n("Gather", ["table", "k"], ["e"], axis=0),               # [1, 4]
             n("Slice", ["x", "one", "big", "ax"], ["rest"]),
             n("Concat", ["e", "rest"], ["y"], axis=1)]
    inits = {"z": i64(0), "one": i64(1), "big": i64(99), "ax": i64(1),
             "table": rng.normal(size=(5, 4)).astype(np.float32)}
    return make_model(nodes, [("x", [1, 3])], [("y", [1, 6])], inits, opset=13)


def fixed_pipeline():
    """Integer features [1, 3]: an embedding row looked up by the first
    (Gather of a constant table), the others cast to float into a dense
    layer whose activations are summed over an axis (ReduceSum), averaged
    over another (ReduceMean) and picked by constant indices (Gather)."""
    n = helper.make_node
    rng = np.random.default_rng(1)
    nodes = [n("Slice", ["x", "z", "one", "ax"], ["i"]), n("Squeeze", ["i", "ax"], ["k"]),
             n("Gather", ["table", "k"], ["e"], axis=0),
             n("Slice", ["x", "one", "big", "ax"], ["ri"]), n("Cast", ["ri"], ["rf"], to=1),
             n("Gemm", ["rf", "w0", "b0"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("Reshape", ["r", "sh"], ["r3"]),
             n("ReduceSum", ["r3", "ax"], ["s"], keepdims=0),
             n("ReduceMean", ["r3"], ["m"], axes=[2], keepdims=0),
             n("Gather", ["r", "pick"], ["g"], axis=1)]
    inits = {"z": i64(0), "one": i64(1), "big": i64(99), "ax": i64(1), "sh": i64(1, 2, 4),
             "table": rng.normal(size=(6, 4)).astype(np.float32),
             "w0": rng.normal(size=(8, 2)).astype(np.float32),
             "b0": rng.normal(size=8).astype(np.float32), "pick": i64(2, 0, 7)}
    m = make_model(nodes, [("x", [1, 3])],
                   [("e", [1, 4]), ("s", [1, 4]), ("m", [1, 2]), ("g", [1, 3])], inits, opset=13)
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    return m


def fixed_arithmetic():
    """Arithmetic on activations in fixed point: a residual Add of two
    layers' outputs, BatchNormalization kept (after the Add, nothing to fold
    into), Sub of two activations, Div by a constant, Sum of three and Mean
    of two activations, a constant minus an activation, and a last layer."""
    n = helper.make_node
    rng = np.random.default_rng(2)
    nodes = [n("Gemm", ["x", "w0", "b0"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("Gemm", ["x", "w1", "b1"], ["h2"], transB=1), n("Add", ["r", "h2"], ["res"]),
             n("BatchNormalization", ["res", "sc", "bi", "mu", "va"], ["bn"]),
             n("Sub", ["bn", "r"], ["d"]), n("Div", ["d", "three"], ["q"]),
             n("Sum", ["q", "r", "h2"], ["s3"]), n("Mean", ["q", "r"], ["mn"]),
             n("Sub", ["one", "mn"], ["om"]), n("Gemm", ["s3", "w2", "b2"], ["y"], transB=1)]
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    inits = {"w0": f(6, 4), "b0": f(6), "w1": f(6, 4), "b1": f(6), "sc": f(6), "bi": f(6),
             "mu": f(6), "va": rng.uniform(0.5, 2, size=6).astype(np.float32),
             "three": np.float32(3), "one": np.float32([1, 2, 3, 4, 5, 6]), "w2": f(2, 6),
             "b2": np.zeros(2, np.float32)}
    return make_model(nodes, [("x", [1, 4])], [("y", [1, 2]), ("om", [1, 6]), ("bn", [1, 6])],
                      inits, opset=15)


def fixed_pipeline_rows(count, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, 6, (count, 1)), rng.integers(-50, 50, (count, 2))],
                          1).astype(np.int64)


MODELS = {"features": features, "reductions13": lambda: reductions(13),
          "reductions18": lambda: reductions(18), "movement": movement, "norms": norms,
          "embedding": embedding,
          # for the module build: one form each (the forward function's frame
          # grows with the count of buffers; -O0's stays within 512 bytes)
          "reductions": lambda: reductions(18, (("a02", 0),))}


def hostile_rows(shape, seed):
    rng = np.random.default_rng(seed)
    rows = [rng.normal(size=shape).astype(np.float32) * s for s in (1, 3, 30)]
    rows.append(np.full(shape, 0.5, np.float32))
    special = np.resize(np.float32([0.0, -0.0, 1e-30, -2.5, 4.0, 85.0, -90.0, 1.0]), shape)
    rows.append(special.astype(np.float32))
    return rows


def run_both(m, tmp_path, rows):
    kcompile(m, tmp_path / "o", targets="user", name="case")
    twin = load(tmp_path / "o")
    sess = ort.InferenceSession(m.SerializeToString())
    g = load_graph(m, name="case")
    for x in rows:
        got = [y[0] for y in twin.run_named(x.reshape(1, -1)).values()]
        want = sess.run(None, {"x": x})
        ref = interpret(g, x)
        yield x, got, want, ref


@pytest.mark.parametrize("name", MODELS)
def test_against_onnxruntime_and_the_evaluator(name, tmp_path):
    m = MODELS[name]()
    onnx.checker.check_model(m, full_check=True)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    rows = hostile_rows(shape, 0)
    if name == "embedding":     # indices 0..4 and a negative one (from the end)
        rows = [np.float32([[k, 0.5, -2]]) for k in (0, 1, 4, 3.9, -1, -5)]
    for x, got, want, ref in run_both(m, tmp_path, rows):
        for y, w, r in zip(got, want, ref):
            assert y.tobytes() == r.tobytes(), "twin != reference evaluator"
            assert y.shape == w.shape and y.dtype == w.dtype
            # within 4 ulps of the value and of the row's largest magnitude
            # (differently ordered sums cancel differently)
            tol = 4 * np.finfo(np.float32).eps * (np.abs(w) + np.abs(w[np.isfinite(w)]).max(
                initial=0) + np.abs(x).max())
            fin = np.isfinite(w)
            assert np.array_equal(np.isnan(y), np.isnan(w)), (name, x, y, w)
            assert np.array_equal(y[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)])
            assert np.all(np.abs(y[fin] - w[fin]) <= tol[fin] + 1e-30), (
                name, x, np.max(np.abs(y[fin] - w[fin]) - tol[fin]))


def test_gather_out_of_range_gives_zeros(tmp_path):
    """onnxruntime refuses an index outside [-n, n); the kernel writes 0
    there, never reading outside the table (docs/numerics.md)."""
    m = embedding()
    table = next(onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.name == "table")
    kcompile(m, tmp_path / "o", targets="user", name="case")
    twin = load(tmp_path / "o")
    for k in (5, -6, 1e9, -1e9, np.nan, 2**62):
        x = np.float32([[k, 7, 8]])
        (y,) = twin.run_named(x.reshape(1, -1)).values()
        y = y[0]
        assert np.array_equal(y[0, :4], np.zeros(4, np.float32)), (k, y)
        assert np.array_equal(y[0, 4:], np.float32([7, 8]))
    (y,) = twin.run_named(np.float32([[-2, 7, 8]])).values()
    assert np.array_equal(y[0][0, :4], table[3])


def test_power_of_negative_numbers_and_zero(tmp_path):
    """Integer powers keep the sign (x^3 of -2 is -8, x^-2 of -2 is 0.25);
    a non-integer power of a negative number is NaN; x^0 is 1 for 0 and
    NaN too; as onnxruntime."""
    n = helper.make_node
    m = make_model([n("Pow", ["x", "e"], ["y"])], [("x", [1, 6])], [("y", [1, 6])],
                   {"e": np.float32([3, -2, 1.5, 0.5, 0, 0])}, opset=13)
    x = np.float32([[-2, -2, -4, -9, 0, np.nan]])
    for _, got, want, _ in run_both(m, tmp_path, [x]):
        assert np.allclose(got[0][:, :2], [[-8, 0.25]]) and np.isnan(got[0][:, 2:4]).all()
        assert np.array_equal(got[0][:, 4:], [[1, 1]])
        assert np.array_equal(np.isnan(got[0]), np.isnan(want[0]))


def test_refusals(tmp_path):
    """Runtime exponents, runtime shapes, training-mode BatchNorm, empty
    slices, and products of activations in fixed point: one line each."""
    n = helper.make_node
    for d in "abc":
        (tmp_path / d).mkdir()
    m = make_model([n("Pow", ["x", "x"], ["y"], name="pw")], [("x", [1, 3])], [("y", [1, 3])])
    check_refused(m, "exponent must be a constant", "pw", tmp_path / "a")
    m = make_model([n("Slice", ["x", "s", "e", "a"], ["y"], name="sl")], [("x", [1, 3])],
                   [("y", [1, 0])], {"s": i64(2), "e": i64(1), "a": i64(1)})
    check_refused(m, "empty", "sl", tmp_path / "b")
    m = make_model([n("ReduceProd", ["x", "a"], ["r"], name="rprod"),
                    n("Gemm", ["r", "w"], ["y"], transB=1)], [("x", [1, 3])], [("y", [1, 2])],
                   {"a": i64(1), "w": np.ones((2, 1), np.float32)}, opset=18)
    from kmlc.errors import KmlcError
    with pytest.raises(KmlcError, match="rprod.*reduction by prod"):
        kcompile(m, tmp_path / "c", targets="user", numerics="fixed",
                 calibration=np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32))


def test_fixed_point_moves(tmp_path):
    """In fixed point, copies keep their operand's encoding: a slice,
    transpose and concat of hidden activations, and their max, give the
    float model's decisions on the calibration rows."""
    n = helper.make_node
    rng = np.random.default_rng(5)
    nodes = [n("Gemm", ["x", "w0", "b0"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("Slice", ["r", "s", "e", "a"], ["lo"]), n("Slice", ["r", "e", "e2", "a"], ["hi"]),
             n("Max", ["lo", "hi"], ["mx"]), n("Concat", ["mx", "lo"], ["c"], axis=1),
             n("ReduceMax", ["c"], ["rm"], axes=[1], keepdims=1),
             n("Concat", ["c", "rm"], ["c2"], axis=1),
             n("Gemm", ["c2", "w1", "b1"], ["y"], transB=1), n("ArgMax", ["y"], ["k"], axis=1)]
    inits = {"w0": rng.normal(size=(8, 5)).astype(np.float32),
             "b0": rng.normal(size=8).astype(np.float32), "s": i64(0), "e": i64(4),
             "e2": i64(8), "a": i64(1), "w1": rng.normal(size=(3, 9)).astype(np.float32),
             "b1": np.zeros(3, np.float32)}
    m = make_model(nodes, [("x", [1, 5])], [("k", [1, 1])], inits, opset=13)
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    cal = rng.normal(size=(2000, 5)).astype(np.float32)
    kcompile(m, tmp_path / "fx", targets="user", numerics="fixed", calibration=cal)
    kcompile(m, tmp_path / "fp", targets="user")
    fx, fp = load(tmp_path / "fx"), load(tmp_path / "fp")
    a = next(iter(fx.run_named(cal).values())).reshape(-1)
    b = next(iter(fp.run_named(cal).values())).reshape(-1)
    assert np.mean(a == b) >= 0.995, np.mean(a == b)


def test_fixed_point_gathers_and_sums(tmp_path):
    """Fixed point: the embedding table is int16 on its own scale (each
    value within half a step), an index outside it gives exactly 0 as in
    float; ReduceSum and ReduceMean are dense layers of ones (int8, exact
    sums, one requantization); a gather of activations copies them.  Every
    output is within the compiler's own error bound of onnxruntime's on
    rows like the calibration's."""
    m = fixed_pipeline()
    onnx.checker.check_model(m, full_check=True)
    cal = fixed_pipeline_rows(2000)
    res = kcompile(m, tmp_path / "fx", targets="user", numerics="fixed", calibration=cal)
    report = (tmp_path / "fx" / "report.txt").read_text()
    assert "ReduceSum_8 (ReduceSum): 8" in report and "ReduceMean_9 (ReduceMean): 8" in report
    fx = load(tmp_path / "fx")
    rows = fixed_pipeline_rows(3000, seed=1)
    got = fx.run_named(rows)
    sess = ort.InferenceSession(m.SerializeToString())
    want = [np.concatenate(z) for z in zip(*[sess.run(None, {"x": r[None]}) for r in rows])]
    bounds = {o["name"]: o["error_bound"] for o in res.manifest["fixed"]["outputs"]}
    for (name, a), b in zip(got.items(), want):
        err = np.abs(a.reshape(b.shape) - b).max()
        assert 0 < err <= bounds[name], (name, err, bounds[name])
    oor = np.array([[6, 1, 2], [-7, 1, 2], [10**9, 1, 2], [-2**62, 1, 2]], np.int64)
    assert np.array_equal(fx.run_named(oor)["e"], np.zeros((4, 1, 4), np.float32))
    table = next(onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.name == "table")
    e = fx.run_named(np.array([[-1, 1, 2]], np.int64))["e"][0, 0]
    assert np.abs(e - table[5]).max() <= np.abs(table).max() / 32767   # half a step each side


def test_fixed_point_arithmetic_on_activations(tmp_path):
    """Add, Sub, Sum and Mean of activations, Mul and Div by constants, a
    kept BatchNormalization: one linear kernel each (an integer multiplier
    per operand, one rounding), every output within the compiler's own
    error bound of onnxruntime's on fresh rows; a quotient by, or a
    Reciprocal of, a value whose calibrated range reaches 0 is refused in
    one line."""
    m = fixed_arithmetic()
    onnx.checker.check_model(m, full_check=True)
    rng = np.random.default_rng(7)
    res = kcompile(m, tmp_path / "fx", targets="user", numerics="fixed",
                   calibration=rng.normal(size=(2000, 4)).astype(np.float32))
    assert (tmp_path / "fx" / "report.txt").read_text().count("kml_qlin(") == 10
    rows = rng.normal(size=(3000, 4)).astype(np.float32)
    got = load(tmp_path / "fx").run_named(rows)
    sess = ort.InferenceSession(m.SerializeToString())
    want = [np.concatenate(z) for z in zip(*[sess.run(None, {"x": r[None]}) for r in rows])]
    bounds = {o["name"]: o["error_bound"] for o in res.manifest["fixed"]["outputs"]}
    for (name, a), b in zip(got.items(), want):
        err = np.abs(a.reshape(b.shape) - b).max()
        assert 0 < err <= bounds[name] < 0.01 * np.abs(b).max(), (name, err, bounds[name])
    n = helper.make_node
    cal = rng.normal(size=(64, 3)).astype(np.float32)
    from kmlc.errors import KmlcError
    why = "{} a value whose calibrated range reaches 0"
    for op, ins, what in (("Div", ["two", "h"], "quotient by"), ("Div", ["r", "h"], "quotient by"),
                          ("Reciprocal", ["h"], "reciprocal of")):
        bad = make_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
                          n(op, ins, ["y"], name="bad")], [("x", [1, 3])], [("y", [1, 2])],
                         {"w": np.ones((2, 3), np.float32), "b": np.ones(2, np.float32),
                          "two": np.float32(2)})
        with pytest.raises(KmlcError, match=f"bad.*{why.format(what)}"):
            kcompile(bad, tmp_path / (op + ins[0]), targets="user", numerics="fixed",
                     calibration=cal)


def test_fixed_point_functions_and_products_of_activations(tmp_path):
    """Exp, Log, Sqrt, Erf and Reciprocal by tables (kml_tab), products and
    quotients of activations (kml_qmul), LayerNormalization and Gelu: every
    output within the compiler's own error bound of onnxruntime's on fresh
    rows whose activations stay inside their encodings (the errors within
    1% of the output's largest value, the bounds within 2% of it for
    functions with bounded slopes over their inputs' proven ranges: not 1/x
    or exp, and not composites of them); the tables chosen are small; a
    retrained model packs for it."""
    m = fixed_math()
    onnx.checker.check_model(m, full_check=True)
    rng = np.random.default_rng(7)
    cal = rng.normal(size=(1000, 4)).astype(np.float32)
    res = kcompile(m, tmp_path / "fx", targets="user", numerics="fixed", calibration=cal)
    report = (tmp_path / "fx" / "report.txt").read_text()
    assert report.count("kml_qmul(") == 9 and report.count(" qtab(") == 17, report
    rows = rng.normal(size=(2000, 4)).astype(np.float32)
    twin = load(tmp_path / "fx")
    got = twin.run_named(rows)
    # the bound holds where no activation left its encoding (a value below
    # an encoding that calibration put at 0 and up saturates there): almost
    # every row
    inside = twin.last_saturations.reshape(-1) == 0
    assert inside.mean() > 0.99, inside.mean()
    sess = ort.InferenceSession(m.SerializeToString())
    want = dict(zip([o.name for o in m.graph.output],
                    [np.concatenate(z) for z in zip(*[sess.run(None, {"x": r[None]})
                                                      for r in rows])]))
    bounds = {o["name"]: o["error_bound"] for o in res.manifest["fixed"]["outputs"]}
    for name, b in want.items():
        a = got[name].reshape(b.shape)
        err = np.abs(a - b)[inside].max()
        assert 0 < err <= bounds[name], (name, err, bounds[name])
        assert err < 0.01 * np.abs(b).max(), (name, err, np.abs(b).max())
        if name in ("l", "s", "er", "p", "sq", "gelu", "ls", "lse", "mx", "cc"):
            assert bounds[name] < 0.02 * np.abs(b).max(), (name, bounds[name])
    tables = [op for op in res.program.quant.int_graph.ops if op.kind == "qtab"]
    assert len(tables) == 17 and all(op.inputs[1].type.numel <= 1025 for op in tables)
    # a row driving exp (and others) beyond their outputs' encodings: each
    # value is counted, by the C as by the evaluator
    from kmlc.ops import saturations
    far = np.float32([[9, -9, 9, -9], [0.1, 0.2, -0.1, 0]])
    twin.run(far)
    g = res.program.quant.int_graph
    want_sat = [saturations(g, r.reshape(g.inputs[0].type.shape)) for r in twin.encode(far)]
    assert twin.last_saturations.reshape(-1).tolist() == want_sat and want_sat[0] > 0 \
        and want_sat[1] == 0, want_sat
    # retrained weights pack for it (LayerNormalization's two means are two
    # layers of one node: each named once), and the twin runs them
    from onnx import numpy_helper

    from kmlc.api import pack
    w1 = next(i for i in m.graph.initializer if i.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w1) * np.float32(1.05), "w1"))
    pack(m, tmp_path / "fx", tmp_path / "new.kmlw", calibration=cal)
    moved = load(tmp_path / "fx", weights=tmp_path / "new.kmlw").run_named(rows[:50])
    assert not np.array_equal(moved["ls"], got["ls"][:50])
    # beyond calibration, Sqrt of a negative value is 0 and Log of one the
    # lowest code: the functions' values at their domains' edge (ONNX gives
    # NaN; calibration itself refuses a NaN)
    n = helper.make_node
    neg = make_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1), n("Sqrt", ["h"], ["s"]),
                      n("Log", ["h"], ["l"])],
                     [("x", [1, 1])], [("s", [1, 1]), ("l", [1, 1])],
                     {"w": np.ones((1, 1), np.float32), "b": np.zeros(1, np.float32)})
    kcompile(neg, tmp_path / "neg", targets="user", numerics="fixed",
             calibration=np.linspace(0.1, 4, 200, dtype=np.float32)[:, None])
    out = load(tmp_path / "neg").run_named(np.float32([[-3.0], [-0.5], [2.25]]))
    assert out["s"].reshape(-1)[:2].tolist() == [0.0, 0.0]
    assert abs(out["s"].reshape(-1)[2] - 1.5) < 0.01
    assert np.all(out["l"].reshape(-1)[:2] <= -20) and abs(out["l"].reshape(-1)[2] - np.log(2.25)) \
        < 0.01
    # exp of a value its own encoding holds (10x calibration) but whose exp
    # lies beyond exp's encoding: the table's result saturates, and that
    # alone is counted
    ex = make_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1), n("Exp", ["h"], ["e"])],
                    [("x", [1, 1])], [("e", [1, 1])],
                    {"w": np.ones((1, 1), np.float32), "b": np.zeros(1, np.float32)})
    kcompile(ex, tmp_path / "ex", targets="user", numerics="fixed",
             calibration=np.linspace(0.1, 4, 200, dtype=np.float32)[:, None])
    twin = load(tmp_path / "ex")
    e = twin.run(np.float32([[3.0], [7.0]])).reshape(-1)
    assert twin.last_saturations.reshape(-1).tolist() == [0, 1]
    assert abs(e[0] - np.exp(3.0)) < 0.5 and e[1] < np.exp(7.0) / 1.5


def test_fixed_point_never_wraps_a_sliced_integer_input(tmp_path):
    """An integer input sliced, then cast to float for a dense layer, takes
    the graph input's encoding (exact over all int64, no clamp): a value
    beyond int16 saturates the layer's activations (counted), it does not
    wrap around (it did: 40000 became -25536)."""
    m = fixed_pipeline()
    kcompile(m, tmp_path / "fx", targets="user", numerics="fixed",
             calibration=fixed_pipeline_rows(2000))
    kcompile(m, tmp_path / "fp", targets="user")
    fx, fp = load(tmp_path / "fx"), load(tmp_path / "fp")
    big = np.array([[0, 40000, 2], [0, 70000, -3], [0, 10**6, 2]], np.int64)
    g, want = fx.run_named(big)["g"][:, 0], fp.run_named(big)["g"][:, 0]
    top, hot = g.max(), want > 0
    assert hot.sum() >= 6 and np.all(want[hot] > top) and np.all(g[hot] == top), (g, want)
    fx.run_named(big[:1])
    assert fx.last_saturations > 0


@pytest.fixture(scope="module")
def kernel_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensor_ops")
    out = {}
    for name in ("features", "reductions", "movement", "norms", "embedding", "fixed", "arith",
                 "math"):
        d = root / name
        if name == "fixed":      # gathers (with a zero point as fill) and sums as layers
            kcompile(fixed_pipeline(), d, name="t_fixed", targets="all", numerics="fixed",
                     calibration=fixed_pipeline_rows(2000))
        elif name == "math":     # tables and products of activations
            kcompile(fixed_math(), d, name="t_math", targets="all", numerics="fixed",
                     calibration=np.random.default_rng(7).normal(size=(500, 4)).astype(
                         np.float32))
        elif name == "arith":    # linear kernels of activations, counting saturations
            kcompile(fixed_arithmetic(), d, name="t_arith", targets="all", numerics="fixed",
                     calibration=np.random.default_rng(7).normal(size=(2000, 4)).astype(
                         np.float32))
        else:
            kcompile(MODELS[name](), d, name=f"t_{name}", targets="all")
        out[name] = d
    return out


@pytest.mark.kernel
def test_modules_build_and_meet_the_kernel_c_standards(kernel_builds, tmp_path):
    import kernel_c
    from kmlc.targets import kernel

    for name, d in kernel_builds.items():
        kernel_c.check_no_libm_allocation_or_mutable_globals(d, f"t_{name}")
        kernel_c.check_stack_and_no_recursion(d, f"t_{name}", tmp_path)
        kernel_c.check_checkpatch_clean(d / "kernel", strict=True)
        kernel_c.check_checkpatch_clean(d / "kunit", strict=True)
        kernel.build_module(d / "kernel")


@pytest.mark.kunit
def test_modules_equal_their_twins_under_kunit(kernel_builds):
    from kmlc.targets import kunit

    res = kunit.run(list(kernel_builds.values()))
    for name, d in kernel_builds.items():
        assert res["suites"][f"kml_t_{name}"]["passed"] == kunit.cases(d) > 0, res["summary"]


@pytest.mark.parametrize("name", ["features", "reductions18", "embedding"])
def test_float_bound_is_sound(name, tmp_path):
    """``kmlc verify``'s bound (compiler/float_bound.py) holds for these ops
    against onnxruntime in float64 on every finite element, and bounds
    almost every element (an infinite bound would make it say nothing).
    (onnxruntime has no float64 kernels for the other models' ops.)"""
    from kmlc.verify import reference64

    m = MODELS[name]()
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(7)
    rows = np.stack([r.reshape(-1) for r in hostile_rows(shape, 1)] +
                    [rng.normal(size=int(np.prod(shape))).astype(np.float32) * 2
                     for _ in range(200)])
    if name == "embedding":
        rows[:, 0] = np.round(rows[:, 0]) % 5
    res = kcompile(m, tmp_path / "o", targets="user")
    y = load(tmp_path / "o").run(rows).astype(np.float64)
    ref64 = reference64(m, res.program, rows)
    assert ref64 is not None
    for p, _, fin in float_bound_holds(res.program, y, ref64, rows):
        assert fin.mean() > 0.9, (p.name, fin.mean())


def test_a_pytorch_model_with_layer_norm_and_gelu(tmp_path):
    """A module kmlc did not design, through torch.onnx's exporter:
    Linear, LayerNorm, GELU (exact and tanh), a feature-wise max and
    LogSoftmax; the twin is PyTorch's result within float32's rounding and
    the reference evaluator's bit for bit."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.n, self.b = nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(16, 3)

        def forward(self, x):
            h = self.n(self.a(x))
            g = torch.cat([nn.functional.gelu(h), nn.functional.gelu(h, approximate="tanh")], 1)
            g = g - g.amax(dim=1, keepdim=True)
            return torch.log_softmax(self.b(g), dim=1)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 6)
    kcompile(net, x, tmp_path / "o", targets="user")
    twin = load(tmp_path / "o")
    rows = torch.randn(300, 6) * 3
    with torch.no_grad():
        want = net(rows).numpy()
    got = twin.run(rows.numpy())
    assert np.abs(got - want).max() < 2e-5, np.abs(got - want).max()


def test_batch_norm_folds_into_the_dense_layer_in_fixed_point(tmp_path):
    """Gemm then BatchNormalization: float keeps x * s + t after the layer
    (ONNX's order; test_against_onnxruntime_and_the_evaluator[norms] holds
    it to onnxruntime); fixed point folds it into the layer (one qdense),
    with the float model's decisions."""
    n = helper.make_node
    rng = np.random.default_rng(6)
    m = make_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1),
                    n("BatchNormalization", ["h", "s", "bb", "mu", "var"], ["z"]),
                    n("ArgMax", ["z"], ["y"], axis=1)], [("x", [1, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 1])],
                   {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": np.zeros(3, np.float32),
                    "s": np.float32([1, 2, 3]), "bb": np.float32([0, 1, 2]),
                    "mu": np.float32([0.5, 0, -1]), "var": np.float32([1, 4, 0.25])}, opset=15)
    cal = rng.normal(size=(3000, 4)).astype(np.float32)
    fp = kcompile(m, tmp_path / "fp", targets="user")
    fx = kcompile(m, tmp_path / "fx", targets="user", numerics="fixed", calibration=cal)
    assert [op.kind for op in fp.program.graph.ops] == ["dense", "mul", "add", "argmax"]
    assert [op.kind for op in fx.program.graph.ops] == ["qinput", "qdense", "argmax"]
    a = load(tmp_path / "fp").run(cal).reshape(-1)
    b = load(tmp_path / "fx").run(cal).reshape(-1)
    assert np.mean(a == b) >= 0.998, np.mean(a == b)
