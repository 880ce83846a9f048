"""ONNX-ML's linear and preprocessing ops (frontends/onnx_ml.py) against
onnxruntime as the oracle: Scaler, Binarizer, LinearRegressor and
LinearClassifier (several classes with a label table, one row with two
labels, every post_transform kmlc compiles), in float and fixed point, a
Scaler -> LinearClassifier pipeline, integer features, and the one-line
refusals.  Float: labels identical; elementwise ops bit-identical; matrix
products within float32 rounding of onnxruntime's (its GEMM's summation
order is not ours).  Fixed point: labels on >= 99.9% of rows."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper

from conftest import check_refused
from kmlc.api import compile as kcompile, load
from kmlc.errors import KmlcError

F, C, ROWS = 5, 4, 3000
ML = "ai.onnx.ml"


def ml_model(nodes, outs, elem=T.FLOAT, features=F):
    g = helper.make_graph(nodes, "ml", [helper.make_tensor_value_info("x", elem,
                                                                      [None, features])], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 3)])
    m.ir_version = 8
    return m


def out(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def classifier(rows, labels, post, seed=0):
    r = np.random.default_rng(seed)
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML,
                            coefficients=r.normal(size=rows * F).tolist(),
                            intercepts=r.normal(size=rows).tolist(), post_transform=post,
                            **({"classlabels_ints": labels} if labels else {}))
    width = 2 if rows == 1 and len(labels) == 2 else rows
    return ml_model([node], [out("label", T.INT64, [None]), out("scores", T.FLOAT,
                                                                  [None, width])])


def cases():
    r = np.random.default_rng(1)
    yield "scaler", ml_model([helper.make_node(
        "Scaler", ["x"], ["y"], domain=ML, offset=r.normal(size=F).tolist(),
        scale=r.normal(size=F).tolist())], [out("y", T.FLOAT, [None, F])])
    yield "scaler_one", ml_model([helper.make_node(
        "Scaler", ["x"], ["y"], domain=ML, offset=[0.25], scale=[3.0])],
        [out("y", T.FLOAT, [None, F])])
    yield "binarizer", ml_model([helper.make_node("Binarizer", ["x"], ["y"], domain=ML,
                                                  threshold=0.3)],
                                [out("y", T.FLOAT, [None, F])])
    yield "normalizer", ml_model([helper.make_node("Normalizer", ["x"], ["y"], domain=ML,
                                                   norm="L1")], [out("y", T.FLOAT, [None, F])])
    yield "regressor", ml_model([helper.make_node(
        "LinearRegressor", ["x"], ["y"], domain=ML, coefficients=r.normal(size=2 * F).tolist(),
        intercepts=[0.5, -1.0], targets=2)], [out("y", T.FLOAT, [None, 2])])
    for post in ("NONE", "LOGISTIC", "SOFTMAX"):
        yield f"classes_{post}", classifier(C, [3, 7, 1, 9], post)
        yield f"binary_{post}", classifier(1, [5, 2], post)
    yield "classes_indices", classifier(C, list(range(C)), "SOFTMAX")
    yield "binary_unlabeled", classifier(1, [], "NONE")


CASES = dict(cases())


def rows(n=ROWS, seed=3):
    x = np.random.default_rng(seed).normal(size=(n, F)).astype(np.float32)
    x[0] = 0.0                  # a row whose norm is 0 (Normalizer leaves it as it is)
    return x


def oracle(m, x):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})


def twin_outputs(m, x, tmp_path, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user", **kw)
    got = load(tmp_path / "o").run_named(x)
    return [got[o.name] for o in m.graph.output]


@pytest.mark.parametrize("name", sorted(CASES))
def test_float_follows_onnxruntime(name, tmp_path):
    m, x = CASES[name], rows()
    for want, got in zip(oracle(m, x), twin_outputs(m, x, tmp_path)):
        got = got.reshape(want.shape)
        assert got.dtype == want.dtype
        if want.dtype != np.float32:
            assert np.array_equal(got, want)
        elif name.startswith(("scaler", "binarizer", "normalizer")):   # the same bits
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        else:
            assert np.allclose(got, want, rtol=1e-5, atol=2e-6), np.max(np.abs(got - want))


@pytest.mark.parametrize("name", ["classes_NONE", "classes_SOFTMAX", "binary_LOGISTIC",
                                  "regressor"])
def test_fixed_point_decides_as_onnxruntime(name, tmp_path):
    m, x = CASES[name], rows()
    want = oracle(m, x)
    got = twin_outputs(m, x, tmp_path, numerics="fixed", calibration=x)
    if name == "regressor":
        span = float(np.ptp(want[0]))
        assert np.max(np.abs(got[0].reshape(want[0].shape) - want[0])) < 0.002 * span
        return
    assert np.mean(got[0].reshape(-1) == want[0]) >= 0.999
    err = np.max(np.abs(got[1].reshape(want[1].shape) - want[1]))
    # probabilities to 0.01; raw scores to 0.5% of their span
    assert err < (0.005 * float(np.ptp(want[1])) if name.endswith("NONE") else 0.01), err


def test_scaler_then_classifier_folds_into_one_layer(tmp_path):
    """StandardScaler -> LogisticRegression as skl2onnx writes it: the
    Scaler folds into the classifier's layer, so fixed point compiles it
    (a Scaler alone is refused there)."""
    r = np.random.default_rng(7)
    nodes = [helper.make_node("Scaler", ["x"], ["xs"], domain=ML,
                              offset=r.normal(size=F).tolist(),
                              scale=(1 / r.uniform(1, 3, size=F)).tolist()),
             helper.make_node("LinearClassifier", ["xs"], ["label", "probs"], domain=ML,
                              coefficients=r.normal(size=3 * F).tolist(),
                              intercepts=r.normal(size=3).tolist(), classlabels_ints=[0, 1, 2],
                              post_transform="SOFTMAX")]
    m = ml_model(nodes, [out("label", T.INT64, [None]), out("probs", T.FLOAT, [None, 3])])
    x = (rows() * 2 + 1).astype(np.float32)
    want = oracle(m, x)
    for numerics in ("float", "fixed"):
        got = twin_outputs(m, x, tmp_path / numerics, numerics=numerics,
                           calibration=x if numerics == "fixed" else None)
        agree = np.mean(got[0].reshape(-1) == want[0])
        assert agree == 1.0 if numerics == "float" else agree >= 0.999
    report = (tmp_path / "fixed" / "o" / "report.txt").read_text()
    assert report.count(" qdense(") == 1


def test_integer_features_are_cast_as_onnxruntime_casts_them(tmp_path):
    m = classifier(C, [3, 7, 1, 9], "SOFTMAX")
    m.graph.input[0].type.tensor_type.elem_type = T.INT64
    x = np.random.default_rng(5).integers(-50, 50, size=(500, F)).astype(np.int64)
    want = oracle(m, x)
    got = twin_outputs(m, x, tmp_path)
    assert np.array_equal(got[0].reshape(-1), want[0])
    assert np.allclose(got[1].reshape(want[1].shape), want[1], rtol=1e-5, atol=2e-6)


def refused():
    yield "Normalizer", ml_model([helper.make_node("Normalizer", ["x"], ["y"], domain=ML,
                                                   norm="L2")], [out("y", T.FLOAT, [None, F])]), \
        "norm L2: kmlc compiles L1"
    cls = classifier(C, [3, 7, 1, 9], "NONE")
    zm = helper.make_node("ZipMap", ["scores"], ["z"], domain=ML, classlabels_int64s=[3, 7, 1, 9])
    cls.graph.node.append(zm)
    z = helper.make_value_info("z", helper.make_sequence_type_proto(helper.make_map_type_proto(
        T.INT64, helper.make_tensor_type_proto(T.FLOAT, []))))
    cls.graph.output.append(z)
    yield "ZipMap", cls, "zipmap"
    yield "PROBIT", classifier(C, [0, 1, 2, 3], "PROBIT"), "post_transform PROBIT"
    yield "SOFTMAX_ZERO", classifier(C, [0, 1, 2, 3], "SOFTMAX_ZERO"), "SOFTMAX_ZERO"
    strings = classifier(C, [0, 1, 2, 3], "NONE")
    node = strings.graph.node[0]
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute("coefficients", [0.5] * (C * F)),
                           helper.make_attribute("classlabels_strings", ["a", "b", "c", "d"])])
    strings.graph.output[0].type.tensor_type.elem_type = T.STRING
    del strings.graph.output[1:]
    yield "strings", strings, "string class labels"
    yield "classes_mismatch", classifier(C, [0, 1, 2], "NONE"), "3 class labels for 4 rows"


@pytest.mark.parametrize("name,m,why", list(refused()), ids=[c[0] for c in refused()])
def test_refusals_are_one_line_naming_the_node(name, m, why, tmp_path):
    check_refused(m, why, "node '", tmp_path)


@pytest.mark.kernel
def test_modules_build_and_meet_the_kernel_c_standards(tmp_path):
    """A label table (int64 labels selected into the float output array)
    in float and the folded pipeline in fixed point: their C is free of
    libm, allocation and mutable globals, bounded in stack, checkpatch
    clean, and the modules build with W=1."""
    import kernel_c
    from kmlc.targets import kernel

    x = rows()
    for tag, m, numerics in (("mlcls", classifier(C, [3, 7, 1, 9], "SOFTMAX"), "float"),
                             ("mlbin", classifier(1, [5, 2], "LOGISTIC"), "fixed")):
        onnx.save(m, tmp_path / f"{tag}.onnx")
        d = tmp_path / tag
        kcompile(tmp_path / f"{tag}.onnx", d, name=tag, numerics=numerics,
                 calibration=x if numerics == "fixed" else None, targets="all")
        kernel_c.check_no_libm_allocation_or_mutable_globals(d, tag)
        kernel_c.check_stack_and_no_recursion(d, tag, tmp_path)
        kernel_c.check_checkpatch_clean(d / "kernel")
        kernel_c.check_checkpatch_clean(d / "kunit")
        kernel.build_module(d / "kernel")


@pytest.mark.parametrize("name", ["scaler", "binarizer", "normalizer"])
def test_hostile_values_as_onnxruntime(name, tmp_path):
    """NaN, infinities, signed zeros, the largest floats and denormals in
    every position: the elementwise ops give onnxruntime's values (NaN
    where it has NaN), a row with an infinity or a NaN in its norm too.
    onnxruntime's Binarizer refuses a NaN input; kmlc's gives 0 (NaN > t
    is false, docs/frontends.md)."""
    vals = [np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.0]
    vals = np.array(vals + ([] if name == "binarizer" else [np.nan]), np.float32)
    r = np.random.default_rng(9)
    x = r.choice(vals, size=(400, F)).astype(np.float32)
    x[:20] = 0.0
    x[20:40] = -0.0
    m = CASES[name]
    want = oracle(m, x)[0]
    got = twin_outputs(m, x, tmp_path)[0].reshape(want.shape)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
    if name == "binarizer":
        nan = np.full((1, F), np.nan, np.float32)
        assert not load(tmp_path / "o").run_named(nan)["y"].any()


def test_a_scaler_of_the_wrong_width_is_refused(tmp_path):
    m = ml_model([helper.make_node("Scaler", ["x"], ["y"], domain=ML, offset=[1.0, 2.0, 3.0],
                                   scale=[1.0])], [out("y", T.FLOAT, [None, F])])
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(KmlcError, match=r"\(Scaler\): offset has 3 values for 5 features"):
        kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user")
    assert not (tmp_path / "o").exists()
