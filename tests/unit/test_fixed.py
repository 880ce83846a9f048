"""Fixed point, pass by pass, on hand-built graphs: the rewrites before
quantization, the overflow proof, the encoding contract and the errors."""
import copy
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import kmlc_cli, make_model, mlp_model
from kmlc.api import compile as kcompile, load, lower_model
from kmlc.errors import KmlcError
from kmlc.frontends.onnx import load as load_graph
from kmlc.ir import Graph, I16, I32, Op, TensorType, Value, const, verify
from kmlc.ops import interpret, run_all
from kmlc.passes import GRAPH_PASSES, bound_ranges, fold_affine, fold_softmax_argmax


def prepared(model):
    g = load_graph(model, name="t")
    for _, p in GRAPH_PASSES:
        g = verify(p(g))
    return g


def normalized_mlp(alpha=1.0):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Sub", ["x", "mean"], ["c"], name="center"),
             helper.make_node("Div", ["c", "std"], ["n"], name="scale"),
             helper.make_node("Mul", ["n", "gain"], ["m"], name="gain"),
             helper.make_node("Gemm", ["m", "w", "b"], ["h"], name="fc", transB=1, alpha=alpha),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    inits = {"mean": np.float32([100, -3, 0.5, 2e4]), "std": np.float32([10, 2, 0.1, 5e3]),
             "gain": np.float32([1, 2, 3, 4]),
             "w": rng.normal(size=(6, 4)).astype(np.float32),
             "b": rng.normal(size=6).astype(np.float32)}
    return make_model(nodes, [("x", ["N", 4])], [("y", ["N", 6])], inits)


def sample_rows(n=500, seed=1):
    r = np.random.default_rng(seed)
    return (np.float32([100, -3, 0.5, 2e4]) + r.standard_normal((n, 4))
            * np.float32([10, 2, 0.1, 5e3])).astype(np.float32)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fold_affine_absorbs_normalization_into_the_first_layer(alpha):
    g = prepared(normalized_mlp(alpha))
    g0 = copy.deepcopy(g)
    g = verify(fold_affine(g))
    assert [op.kind for op in g.ops] == ["dense"]
    assert "center (Sub)" in g.ops[0].origin
    for row in sample_rows(50):
        a, b = interpret(g0, row[None])[0], interpret(g, row[None])[0]
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_softmax_before_argmax_is_folded_away():
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Softmax", ["h"], ["p"], name="sm", axis=1),
             helper.make_node("ArgMax", ["p"], ["c"], name="am", axis=1, keepdims=0)]
    m = make_model(nodes, [("x", [1, 3])], [helper.make_tensor_value_info(
        "c", onnx.TensorProto.INT64, [1])], {"w": np.eye(3, dtype=np.float32)})
    g = verify(fold_softmax_argmax(prepared(m)))
    assert [op.kind for op in g.ops] == ["dense", "argmax"]
    assert g.ops[1].origin == ("sm (Softmax)", "am (ArgMax)")


def qdense_graph(k, wbits_value, bias=0):
    """x: i32[k] -> qinput -> qdense with every weight = wbits_value, by
    hand: shift 16 maps every int32 input into [-32768, 32768]."""
    x = Value("x", TensorType(I32, (1, k)))
    w = const("w", np.full((1, k), wbits_value, dtype=np.int16))
    b = const("b", np.array([bias], dtype=np.int64))
    y = Value("y", TensorType(I16, (1, 1)))
    op = Op("qdense", [x, w, b], [y], {"mode": "clamp", "scale": [1e-6], "zp": 0,
                                        "lo": -32768, "hi": 32767, "shape": [1, 1]}, ("fc (Gemm)",))
    xi = Value("xi", TensorType(I32, (1, k)))
    qin = Op("qinput", [xi], [x], {"center": [0] * k, "shift": [16] * k}, ("input x",))
    return Graph("t", [xi], [y], [qin, op])


def test_accumulator_widened_where_int32_could_overflow():
    small = verify(bound_ranges(qdense_graph(8, 127)))
    assert small.ops[1].attrs["acc"] == "i32"
    big = verify(bound_ranges(qdense_graph(8, 32767)))  # 8 * 32768 * 32767 > 2^31
    a = big.ops[1].attrs
    assert a["acc"] == "i64" and a["acc_bound"] == 8 * 32768 * 32767
    assert big.ops[1].inputs[2].data.dtype == np.int64
    # the proven bound really is reached by an extreme input, and the
    # evaluator (the C's mirror) computes it without wrapping
    acc = run_all(big, np.full((1, 8), -2**31, np.int32))
    assert acc[big.ops[0].output].min() == -32768


def test_proof_fails_naming_the_node_when_int64_cannot_hold_it():
    with pytest.raises(KmlcError, match=r"fc \(Gemm\).*does not fit in int64"):
        bound_ranges(qdense_graph(8, 1, bias=2**62))


def test_int_interpreter_matches_requant_by_hand():
    g = verify(bound_ranges(qdense_graph(2, 3, bias=5)))
    a = g.ops[1].attrs
    x = np.array([[2**20, -2**20]], dtype=np.int32)  # -> x_q = 16, -16 (shift 16)
    y = interpret(g, x)[0]
    acc = 5 + 16 * 3 - 16 * 3
    exact = acc * a["mult"][0] / 2 ** a["shift"][0]
    assert y[0, 0] == int(np.floor(abs(exact) + 0.5)) * np.sign(exact)


def test_zero_range_feature_is_computed(tmp_path):
    """A feature that never varies in calibration is still an input: a
    value other than the calibrated one moves the outputs toward what
    onnxruntime computes (it was once clamped back to the single value)."""
    from kmlc.verify import reference_outputs

    m = normalized_mlp()
    cal = sample_rows(400)
    cal[:, 2] = 0.5  # never varies in calibration
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal,
                   name="zr")
    twin = load(tmp_path / "o")
    x = sample_rows(50, seed=3)
    x[:, 2] = 0.5
    a = twin.run(x)
    x[:, 2] = 0.52    # 0.2 std away: within what the int32 encoding holds
    b = twin.run(x)
    ref = reference_outputs(m, res.program, x)
    assert not np.array_equal(a, b)
    assert np.abs(b - ref).max() < np.abs(a - ref).max()


def test_an_output_near_float32s_largest_decodes_finite(tmp_path):
    """A bias of float32's largest value: the output's encoding, ten times
    its calibrated range, is held within float32, so the twin decodes the
    output to a finite value within the compiler's bound of onnxruntime's
    (it decoded to inf, beyond any bound)."""
    import onnxruntime as ort

    big = np.float32(np.finfo(np.float32).max)
    m = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                   [("x", [1, 2])], [("y", [1, 2])],
                   {"w": np.float32([[0.5, -0.25], [1, 1]]), "b": np.float32([big, 1])})
    cal = sample_rows(200)[:, :2]
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal)
    got = load(tmp_path / "o").run(cal[:20]).reshape(20, 2)
    want = np.concatenate([ort.InferenceSession(m.SerializeToString()).run(None, {"x": r[None]})[0]
                           for r in cal[:20]])
    bound = res.manifest["fixed"]["outputs"][0]["error_bound"]
    assert np.isfinite(got).all() and np.abs(got - want).max() <= bound, (got[:2], want[:2])


def test_inputs_beyond_the_calibrated_range_are_exact(tmp_path):
    """y = x - 15, calibrated on x in [0, 10] (so always y < 0): rows far
    beyond, up to the encoding's int32 limit, still decide as float does
    (y >= 0 from x = 15 on, by hand); the inputs used to be clamped to
    10, and y stayed negative.  --input-margin still widens the range the
    encoding is chosen from, and is still checked."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")]
    m = make_model(nodes, [("x", [1, 1])], [("y", [1, 1])],
                   {"w": np.float32([[1.0]]), "b": np.float32([-15.0])})
    cal = np.linspace(0, 10, 200, dtype=np.float32)[:, None]
    for margin in (0.0, 0.25):
        kcompile(m, tmp_path / str(margin), targets="user", numerics="fixed", calibration=cal,
                 input_margin=margin, name="far")
        twin = load(tmp_path / str(margin))
        top = 2.0 ** (31 - twin.fixed["frac_bits"][0])      # the encoding's limit
        x = np.float32([[-0.9 * top], [-30], [-1], [5], [14], [15.5], [20], [30],
                        [0.99 * top]])
        y = twin.run(x)[:, 0]
        assert ((y >= 0) == (x[:, 0] - 15 >= 0)).all(), (margin, x[:, 0], y)
    with pytest.raises(KmlcError, match="--input-margin -1: expected"):
        kcompile(m, tmp_path / "bad", targets="user", numerics="fixed",
                 calibration=cal, input_margin=-1)


def test_encoding_is_documented_and_applied_by_run(tmp_path):
    m = normalized_mlp()
    kcompile(m, tmp_path / "o", numerics="fixed", calibration=sample_rows(), name="enc")
    twin = load(tmp_path / "o")
    x = sample_rows(20, seed=5)
    f = np.array(twin.fixed["frac_bits"])
    manual = np.sign(x * 2.0 ** f) * np.floor(np.abs(x * 2.0 ** f) + 0.5)
    assert np.array_equal(twin.encode(x), manual.astype(np.int32))
    header = (tmp_path / "o" / "kernel" / "enc.h").read_text()
    assert "#define KML_ENC_IN_FRAC_BITS { " + ", ".join(map(str, f)) + " }" in header
    assert "KML_ENC_OUT_Y_ZERO_POINT" in header and "KML_ENC_OUT_Y_SCALE" in header
    np.save(tmp_path / "x.npy", x)
    res = kmlc_cli("run", tmp_path / "o", "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy")
    assert res.returncode == 0, res.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), twin.run(x))


def test_weight_bits_forced_and_auto():
    m = normalized_mlp()
    for bits, dtype in (("8", np.int8), ("16", np.int16)):
        p = lower_model(m, name="wb", numerics="fixed", calibration=sample_rows(),
                        weight_bits=bits)
        assert set(p.quant.weight_bits.values()) == {int(bits)}
        w = [b for b in p.buffers("const") if b.name.endswith(("_w", "_w_tail"))]
        assert w and all(b.data.dtype == dtype for b in w)     # stored at their width
        assert p.quant.decision_agreement is None               # forced: nothing measured
    p = lower_model(m, name="wb", numerics="fixed", calibration=sample_rows())
    assert set(p.quant.weight_bits.values()) <= {8, 16}
    assert p.quant.decision_agreement >= 99.9


def test_bias_correction_centres_each_layers_rounding_error(tmp_path):
    """int8 weights round each channel's weights one way or the other; at
    an input of nonzero mean (a ReLU layer's, features around 2) the
    rounding adds a bias to every output, which the corrected bias takes
    off: over rows from the calibration's distribution (held out), each
    output's mean error against numpy's float64 forward is a small part of
    its RMS error.  Without the correction the mean error here is 0.88 to
    0.96 of the RMS on three of the four outputs; with it, at most 0.09."""
    rng = np.random.default_rng(7)
    k, h, n = 16, 128, 4
    w1 = (rng.normal(size=(k, h)) / 4).astype(np.float32)
    b1 = rng.normal(size=h).astype(np.float32)
    w2 = (rng.normal(size=(h, n)) / np.sqrt(h)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    m = make_model(nodes, [("x", ["N", k])], [("y", ["N", n])], {"w1": w1, "b1": b1, "w2": w2})
    cal, held = ((rng.normal(size=(rows, k)) + 2).astype(np.float32) for rows in (2000, 5000))
    kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal, name="bc",
             weight_bits="8")
    x = held.astype(np.float64)
    err = load(tmp_path / "o").run(held).astype(np.float64) - np.maximum(x @ w1 + b1, 0) @ w2
    rms = np.sqrt((err ** 2).mean(axis=0))
    assert np.all(np.abs(err.mean(axis=0)) < 0.2 * rms), (err.mean(axis=0), rms)


def test_auto_widens_the_layers_decisions_need(monkeypatch):
    """--weight-bits auto: int8 everywhere when decisions hold; when they do
    not, int16 for the layers with the least int8 SQNR first, until the
    decisions on the calibration rows agree with float on >= 99.9% (the
    agreement measured here independently, with onnxruntime on the same rows
    through the twin's encoding and the integer evaluator)."""
    import importlib

    cw = importlib.import_module("kmlc.passes.choose_widths")
    m = mlp_model([6, 24, 12, 3], seed=3)
    x = np.random.default_rng(4).normal(size=(800, 6)).astype(np.float32)
    p8 = lower_model(m, name="wb", numerics="fixed", calibration=x)
    assert set(p8.quant.weight_bits.values()) == {8}
    # demand more than int8 can give: every layer ends int16, in SQNR order
    seen = []
    real = cw.agreement

    def strict(g, cal, qg, info):
        seen.append(dict(info.weight_bits))
        return min(real(g, cal, qg, info), 99.0 if 8 in info.weight_bits.values() else 100.0)
    monkeypatch.setattr(cw, "agreement", strict)
    p = lower_model(m, name="wb", numerics="fixed", calibration=x)
    assert set(p.quant.weight_bits.values()) == {16}
    order = sorted(p8.quant.sqnr_int8, key=p8.quant.sqnr_int8.get)
    widened = [next(n for n in order if s[n] == 16 and b[n] == 8)
               for b, s in zip(seen, seen[1:])]
    assert widened == order[:len(widened)] and len(seen) == len(order) + 1
    monkeypatch.setattr(cw, "agreement", real)
    # the measure itself, against onnxruntime's float decisions
    from kmlc.verify import reference_outputs
    ref = reference_outputs(m, p8, x)
    g = p8.quant.int_graph
    frac = p8.quant.inputs[g.inputs[0].name]["frac_bits"]
    raw = cw.encode_rows(x, frac)
    o = p8.quant.outputs[g.outputs[0].name]
    got = np.stack([interpret(g, r[None])[0].reshape(-1) for r in raw]).astype(np.float64)
    got = (got - o["zp"]) * o["scale"]
    want = 100.0 * (np.argmax(ref, 1) == np.argmax(got, 1)).mean()
    assert abs(want - p8.quant.decision_agreement) <= 100.0 / len(x) + 1e-9


def test_pinned_widths_reproduce_auto(tmp_path):
    """What auto picked, given back one width per layer (as kmlc compile
    prints it), gives the same C; a list that does not fit the model is
    one line naming its layers, exit 1."""
    m = mlp_model([6, 24, 12, 3], seed=3)
    x = np.random.default_rng(4).normal(size=(800, 6)).astype(np.float32)
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "c.npy", x)
    widths = {"fc0 (Gemm)": 16, "fc1 (Gemm)": 8, "fc2 (Gemm)": 16}
    p = lower_model(m, name="pn", numerics="fixed", calibration=x, weight_bits=[16, 8, 16])
    assert p.quant.weight_bits == widths
    base = ["compile", tmp_path / "m.onnx", "--target", "user", "--numerics", "fixed",
            "--calibration", tmp_path / "c.npy", "--name", "pn"]
    auto = kmlc_cli(*base, "-o", tmp_path / "a")
    line = next(ln for ln in auto.stdout.splitlines() if "fixed point, weights:" in ln)
    pin = ",".join(re.findall(r"\) int(8|16)", line))     # as printed: "fc0 (Gemm) int8, ..."
    assert len(pin.split(",")) == 3, line
    res = kmlc_cli(*base, "-o", tmp_path / "p", "--weight-bits", pin)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p/user/pn_fx.c").read_text() == (tmp_path / "a/user/pn_fx.c").read_text()
    for bad in ("16,8", "8,8,8,8", "8,12,8", "x", "8,,8"):
        r = kmlc_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "bad", "--numerics",
                     "fixed", "--calibration", tmp_path / "c.npy", "--weight-bits", bad)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
        assert "--weight-bits" in r.stderr and not (tmp_path / "bad").exists()
        assert "," not in bad or "fc0 (Gemm), fc1 (Gemm), fc2 (Gemm)" in r.stderr, r.stderr


@pytest.mark.parametrize("data,words", [
    (np.zeros((5, 3), np.float32), ["calibration data", "(5, 3)", "4"]),
    (np.zeros((0, 4), np.float32), ["calibration data", "no rows"]),
    (np.array([[1, 2, np.nan, 4]], np.float32), ["calibration data", "non-finite", "row 0"]),
    (np.array([["a", "b", "c", "d"]]), ["calibration data", "dtype"]),
])
def test_bad_calibration_data(tmp_path, data, words):
    onnx.save(normalized_mlp(), tmp_path / "m.onnx")
    np.save(tmp_path / "c.npy", data)
    out = tmp_path / "o"
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--numerics", "fixed",
                   "--calibration", tmp_path / "c.npy")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    for w in words:
        assert w in line, line
    assert not out.exists()


def test_fixed_needs_calibration_and_rejects_unsupported_ops(tmp_path):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "o", "--numerics", "fixed")
    assert res.returncode == 1 and "--calibration" in res.stderr
    nodes = [helper.make_node("MatMul", ["x", "x2"], ["y"], name="outer")]
    m = make_model(nodes, [("x", [1, 4]), ("x2", [4, 4])], [("y", [1, 4])])
    with pytest.raises(KmlcError, match=r"outer \(MatMul\).*fixed"):
        lower_model(m, numerics="fixed", calibration=np.ones((10, 20), np.float32), name="u")


def every_kind_model():
    """Dense layers with tanh, leaky relu and clip epilogues, a standalone
    sigmoid and relu (their input has two users), and a softmax: every
    fixed-point kernel kind."""
    rng = np.random.default_rng(7)
    w = lambda *s: (rng.normal(size=s) * 0.6).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h0"], name="fc0", transB=1),
             helper.make_node("Tanh", ["h0"], ["a0"], name="tanh0"),
             helper.make_node("Gemm", ["a0", "w1", "b1"], ["h1"], name="fc1", transB=1),
             helper.make_node("LeakyRelu", ["h1"], ["a1"], name="leaky1", alpha=0.1),
             helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"], name="fc2", transB=1),
             helper.make_node("Clip", ["h2", "lo", "hi"], ["a2"], name="clip2"),
             helper.make_node("Gemm", ["a2", "w3", "b3"], ["h3"], name="fc3", transB=1),
             helper.make_node("Sigmoid", ["h3"], ["p"], name="sig"),
             helper.make_node("Relu", ["h3"], ["r"], name="relu"),
             helper.make_node("Softmax", ["h3"], ["s"], name="soft", axis=1)]
    inits = {"w0": w(12, 6), "b0": w(12), "w1": w(10, 12), "b1": w(10), "w2": w(8, 10),
             "b2": w(8), "w3": w(5, 8), "b3": w(5), "lo": np.float32(-0.5),
             "hi": np.float32(1.0)}
    return make_model(nodes, [("x", ["N", 6])], [("p", ["N", 5]), ("r", ["N", 5]),
                                                 ("s", ["N", 5])], inits)


def test_every_fixed_kernel_kind(tmp_path):
    from kmlc.targets import kernel
    from kmlc.verify import reference_outputs

    m = every_kind_model()
    rng = np.random.default_rng(8)
    cal = rng.normal(size=(2000, 6)).astype(np.float32)
    res = kcompile(m, tmp_path / "o", numerics="fixed", calibration=cal, name="every")
    kinds = {k.kind for k in res.program.kernels}
    assert kinds == {"qinput", "qdense", "qact", "qsoftmax"}
    modes = {(k.params.get("mode"), k.params.get("fn")) for k in res.program.kernels}
    assert {("lut", "tanh"), ("lut", "sigmoid"), ("clamp", None)} <= modes
    assert any("rq_neg" in k.operands for k in res.program.kernels)  # fused leaky relu
    twin = load(tmp_path / "o")
    # bit-exact against the integer evaluator, on hostile raw inputs too
    raw = np.concatenate([twin.encode(cal[:200]),
                          rng.integers(-2**31, 2**31, (200, 6)).astype(np.int32)])
    g = res.program.quant.int_graph
    ref = np.stack([np.concatenate([o.reshape(-1) for o in interpret(g, r[None])]) for r in raw])
    assert np.array_equal(twin.run_raw(raw), ref.astype(np.int32))
    # close to the float model on in-distribution rows
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y, f = twin.run(x), reference_outputs(m, res.program, x)
    assert np.abs(y - f).max() < 0.02, np.abs(y - f).max(axis=0)
    assert (y[:, 10:].argmax(1) == f[:, 10:].argmax(1)).mean() >= 0.99
    kernel.build_module(tmp_path / "o" / "kernel")  # W=1, no warnings
    for f in (tmp_path / "o" / "kernel").glob("every*.[ch]"):
        for ln in f.read_text().splitlines():
            assert len(ln.expandtabs(8)) <= 100, ln
