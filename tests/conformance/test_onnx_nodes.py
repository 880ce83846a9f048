"""ONNX's own backend node tests for every op kmlc compiles.

onnx ships them as generators (onnx.backend.test.case.node); each case has
a model, input/output data and a tolerance.  Inputs after the first are
bound as initializers (kmlc models take one runtime tensor per input, and
the cases pass weights and bounds as inputs).  The twin must match ONNX's
expected outputs within the case's tolerance, and must match kmlc's own
reference evaluator bit for bit.
"""
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from kmlc.api import compile as kcompile, load
from kmlc.frontends import onnx_ml
from kmlc.frontends.onnx import SUPPORTED, load as load_graph
from kmlc.ops import interpret


def float_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = []
    for c in cases:
        g = c.model.graph
        if not all((n.op_type in SUPPORTED and n.domain in ("", "ai.onnx")) or (
                n.op_type in onnx_ml.SUPPORTED and n.domain == onnx_ml.DOMAIN) for n in g.node):
            continue
        typed = list(g.input) + list(g.output)
        if not all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in TYPES
                   for v in typed):
            continue
        if any(n.op_type in FLOAT_MATH for n in g.node) and any(
                v.type.tensor_type.elem_type != TensorProto.FLOAT for v in typed):
            continue  # integer arithmetic: refused (tests/unit/test_errors.py)
        if len(g.output) != 1 or 0 in c.data_sets[0][0][0].shape:
            continue  # kmlc rejects zero-sized tensors (tests/unit/test_errors.py)
        out.append(c)
    return out


# The element types kmlc's runtime tensors take: float32, int32, int64, bool.
TYPES = (TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL)
# Ops kmlc computes in float32 only.
FLOAT_MATH = {"Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Relu", "LeakyRelu", "Sigmoid",
              "Tanh", "Softmax", "Clip"}
CASES = float_cases()


def test_enough_cases_collected():
    ops = {n.op_type for c in CASES for n in c.model.graph.node}
    assert len(CASES) >= 140, len(CASES)
    # onnx has no Cast case between kmlc's types: tests/conformance/test_decision_ops.py
    assert ops - {"Binarizer"} == set(SUPPORTED) - {"Cast"}, set(SUPPORTED) - ops
    # onnx's ONNX-ML cases for the ops kmlc compiles: Binarizer's (the rest:
    # tests/conformance/test_onnx_ml.py)
    assert "Binarizer" in ops


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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case, tmp_path):
    for i, (inputs, outputs) in enumerate(case.data_sets):
        model = bind(case.model, inputs)
        res = kcompile(model, tmp_path / f"out{i}", targets="user", name="case")
        twin = load(tmp_path / f"out{i}")
        x = np.asarray(inputs[0])
        (y,) = twin.run_named(x.reshape(1, -1)).values()
        y = y[0]
        expected = np.asarray(outputs[0])
        assert y.dtype == expected.dtype and y.shape == expected.shape, (y.dtype, y.shape)
        if expected.dtype == np.float32:
            np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.atol)
        else:  # integers and bools: exactly ONNX's
            assert np.array_equal(y, expected)
        ref = interpret(load_graph(model, name="case"), x)[0]
        assert ref.dtype == y.dtype
        assert y.tobytes() == ref.tobytes(), "twin != reference evaluator"
        assert res.manifest["out_elems"] == expected.size
