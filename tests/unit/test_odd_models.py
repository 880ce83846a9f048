"""Valid but odd models compile to C that builds warning-free and computes
what onnxruntime computes (the oracle): the simplest shapes, the ones a
generated kernel's special cases meet first."""
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import make_model
from kmlc.api import compile as kcompile, load, lower_model
from kmlc.errors import KmlcError
from kmlc.ops import interpret
from kmlc.verify import reference_outputs


def dense(k, n, *, bias, act, gemm, seed=0):
    """y = act(x[1,k] W[k,n] (+ b)) as one MatMul (and Add) or one Gemm."""
    rng = np.random.default_rng(seed)
    inits = {"W": rng.normal(size=(k, n)).astype(np.float32)}
    if gemm:
        ins = ["x", "W"] + (["b"] if bias else [])
        nodes = [helper.make_node("Gemm", ins, ["h"], name="fc")]
    else:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm")]
        nodes.append(helper.make_node("Add", ["m", "b"], ["h"], name="add") if bias
                     else helper.make_node("Identity", ["m"], ["h"], name="id"))
    if bias:
        inits["b"] = rng.normal(size=n).astype(np.float32)
    nodes.append(helper.make_node(act, ["h"], ["y"], name="act") if act
                 else helper.make_node("Identity", ["h"], ["y"], name="out"))
    return make_model(nodes, [("x", [1, k])], [("y", [1, n])], inits)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
@pytest.mark.parametrize("gemm", [False, True], ids=["matmul", "gemm"])
@pytest.mark.parametrize("act", [None, "Relu"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_dense_layers_of_every_width(tmp_path, numerics, gemm, act, bias):
    """One dense layer, 1..9 outputs from 3 or 1 inputs, with and without a
    bias and an activation: the twin builds with no warning (kmlc refuses a
    warning) and matches onnxruntime on 64 rows."""
    rng = np.random.default_rng(1)
    for n in range(1, 10):
        k = 3 if n % 2 else 1
        path = tmp_path / f"d{n}.onnx"
        onnx.save(dense(k, n, bias=bias, act=act, gemm=gemm, seed=n), path)
        x = rng.uniform(-2, 2, (64, k)).astype(np.float32)
        kcompile(path, tmp_path / f"o{n}", targets="user", numerics=numerics,
                 **({"calibration": x} if numerics == "fixed" else {}))
        y, ref = load(tmp_path / f"o{n}").run(x), reference_outputs(path, lower_model(path), x)
        tol = 1e-5 if numerics == "float" else 2e-2 * max(1.0, np.abs(ref).max())
        assert np.abs(y - ref).max() <= tol, (k, n, np.abs(y - ref).max())


# Names a model may carry: comment and string delimiters, escapes,
# trigraphs, format directives, bidi overrides, newlines, non-ASCII letters
# that spell one macro, case twins, leading digits, a very long name.
HOSTILE = ["in*/x", "a*/b", "/*", "*/", "//c", "\u202eevil", "é", "ü", "a\nb", 'q"u', "b\\s",
           "??=", "%s%n", " ", "9lives", "n" * 300, "\t", "y", "Y", "ELEMS"]


def hostile_model():
    """Every HOSTILE name as an input, an output, a node and a weight; the
    outputs include names whose C macros coincide and one listed twice."""
    h = iter(HOSTILE)
    x, w, b, g, hid = next(h), next(h), next(h), next(h), next(h)
    outs = [next(h) for _ in range(len(HOSTILE) - 5)]
    nodes = [helper.make_node("Gemm", [x, w, b], [hid], name=g)]
    for i, o in enumerate(outs):
        nodes.append(helper.make_node(("Relu", "Sigmoid", "Tanh")[i % 3], [hid], [o], name=o + "*/"))
    rng = np.random.default_rng(0)
    m = make_model(nodes, [(x, [1, 3])], [(o, [1, 4]) for o in outs + outs[:1]],
                   {w: rng.normal(size=(3, 4)).astype(np.float32),
                    b: rng.normal(size=4).astype(np.float32)}, name="g*/\u202e")
    return m


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_hostile_names_reach_c_escaped(tmp_path, numerics):
    """A model whose every name is hostile compiles: the twin builds with no
    warning and matches onnxruntime, the module builds with W=1 and no
    warning, the kernel C is checkpatch --strict clean, every generated C
    and build file is ASCII, and the header gives each port its own offset macro."""
    import kernel_c
    from kmlc.targets import kernel

    path = tmp_path / "h*\u202e.onnx"
    onnx.save(hostile_model(), path)
    x = np.random.default_rng(2).uniform(-2, 2, (64, 3)).astype(np.float32)
    out = tmp_path / "out"
    kcompile(path, out, name="hostile", numerics=numerics,
             **({"calibration": x} if numerics == "fixed" else {}))
    ref = reference_outputs(path, lower_model(path, name="hostile"), x)
    tol = 1e-5 if numerics == "float" else 2e-2
    assert np.abs(load(out).run(x) - ref).max() <= tol
    for f in out.rglob("*"):
        if f.suffix in (".c", ".h") or f.name in ("Kbuild", "Kconfig", "Makefile"):
            assert f.read_bytes().isascii(), f
    header = (out / "kernel" / "hostile.h").read_text()
    defines = re.findall(r"^#define (\w+)", header, re.M)
    assert len(set(defines)) == len(defines)
    offsets = [d for d in defines if re.fullmatch(r"KML_HOSTILE_(IN|OUT)_\w+", d)
               and not d.endswith(("_ZERO_POINT", "_SCALE", "_FRAC_BITS", "_MIN", "_MAX"))]
    assert len(offsets) == 2 + 1 + (len(HOSTILE) - 5) + 1  # ELEMS x2, x, outputs, one twice
    kernel.build_module(out / "kernel")        # raises on any warning
    kernel_c.check_checkpatch_clean(out / "kernel", strict=True)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
@pytest.mark.parametrize("fused", [True, False], ids=["after-dense", "after-relu"])
@pytest.mark.parametrize("bounds", [(1.0, -1.0), (5.0, 9.0), (-9.0, -5.0), (-1e30, 1e30)],
                         ids=["min>max", "above", "below", "huge"])
def test_clip_follows_onnx(tmp_path, numerics, fused, bounds):
    """Clip is min(max(x, min), max) as onnxruntime computes it: max wins
    when min > max, bounds past every value (or past int16) saturate, in
    both numerics, fused into a dense layer or on its own."""
    rng = np.random.default_rng(3)
    inits = {"W": rng.normal(size=(3, 4)).astype(np.float32),
             "lo": np.float32(bounds[0]), "hi": np.float32(bounds[1])}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm")]
    if not fused:
        nodes.append(helper.make_node("Relu", ["h"], ["h2"], name="relu"))
    nodes.append(helper.make_node("Clip", ["h" if fused else "h2", "lo", "hi"], ["y"],
                                  name="clip"))
    path = tmp_path / "clip.onnx"
    onnx.save(make_model(nodes, [("x", [1, 3])], [("y", [1, 4])], inits), path)
    x = rng.uniform(-3, 3, (64, 3)).astype(np.float32)
    opts = {"calibration": x} if numerics == "fixed" else {}
    if numerics == "fixed" and not fused and bounds[1] < 0:
        # a constant below what the ReLU's int16 encoding holds: refused
        with pytest.raises(KmlcError, match=r"node clip \(Clip\): Clip to .* outside"):
            kcompile(path, tmp_path / "o", targets="user", numerics=numerics, **opts)
        assert not (tmp_path / "o").exists()
        return
    kcompile(path, tmp_path / "o", targets="user", numerics=numerics, **opts)
    y, ref = load(tmp_path / "o").run(x), reference_outputs(path, lower_model(path), x)
    tol = 1e-5 if numerics == "float" else 2e-2 * max(1.0, np.abs(ref).max())
    assert np.abs(y - ref).max() <= tol, np.abs(y - ref).max()


def two_layers(w0, b0, w1=None, b1=None):
    """x[1,3] -> Gemm(w0 [3,4], b0) -> Relu -> Gemm(w1 [4,2], b1) -> y."""
    rng = np.random.default_rng(4)
    w1 = rng.normal(size=(4, 2)).astype(np.float32) if w1 is None else w1
    b1 = rng.normal(size=2).astype(np.float32) if b1 is None else b1
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0"),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "w1", "b1"], ["y"], name="fc1")]
    return make_model(nodes, [("x", [1, 3])], [("y", [1, 2])],
                      {"w0": np.asarray(w0, np.float32), "b0": np.asarray(b0, np.float32),
                       "w1": w1, "b1": b1})


def fixed_vs_onnxruntime(tmp_path, model):
    """The fixed twin's largest error against onnxruntime, relative to the
    outputs' range, on 256 rows it was also calibrated on."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(5).uniform(-2, 2, (256, 3)).astype(np.float32)
    kcompile(path, tmp_path / "o", targets="user", numerics="fixed", calibration=x)
    y, ref = load(tmp_path / "o").run(x), reference_outputs(path, lower_model(path), x)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


B0 = [0.3, -0.2, 0.5, 0.1]


@pytest.mark.parametrize("case", ["tiny-weights", "zero-neuron", "huge-bias", "huge-last-bias"])
def test_fixed_point_biases_are_exact(tmp_path, case):
    """Biases quantize in exact integer arithmetic at a scale that holds
    them: first-layer weights of 1e-40 with ordinary biases (the bias once
    overflowed int64), a neuron whose weights are all zero (its bias once
    rounded to 0), a bias of 1e12 beside ordinary weights (the multiplier
    once kept 2 bits).  Each matches onnxruntime within 1% of the range."""
    rng = np.random.default_rng(6)
    w0 = rng.normal(size=(3, 4)).astype(np.float32)
    b0, b1 = np.array(B0, np.float32), None
    if case == "tiny-weights":
        w0 = w0 * np.float32(1e-40)
    elif case == "zero-neuron":
        w0[:, 2] = 0.0
    elif case == "huge-bias":
        b0[1] = 1e12
    else:
        b1 = np.array([0.5, 1e10], np.float32)
    assert fixed_vs_onnxruntime(tmp_path, two_layers(w0, b0, b1=b1)) <= 1e-2


@pytest.mark.parametrize("alpha", [-1.0, -0.25, 0.0, 0.1])
@pytest.mark.parametrize("fused", [True, False], ids=["after-dense", "after-relu6"])
def test_leaky_relu_of_any_slope(tmp_path, alpha, fused):
    """LeakyRelu with a negative slope (valid ONNX: y = alpha * x for
    x < 0, so negative inputs come out positive), a zero slope (ReLU) and
    an ordinary one: fixed point matches onnxruntime within 2% of the
    range, fused into the dense layer or on its own after a Clip, and the
    C equals the integer evaluator bit for bit."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm")]
    if not fused:
        nodes.append(helper.make_node("Clip", ["h", "lo", "hi"], ["h2"], name="clip"))
    nodes.append(helper.make_node("LeakyRelu", ["h" if fused else "h2"], ["y"], name="lrelu",
                                  alpha=alpha))
    path = tmp_path / "l.onnx"
    onnx.save(make_model(nodes, [("x", [1, 3])], [("y", [1, 4])],
                         {"W": rng.normal(size=(3, 4)).astype(np.float32),
                          "lo": np.float32(-4), "hi": np.float32(6)}), path)
    x = rng.uniform(-2, 2, (256, 3)).astype(np.float32)
    ref = reference_outputs(path, lower_model(path), x)
    kcompile(path, tmp_path / "f", targets="user")
    assert np.abs(load(tmp_path / "f").run(x) - ref).max() <= 1e-5
    res = kcompile(path, tmp_path / "q", targets="user", numerics="fixed", calibration=x)
    twin = load(tmp_path / "q")
    err = np.abs(twin.run(x) - ref).max() / np.abs(ref).max()
    assert err <= 2e-2, err
    # the C is the integer evaluator bit for bit, on hostile raw inputs too
    raw = np.concatenate([twin.encode(x[:64]), np.random.default_rng(8).integers(
        -2**31, 2**31, (64, 3)).astype(np.int32)])
    g = res.program.quant.int_graph
    want = np.stack([interpret(g, r[None])[0].reshape(-1) for r in raw]).astype(np.int32)
    assert np.array_equal(twin.run_raw(raw), want)


def test_float_nan_and_infinity_propagate_as_onnxruntime(tmp_path):
    """docs/errors.md: a float model lets NaN and infinity through as IEEE
    and onnxruntime do (dense, ReLU, Clip, Sigmoid, Softmax)."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Clip", ["r", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sig"),
             helper.make_node("Softmax", ["h"], ["p"], name="soft")]
    path = tmp_path / "n.onnx"
    onnx.save(make_model(nodes, [("x", [1, 3])], [("y", [1, 4]), ("p", [1, 4])],
                         {"W": rng.normal(size=(3, 4)).astype(np.float32),
                          "b": rng.normal(size=4).astype(np.float32),
                          "lo": np.float32(-1), "hi": np.float32(2)}), path)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    x[1, 0], x[2, 1], x[3, 2], x[4] = np.nan, np.inf, -np.inf, [np.inf, -np.inf, np.nan]
    kcompile(path, tmp_path / "o", targets="user")
    y, ref = load(tmp_path / "o").run(x), reference_outputs(path, lower_model(path), x)
    assert np.array_equal(np.isnan(y), np.isnan(ref)), (y, ref)
    ok = ~np.isnan(ref)
    assert np.abs(y[ok] - ref[ok]).max() <= 1e-5


@pytest.mark.parametrize("scale", [1e20, 1e30, 1e38])
def test_fixed_point_extreme_weights(tmp_path, scale):
    """First-layer weights of 1e20..1e38 (finite float32): fixed point is
    within 1% of onnxruntime, or, where float32 itself overflows on the
    calibration rows (1e38), one clean refusal naming the node."""
    rng = np.random.default_rng(10)
    w0 = (rng.normal(size=(3, 4)) * scale).astype(np.float32)
    model = two_layers(w0, np.array(B0, np.float32))
    if scale < 1e38:
        assert fixed_vs_onnxruntime(tmp_path, model) <= 1e-2
    else:
        with pytest.raises(KmlcError, match=r"node fc0 \(Gemm\).*infinity or NaN"):
            fixed_vs_onnxruntime(tmp_path, model)
        assert not (tmp_path / "o").exists()


def test_normalization_by_a_zero_std(tmp_path):
    """(x - mean) / std with one std of 0: the float model gives what
    onnxruntime gives (infinities and NaNs included); fixed point refuses
    with one line naming the node."""
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Sub", ["x", "mean"], ["d"], name="sub"),
             helper.make_node("Div", ["d", "std"], ["n"], name="div"),
             helper.make_node("Gemm", ["n", "w", "b"], ["y"], name="fc")]
    path = tmp_path / "z.onnx"
    onnx.save(make_model(nodes, [("x", [1, 3])], [("y", [1, 2])],
                         {"mean": np.zeros(3, np.float32), "std": np.array([1, 0, 2], np.float32),
                          "w": rng.normal(size=(3, 2)).astype(np.float32),
                          "b": np.ones(2, np.float32)}), path)
    x = rng.uniform(-2, 2, (32, 3)).astype(np.float32)
    kcompile(path, tmp_path / "f", targets="user")
    y, ref = load(tmp_path / "f").run(x), reference_outputs(path, lower_model(path), x)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(np.isinf(y[ok]), np.isinf(ref[ok]))
    with pytest.raises(KmlcError, match=r"node div \(Div\) \+ fc \(Gemm\): .*divisor of 0"):
        kcompile(path, tmp_path / "q", targets="user", numerics="fixed", calibration=x)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_affine_after_a_dense_layer_and_identities(tmp_path, numerics):
    """Found by tests/fuzz: an output scaled or shifted by constants after a
    dense layer (through an Identity), y = (x W) * c, then Relu, a second
    layer and y - d, was refused in fixed point; it folds into the dense
    layers now (passes/fold_affine.py), and both builds match onnxruntime,
    fixed point within its stated bound."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["m0"], name="mm0"),
             helper.make_node("Identity", ["m0"], ["h0"], name="id0"),
             helper.make_node("Mul", ["h0", "c0"], ["e0"], name="ew0"),
             helper.make_node("Relu", ["e0"], ["a0"], name="act0"),
             helper.make_node("Gemm", ["a0", "W1", "b1"], ["h1"], name="fc1"),
             helper.make_node("Div", ["h1", "c1"], ["e1"], name="ew1"),
             helper.make_node("Sub", ["e1", "d1"], ["y"], name="ew2")]
    inits = {"W0": rng.normal(size=(5, 8)).astype(np.float32),
             "c0": rng.normal(size=8).astype(np.float32),
             "W1": rng.normal(size=(8, 3)).astype(np.float32),
             "b1": rng.normal(size=3).astype(np.float32),
             "c1": np.float32(4.0), "d1": np.array([1.0, -2.0, 0.5], np.float32)}
    m = make_model(nodes, [("x", [1, 5])], [("y", [1, 3])], inits)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    kw = {"calibration": x} if numerics == "fixed" else {}
    res = kcompile(m, tmp_path / "o", targets="user", numerics=numerics, **kw)
    assert "reshape" not in str(res.program)               # the Identity is gone
    if numerics == "fixed":
        assert [op.kind for op in res.program.quant.int_graph.ops] == \
            ["qinput", "qdense", "qdense"]      # both affines folded, the Relu fused after
    y, ref = load(tmp_path / "o").run(x), reference_outputs(m, res.program, x)
    bound = res.manifest["fixed"]["outputs"][0]["error_bound"] if numerics == "fixed" else 0
    assert np.abs(y - ref).max() <= bound + 1e-4, (np.abs(y - ref).max(), bound)


@pytest.mark.parametrize("alpha,fits", [(0.5, True), (-1.0, True), (1.5, False)])
def test_leaky_relu_after_an_affine_op_and_on_its_own(tmp_path, alpha, fits):
    """Found by tests/fuzz (names, seed 1 case 160): dense -> Sub -> LeakyRelu
    of slope 1.5 kept the LeakyRelu on its own, in its input's encoding,
    which the 1.5x negative values left: 0.129 off where the stated bound
    was 0.0035.  It joins the dense layer now; a LeakyRelu after a tanh
    stays alone and is right when its outputs fit its input's encoding
    (slopes 0.5 and -1 on [-1, 1]), and refused when they cannot (1.5)."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["m0"], name="mm0"),
             helper.make_node("Sub", ["m0", "c0"], ["e0"], name="ew0"),
             helper.make_node("LeakyRelu", ["e0"], ["a0"], name="act0", alpha=1.5),
             helper.make_node("Gemm", ["a0", "W1"], ["h1"], name="fc1"),
             helper.make_node("Tanh", ["h1"], ["t1"], name="tanh1"),
             helper.make_node("LeakyRelu", ["t1"], ["y"], name="act1", alpha=alpha)]
    inits = {"W0": rng.normal(size=(4, 6)).astype(np.float32), "c0": np.float32(0.5),
             "W1": rng.normal(size=(6, 3)).astype(np.float32) * 0.3}
    m = make_model(nodes, [("x", [1, 4])], [("y", [1, 3])], inits)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    if not fits:
        with pytest.raises(KmlcError, match="act1.*slope 1.5.*int16 encoding"):
            kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=x)
        return
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=x)
    assert [op.kind for op in res.program.quant.int_graph.ops] == \
        ["qinput", "qdense", "qdense", "qact"]
    y, ref = load(tmp_path / "o").run(x), reference_outputs(m, res.program, x)
    bound = res.manifest["fixed"]["outputs"][0]["error_bound"]
    assert np.abs(y - ref).max() <= bound + 1e-5, (np.abs(y - ref).max(), bound)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_a_model_named_like_the_runtime(tmp_path, numerics):
    """Found while testing verify on KML's weights: a model named kml_<x>
    (not a runtime file's name, so allowed) had its own kml_<x>_twin.c
    taken for a hook's twin C and linked twice."""
    m = dense(3, 2, bias=True, act="Relu", gemm=True)
    x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    kw = {"calibration": x} if numerics == "fixed" else {}
    res = kcompile(m, tmp_path / "o", targets="user", name="kml_readahead", numerics=numerics,
                   **kw)
    assert res.manifest["module"] == "kml_kml_readahead"
    y, ref = load(tmp_path / "o").run(x), reference_outputs(m, res.program, x)
    assert np.abs(y - ref).max() <= (1e-5 if numerics == "float" else 0.05)


@pytest.mark.parametrize("alpha", [0.1, -0.5])
def test_wide_path_with_a_leaky_relu(tmp_path, alpha):
    """The first layer's exact wide path (a feature calibrated far from zero
    on a narrow range) under a fused LeakyRelu of either sign: the twin
    equals kmlc's integer evaluator on hostile int32 rows, which take it."""
    from kmlc.ops import interpret

    r = np.random.default_rng(3)
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0", transB=1),
             helper.make_node("LeakyRelu", ["h"], ["a"], name="lr", alpha=alpha),
             helper.make_node("Gemm", ["a", "w1", "b1"], ["y"], name="fc1", transB=1)]
    m = make_model(nodes, [("x", [1, 2])], [("y", [1, 2])],
                   {"w0": r.normal(size=(6, 2)).astype(np.float32),
                    "b0": np.float32(-1000 * r.normal(size=6)),
                    "w1": r.normal(size=(2, 6)).astype(np.float32),
                    "b1": np.zeros(2, np.float32)})
    cal = np.stack([1000 + r.random(500), r.uniform(-5, 5, 500)], axis=1).astype(np.float32)
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal)
    first = next(k for k in res.program.kernels if k.kind == "qdense")
    assert "wide_bound" in first.params and "rq_neg" in first.operands
    twin = load(tmp_path / "o")
    raw = r.integers(-2**31, 2**31, (300, 2), dtype=np.int64) >> r.integers(0, 31, (300, 2))
    raw = np.concatenate([raw, [[-2**31, -2**31], [2**31 - 1, 2**31 - 1], [0, 0]]])
    raw = raw.astype(np.int32)
    g = res.program.quant.int_graph
    ref = np.stack([interpret(g, row[None])[0].reshape(-1) for row in raw])
    assert np.array_equal(twin.run_raw(raw), ref.astype(np.int32))
