"""ONNX's own backend node tests for every op kmlc compiles.

onnx ships them as generators (onnx.backend.test.case.node); each case has
a model, input/output data and a tolerance.  Inputs after the first are
bound as initializers (kmlc models take one runtime tensor per input, and
the cases pass weights and bounds as inputs).  The twin must match ONNX's
expected outputs within the case's tolerance, and must match kmlc's own
reference evaluator bit for bit.

A case applies when all its nodes are ops kmlc compiles (or evaluates at
compile time, as Constant and Shape), its inputs and outputs are float32,
int32, int64 or bool, and no tensor is empty; the expanded forms of
functions (``_expanded``, ``_expanded_ver18``) are cases like the others.
The applicable cases kmlc fails are KNOWN_FAILURES, each with its reason,
listed in docs/frontends.md; they are at most 5% of the applicable cases.
"""
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from kmlc.api import compile as kcompile, load
from kmlc.frontends import onnx_ml
from kmlc.frontends.onnx import STATIC, SUPPORTED, load as load_graph
from kmlc.ops import interpret


def float_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = []
    for c in cases:
        g = c.model.graph
        if not all((n.op_type in SUPPORTED + STATIC and n.domain in ("", "ai.onnx")) or (
                n.op_type in onnx_ml.SUPPORTED and n.domain == onnx_ml.DOMAIN) for n in g.node):
            continue
        typed = list(g.input) + list(g.output)
        if not all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in TYPES
                   for v in typed):
            continue
        if any(n.op_type in FLOAT_MATH for n in g.node) and any(
                v.type.tensor_type.elem_type != TensorProto.FLOAT for v in typed):
            continue  # integer arithmetic: refused (tests/unit/test_errors.py)
        if not g.input or any(0 in np.shape(a) for ins, outs in c.data_sets for a in ins + outs):
            continue  # kmlc rejects zero-sized tensors (tests/unit/test_errors.py)
        out.append(c)
    return out


# The element types kmlc's runtime tensors take: float32, int32, int64, bool.
TYPES = (TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL)
# Ops kmlc computes in float32 only.
FLOAT_MATH = {"Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Relu", "LeakyRelu", "Sigmoid",
              "Tanh", "Softmax", "Clip", "Exp", "Log", "Sqrt", "Pow", "Reciprocal", "Erf", "Gelu",
              "Sum", "Mean", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "LayerNormalization",
              "BatchNormalization", "HardSigmoid", "LogSoftmax"}
CASES = float_cases()
# Applicable cases kmlc fails, and why (docs/frontends.md lists them).
KNOWN_FAILURES = {
    "test_constantofshape_float_ones": "the output's shape is the runtime input's value; kmlc "
                                       "compiles static shapes",
    "test_constantofshape_int_zeros": "the output's shape is the runtime input's value; kmlc "
                                      "compiles static shapes",
    "test_batchnorm_example_training_mode": "training mode (running statistics updated); kmlc "
                                            "compiles inference",
    "test_batchnorm_epsilon_training_mode": "training mode (running statistics updated); kmlc "
                                            "compiles inference",
    "test_rotary_embedding_no_position_ids_expanded": "int64 arithmetic (Sub) on runtime values; "
                                                      "kmlc's Add, Sub, Mul and Div are float32",
    "test_rotary_embedding_no_position_ids_interleaved_expanded": "int64 arithmetic (Sub) on "
                                                                  "runtime values; kmlc's Add, "
                                                                  "Sub, Mul and Div are float32",
}


def test_enough_cases_collected():
    ops = {n.op_type for c in CASES for n in c.model.graph.node}
    assert len(CASES) >= 370, len(CASES)
    # onnx's cases of these reductions are float64 (tests/conformance/test_tensor_ops.py)
    ml = {"Binarizer", "TreeEnsemble"}
    assert ops - ml - (set(STATIC) - set(SUPPORTED)) == set(SUPPORTED) - {
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}, \
        set(SUPPORTED) - ops
    # onnx's ONNX-ML cases for the ops kmlc compiles: Binarizer's and
    # TreeEnsemble's float one, set membership (the rest:
    # tests/conformance/test_onnx_ml.py, test_trees.py, test_tree_ensemble_v5.py)
    assert ml <= ops
    assert "test_ai_onnx_ml_tree_ensemble_set_membership" in {c.name for c in CASES}


def bind(model, inputs):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    default = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
    if default < 13:   # Not, And, Or cases are opset 7 models
        from onnx import version_converter
        m = version_converter.convert_version(m, 13)
        m.ir_version = max(m.ir_version, 7)   # initializers need not be graph inputs
    keep = m.graph.input[0]
    for vi, data in zip(list(m.graph.input)[1:], inputs[1:]):
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(data), vi.name))
    del m.graph.input[:]
    m.graph.input.append(keep)
    return m


def marked(c):
    why = KNOWN_FAILURES.get(c.name)
    return pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=why, strict=True)]
                        if why else [])


@pytest.mark.parametrize("case", [marked(c) for c in CASES])
def test_node_case(case, tmp_path):
    for i, (inputs, outputs) in enumerate(case.data_sets):
        model = bind(case.model, inputs)
        res = kcompile(model, tmp_path / f"out{i}", targets="user", name="case")
        twin = load(tmp_path / f"out{i}")
        x = np.asarray(inputs[0])
        got = [y[0] for y in twin.run_named(x.reshape(1, -1)).values()]
        refs = interpret(load_graph(model, name="case"), x)
        assert len(got) == len(outputs)
        for y, expected, ref in zip(got, outputs, refs):
            expected = np.asarray(expected)
            assert y.dtype == expected.dtype and y.shape == expected.shape, (y.dtype, y.shape)
            if expected.dtype == np.float32:
                np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.atol)
            else:  # integers and bools: exactly ONNX's
                assert np.array_equal(y, expected)
            assert ref.dtype == y.dtype
            assert y.tobytes() == ref.tobytes(), "twin != reference evaluator"
        assert res.manifest["out_elems"] == sum(np.asarray(o).size for o in outputs)


def test_known_failures_are_few_and_documented():
    """At most 5% of the applicable cases fail, each listed with its
    reason in docs/frontends.md (and xfail above, strictly: a case that
    starts passing must leave the list)."""
    names = {c.name for c in CASES}
    assert set(KNOWN_FAILURES) <= names, set(KNOWN_FAILURES) - names
    assert len(KNOWN_FAILURES) <= 0.05 * len(CASES), (len(KNOWN_FAILURES), len(CASES))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "frontends.md").read_text()
    for name, why in KNOWN_FAILURES.items():
        assert f"| `{name}` | {why} |" in doc, name


EXPANDED_OF = ("softmax", "logsoftmax", "relu", "leakyrelu", "sigmoid", "hardsigmoid", "clip",
               "layer")


def test_expanded_forms_apply():
    """Every float32 case of the expanded forms (functions written as other
    ops: ``_expanded``, ``_expanded_ver18``) of Softmax, LogSoftmax, Relu,
    LeakyRelu, HardSigmoid, Clip and LayerNormalization that onnx ships is
    an applicable case here (so test_node_case runs it); Sigmoid has none."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shipped = [c for c in collect_testcases(None) if "_expanded" in c.name
                   and c.name.split("_")[1] in EXPANDED_OF]
    floats = [c for c in shipped if all(v.type.tensor_type.elem_type == TensorProto.FLOAT
                                        for v in list(c.model.graph.input))]
    names = {c.name for c in CASES}
    assert len(floats) >= 40 and {f for c in floats for f in [c.name.split("_")[1]]} == \
        set(EXPANDED_OF) - {"sigmoid"}
    assert [c.name for c in floats if c.name not in names] == []
