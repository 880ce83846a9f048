"""Models exported by torch.onnx.export, with the dynamo exporter and the
legacy TorchScript one, for 1-D input (MatMul + Add) and 2-D input (Gemm),
with a symbolic batch dimension, and with weights in external data."""
import warnings

import numpy as np
import onnx
import pytest

from conftest import seed_models
from kmlc.api import compile as kcompile, load
from kmlc.verify import compare, reference_outputs

import torch  # noqa: E402  (the test command installs PyTorch)


def export(tmp_path, name, x, **kw):
    model = seed_models.build("readahead", train=False)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), **kw)
    return path


CASES = {
    "dynamo_2d": (torch.zeros(1, 5), dict(dynamo=True, external_data=False), "Gemm"),
    "dynamo_1d": (torch.zeros(5), dict(dynamo=True, external_data=False), "MatMul"),
    "legacy_2d": (torch.zeros(1, 5), dict(dynamo=False), "Gemm"),
    "legacy_1d": (torch.zeros(5), dict(dynamo=False), "MatMul"),
    "dynamo_batch": (torch.zeros(2, 5), dict(
        dynamo=True, external_data=False,
        dynamic_shapes={"x": {0: torch.export.Dim("batch")}}), "Gemm"),
    "legacy_batch": (torch.zeros(2, 5), dict(
        dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}}), "Gemm"),
    "dynamo_external": (torch.zeros(1, 5), dict(dynamo=True, external_data=True), "Gemm"),
}


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_model_compiles_and_matches(tmp_path, case):
    x0, kw, op = CASES[case]
    path = export(tmp_path, case, x0, **kw)
    m = onnx.load(path, load_external_data=False)
    assert op in [n.op_type for n in m.graph.node]
    if case == "dynamo_external":
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer)
    res = kcompile(path, tmp_path / "out", targets="user", name="ra")
    twin = load(tmp_path / "out")
    x = seed_models.sample_inputs("readahead", 300, seed=4)
    y = twin.run(x)
    with torch.no_grad():
        ty = seed_models.build("readahead", train=False)(torch.from_numpy(x)).numpy()
    assert np.abs(y - ty).max() <= 1e-5  # PyTorch itself as a second oracle
    rep = compare(res.program, y, reference_outputs(path, res.program, x), 1e-5, 0.0, case)
    assert rep.ok, rep.text()
