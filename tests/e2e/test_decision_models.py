"""Models whose decisions are in the ONNX: integer features in, bools and
class indices out, in both numerics.

HEIMDALL_DECIDE is the Heimdall admission model (examples/models) as a
kernel would feed it: int64 features (microseconds, queue lengths, as the
hook counts them) cast to float, and its decline rule inside the graph,
GreaterOrEqual(probability, 0.5), a bool output.  LINNOS_INT is a
LinnOS-shaped model (31 digit features, 31-256-2) on an int64 input with
an ArgMax: an int64 output.  MIXED exercises the rest of the decision ops
(Where, Max, Min, Abs, Neg, Not, Or, Cast to bool and back) around a dense
layer.  onnxruntime is the oracle; the twin must also equal kmlc's own
evaluators, build clean under the sanitizers and both compilers, and the
module and KUnit suites must build and pass.
"""
import re
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import kernel_c
from conftest import EXAMPLES, seed_models
from kmlc.api import compile as kcompile, load
from kmlc.ops import interpret
from kmlc.targets import kernel, kunit

GOLDEN = 32


def heimdall_decide():
    m = onnx.load(EXAMPLES / "heimdall.onnx")
    g = m.graph
    first = g.node[0]
    feat = g.input[0].name
    first.input[0] = "features_f"
    g.node.insert(0, helper.make_node("Cast", [feat], ["features_f"], name="to_float", to=T.FLOAT))
    g.input[0].type.tensor_type.elem_type = T.INT64
    out = g.output[0].name
    g.node.append(helper.make_node("GreaterOrEqual", [out, "cut"], ["decline"], name="decide"))
    g.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "cut"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("decline", T.BOOL, [1, 1]))
    return m


def heimdall_rows(n, seed):
    return np.round(seed_models.sample_inputs("heimdall", n, seed=seed)).astype(np.int64)


def linnos_int():
    r = np.random.default_rng(4)
    w0 = (r.standard_normal((31, 256)) / np.sqrt(31)).astype(np.float32)
    w1 = (r.standard_normal((256, 2)) / 16).astype(np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
             helper.make_node("MatMul", ["xf", "w0"], ["h"]),
             helper.make_node("Add", ["h", "b0"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["a"]),
             helper.make_node("MatMul", ["a", "w1"], ["z"]),
             helper.make_node("ArgMax", ["z"], ["y"], axis=1, keepdims=0)]
    g = helper.make_graph(nodes, "linnos", [helper.make_tensor_value_info("x", T.INT64, [1, 31])],
                          [helper.make_tensor_value_info("y", T.INT64, [1])],
                          [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1"),
                           numpy_helper.from_array((r.standard_normal(256) * 0.5)
                                                   .astype(np.float32), "b0")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def linnos_rows(n, seed):
    return np.random.default_rng(seed).integers(0, 10, (n, 31)).astype(np.int64)


def mixed():
    """int32 features -> dense -> Where/Max/Min/Abs/Neg -> a bool; the
    features compared with integer and with float thresholds too."""
    r = np.random.default_rng(5)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
             helper.make_node("MatMul", ["xf", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Max", ["a", "lo"], ["m"]),
             helper.make_node("Min", ["m", "hi"], ["c"]),
             helper.make_node("Greater", ["c", "t1"], ["g"]),
             helper.make_node("Not", ["g"], ["ng"]),
             helper.make_node("Less", ["x", "t2"], ["small"]),
             helper.make_node("Or", ["ng", "small"], ["o0"]),
             helper.make_node("LessOrEqual", ["xf", "t3"], ["tiny"]),
             helper.make_node("Or", ["o0", "tiny"], ["o"]),
             helper.make_node("Where", ["o", "c", "z"], ["sel"]),
             helper.make_node("Neg", ["sel"], ["ns"]),
             helper.make_node("Abs", ["ns"], ["ab"]),
             helper.make_node("Cast", ["ab"], ["b"], to=T.BOOL),
             helper.make_node("Cast", ["b"], ["bi"], to=T.INT64),
             helper.make_node("Equal", ["bi", "one"], ["y"])]
    inits = {"w": (r.standard_normal((6, 6)) / 40).astype(np.float32),
             "lo": np.float32(0.25), "hi": np.float32(6.0), "t1": np.float32(2.0),
             "t2": np.array([[50, 500, 5, 50, 500, 5]], np.int32), "z": np.float32(0.0),
             "t3": np.array([[20.5, 3.0, 7.25, 0.5, 390.0, 1e9]], np.float32),
             "one": np.int64(1)}
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", T.INT32, [1, 6])],
                          [helper.make_tensor_value_info("y", T.BOOL, [1, 6])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mixed_rows(n, seed):
    return np.random.default_rng(seed).integers(0, 400, (n, 6)).astype(np.int32)


MODELS = {"heimdall_decide": (heimdall_decide, heimdall_rows),
          "linnos_int": (linnos_int, linnos_rows), "mixed": (mixed, mixed_rows)}
BUILDS = [(m, n) for m in MODELS for n in ("float", "fixed")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("decide")
    out = {}
    for name, numerics in BUILDS:
        make, rows = MODELS[name]
        tag = f"{name[:8]}_{numerics[:2]}"
        kw = {"calibration": rows(2000, 21)} if numerics == "fixed" else {}
        res = kcompile(make(), root / tag, name=tag, numerics=numerics,
                       golden_data=rows(GOLDEN, 23), golden_count=GOLDEN, **kw)
        out[name, numerics] = (root / tag, tag, res.program)
    return out


def onnxruntime_rows(m, x):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.stack([s.run(None, {name: row[None]})[0].reshape(-1) for row in x])


@pytest.mark.parametrize("name,numerics", BUILDS)
def test_decisions_match_onnxruntime(built, name, numerics):
    """The acceptance numbers: float 100% of held-out rows, fixed >= 99.9%;
    outputs in their ONNX type through Twin.run and run_named."""
    d, _, prog = built[name, numerics]
    make, rows = MODELS[name]
    x = rows(5000, 22)
    want = onnxruntime_rows(make(), x)
    twin = load(d)
    got = twin.run(x)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    named = twin.run_named(x[:3])
    (port,) = make().graph.output
    assert next(iter(named.values())).dtype == want.dtype
    agree = (got.reshape(len(x), -1) == want.reshape(len(x), -1)).all(axis=1).mean()
    if numerics == "float":
        assert agree == 1.0, agree
    else:
        assert agree >= 0.999, agree


@pytest.mark.parametrize("name,numerics", BUILDS)
def test_twin_equals_evaluator(built, name, numerics):
    """Bit for bit, on held-out rows and on each input type's extremes."""
    d, _, prog = built[name, numerics]
    twin = load(d)
    x = np.concatenate([MODELS[name][1](200, 24), hostile(twin.in_dtype, twin.in_elems, 200)])
    y = twin.run_raw(x)
    g = prog.graph if numerics == "float" else prog.quant.int_graph
    ref = np.stack([np.concatenate([np.asarray(o).reshape(-1) for o in interpret(g, row[None])])
                    for row in x])
    assert y.tobytes() == ref.astype(y.dtype).tobytes()


def hostile(dtype, n_in, n, seed=0):
    r = np.random.default_rng(seed)
    i = np.iinfo(dtype)
    x = r.integers(i.min, i.max, (n, n_in), dtype=dtype, endpoint=True)
    x = x >> r.integers(0, i.bits, (n, n_in)).astype(dtype)
    x[: n // 5] = r.choice(np.array([i.min, i.max, 0, -1, 1], dtype=dtype), (n // 5, n_in))
    return x


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("name,numerics", BUILDS)
def test_sanitizers_on_hostile_integers(built, name, numerics, cc, tmp_path):
    d, tag, prog = built[name, numerics]
    core = f"{tag}_{'fp' if numerics == 'float' else 'fx'}"
    (tmp_path / "drv.c").write_text(kernel_c.infer_driver(tag, prog.in_dtype.ctype,
                                                          prog.out_dtype.ctype))
    exe = tmp_path / "drv"
    fp = ["-msse2", "-ffp-contract=off"] if numerics == "float" else []
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-fno-omit-frame-pointer", *fp, f"-I{d / 'user'}", "-o", exe, tmp_path / "drv.c",
                    d / "user" / f"{tag}.c", d / "user" / f"{core}.c"], check=True)
    twin = load(d)
    x = hostile(twin.in_dtype, twin.in_elems, 20000, seed=2)
    x.tofile(tmp_path / "in.bin")
    res = subprocess.run([exe, tmp_path / "in.bin", tmp_path / "out.bin"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "runtime error" not in res.stderr, res.stderr[-2000:]
    y = np.fromfile(tmp_path / "out.bin", dtype=twin.out_dtype).reshape(len(x), -1)
    assert y.tobytes() == twin.run_raw(x).tobytes()


def test_fixed_point_keeps_integer_features_exact(built):
    """The fixed models take int64 features as they are: no float
    conversion anywhere in their C, and the first op saturates an int64 to
    int32 before its exact encoding (int32 features take no clamp)."""
    for name in ("heimdall_decide", "linnos_int"):
        d, tag, prog = built[name, "fixed"]
        assert prog.in_dtype.name == "i64"
        core = re.sub(r"/\*.*?\*/", "", (d / "kernel" / f"{tag}_fx.c").read_text(), flags=re.S)
        assert not re.search(r"\b(float|double)\b", core)
        assert "kml_sat_s32_n(x[i], &sat)" in core
    d, tag, prog = built["mixed", "fixed"]
    assert prog.in_dtype.name == "i32" and prog.out_dtype.name == "bool"


def test_kernel_c_standards(built, tmp_path):
    for d, tag, _ in built.values():
        kernel_c.check_no_libm_allocation_or_mutable_globals(d, tag)
        kernel_c.check_stack_and_no_recursion(d, tag, tmp_path)


@pytest.mark.kernel
def test_modules_build_and_checkpatch_clean(built):
    """Every build's C is checkpatch-clean; the modules built (W=1, any
    warning fails) cover each kind of entry point once: s64 in and bool out
    through an FPU section, s64 in and out in integers, s32 in and bool out
    with the integer decision ops (KUnit builds all six besides)."""
    for key, (d, _, _) in built.items():
        if key in (("heimdall_decide", "float"), ("linnos_int", "fixed"), ("mixed", "fixed")):
            kernel.build_module(d / "kernel")
        kernel_c.check_checkpatch_clean(d / "kernel")
        kernel_c.check_checkpatch_clean(d / "kunit")


@pytest.mark.kunit
def test_kunit_uml(built):
    res = kunit.run([d for d, _, _ in built.values()], arch="um")
    assert res["ok"], res["summary"]
    for d, tag, _ in built.values():
        assert res["suites"][f"kml_{tag}"]["passed"] == kunit.cases(d) >= GOLDEN + 1, \
            res["summary"]


@pytest.fixture(scope="module")
def admission(tmp_path_factory):
    d = tmp_path_factory.mktemp("admit") / "out"
    kcompile(heimdall_decide(), d, name="hd_admit", numerics="fixed",
             calibration=heimdall_rows(2000, 21), hooks=["admission"],
             golden_data=heimdall_rows(GOLDEN, 23), golden_count=GOLDEN)
    return d


def test_admission_hook_takes_integer_features(admission):
    """The admission hook feeds the int64 model its integer features as
    they are (fraction bits 0) and declines exactly when the model's own
    bool output says so: the hook's decision code (kml_binding.h, through
    the twin) against the model's entry point, row for row."""
    twin = load(admission)
    assert not twin.hook_frac.any()
    x = heimdall_rows(3000, 9)
    y = twin.run(x).reshape(-1)
    assert y.dtype == np.bool_ and 0.2 < y.mean() < 0.8
    assert np.array_equal(twin.decide(x), y.astype(np.int32))
    binding = (admission / "kernel" / "kml_binding.h").read_text()
    assert "s64 in[KML_HD_ADMIT_IN_ELEMS]" in binding and "u8 out[" in binding


def test_hooks_refuse_bool_features(tmp_path):
    from kmlc.errors import KmlcError

    g = helper.make_graph([helper.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
                           helper.make_node("MatMul", ["xf", "w"], ["y"])], "b",
                          [helper.make_tensor_value_info("x", T.BOOL, [1, 5])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])],
                          [numpy_helper.from_array(np.ones((5, 4), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(KmlcError, match="integer features; this model takes bool"):
        kcompile(m, tmp_path / "o", numerics="float", hooks=["readahead"])


@pytest.mark.kernel
def test_admission_module_builds_clean(admission):
    kernel.build_module(admission / "kernel")
    kernel_c.check_checkpatch_clean(admission / "kernel")
