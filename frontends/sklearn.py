"""scikit-learn frontend: a fitted estimator or pipeline and a sample of
its inputs, converted in memory by skl2onnx (scikit-learn's recommended
converter) and imported by the ONNX route.  LightGBM's and XGBoost's
scikit-learn estimators (LGBMClassifier, XGBRegressor, ...) go through
onnxmltools, the converter both projects point to, whose default-domain
nodes are then brought to this onnx's opset by onnx.version_converter.

What it guarantees: the ONNX model is the one skl2onnx writes for the
estimator, with ``zipmap`` off for classifiers (their probabilities come
out as a tensor, not a sequence of maps), the default-domain opset this
onnx knows (capped at skl2onnx's newest) and ai.onnx.ml 3; an estimator
skl2onnx cannot convert (unfitted, or no converter) is refused in one line
naming it.  The sample fixes the input's width and element type (float32,
or int64 for integer features); its values are not used."""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import KmlcError
from . import Imported, default_name, require


def load(model, example_inputs, *, name: str | None = None) -> Imported:
    from . import onnx as onnx_frontend

    m, source = convert(model, example_inputs)
    raw = m.SerializeToString()
    graph = onnx_frontend.load(m, name=name or default_name(type(model).__name__))
    return Imported(graph, source, hashlib.sha256(raw).hexdigest())


def convert(model, example_inputs):
    """The ONNX model the converter writes for ``model``, and how generated
    files name it."""
    what = type(model).__name__
    if example_inputs is None:
        raise KmlcError(f"a scikit-learn {what} needs a sample of its inputs: "
                        "compile(estimator, X_sample, outdir)")
    x = np.asarray(example_inputs)
    if x.ndim != 2 or not len(x):
        raise KmlcError(f"the input sample for {what} has shape {x.shape}; expected rows of "
                        "features (2-D, at least one row)")
    x = x[:1].astype(np.int64 if x.dtype.kind in "iub" else np.float32)
    root = type(model).__module__.split(".")[0]
    if root in ("lightgbm", "xgboost"):
        return _boosted(model, x, root, what), f"<{root} {what}>"
    skl2onnx = require("skl2onnx", "a scikit-learn estimator", "sklearn")
    from sklearn.base import is_classifier

    last = model.steps[-1][1] if hasattr(model, "steps") else model
    options = {id(last): {"zipmap": False}} if is_classifier(last) else None
    import onnx

    opset = min(onnx.defs.onnx_opset_version(), skl2onnx.get_latest_tested_opset_version())
    try:
        m = skl2onnx.to_onnx(model, x, options=options,
                             target_opset={"": opset, "ai.onnx.ml": 3})
    except Exception as e:        # skl2onnx raises many types; each is one line here
        why = " ".join(str(e).split())[:300] or type(e).__name__
        raise KmlcError(f"skl2onnx cannot convert this {what}: {why}") from None
    return m, f"<scikit-learn {what}>"


def _boosted(model, x: np.ndarray, root: str, what: str):
    """A LightGBM or XGBoost scikit-learn estimator through onnxmltools."""
    require("onnxmltools", f"a {root} estimator", "trees")
    import onnx
    import onnx.version_converter
    from onnxmltools import convert_lightgbm, convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType, Int64TensorType

    kind = Int64TensorType if x.dtype == np.int64 else FloatTensorType
    convert = convert_lightgbm if root == "lightgbm" else convert_xgboost
    extra = {"zipmap": False} if root == "lightgbm" else {}
    try:
        m = convert(model, initial_types=[("x", kind([None, x.shape[1]]))], **extra)
        default = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]
        if default and default[0] < 13:      # kmlc reads opsets 13 and later
            m = onnx.version_converter.convert_version(m, min(onnx.defs.onnx_opset_version(),
                                                              21))
        return m
    except Exception as e:        # the converters raise many types; each is one line here
        why = " ".join(str(e).split())[:300] or type(e).__name__
        raise KmlcError(f"onnxmltools cannot convert this {what}: {why}") from None
