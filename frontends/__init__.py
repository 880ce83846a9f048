"""Frontends: each turns a model from some framework into kmlc graph IR.

  onnx   an ONNX file or ``onnx.ModelProto``: the reference route
  torch  a ``torch.nn.Module`` and example inputs, exported in memory with
         ``torch.onnx.export`` and imported by the ONNX route
  sklearn  a fitted scikit-learn estimator or pipeline and a sample of its
         inputs, converted in memory by skl2onnx and imported by the ONNX
         route
  tvm    a TVM Relax ``IRModule`` (e.g. from ``tvm.relax.frontend.onnx.
         from_onnx`` or ``from_exported_program``): its ``main`` function's
         Relax operators become the IR ops the ONNX route produces

``load`` picks the frontend from the model's type.  Every frontend returns
the same ``kmlc.ir.Graph``; passes, planner and codegen are shared.  torch
and tvm are imported only when a model of theirs is given: an ``nn.Module``
or ``IRModule`` cannot exist unless its package is already imported.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import KmlcError
from ..ir import Graph, c_identifier, print_graph


@dataclass
class Imported:
    graph: Graph
    source: str   # how generated files name the model
    sha256: str   # of the model as kmlc read it


def load(model, example_inputs=None, *, params=None, name: str | None = None) -> Imported:
    """Import ``model``: an ONNX path or ModelProto, a torch.nn.Module (with
    ``example_inputs``), a TVM Relax IRModule (with optional ``params``), or
    an already imported ``kmlc.ir.Graph``."""
    torch, tvm = sys.modules.get("torch"), sys.modules.get("tvm")
    if torch is not None and isinstance(model, torch.nn.Module):
        from . import torch as torch_frontend

        return torch_frontend.load(model, example_inputs, name=name)
    if takes_example_inputs(model):
        from . import sklearn as sklearn_frontend

        return sklearn_frontend.load(model, example_inputs, name=name)
    if example_inputs is not None:
        raise KmlcError(f"example inputs are for a torch.nn.Module or a scikit-learn "
                        f"estimator; this model is a {type(model).__name__}")
    if tvm is not None and isinstance(model, tvm.ir.IRModule):
        from . import tvm as tvm_frontend

        return tvm_frontend.load(model, params, name=name)
    if params is not None:
        raise KmlcError(f"params are for a TVM IRModule; this model is a {type(model).__name__}")
    if isinstance(model, Graph):
        if name:
            model.name = name
        return Imported(model, f"kmlc graph {model.name}", graph_sha256(model))
    from . import onnx as onnx_frontend

    if sys.modules.get("onnx") and isinstance(model, sys.modules["onnx"].ModelProto):
        raw, source = model.SerializeToString(), "<in-memory model>"
    elif isinstance(model, (str, Path)):
        p = Path(model)
        raw, source = (p.read_bytes() if p.is_file() else b""), p.name
    else:
        raise KmlcError(f"cannot compile a {type(model).__module__}.{type(model).__name__}: "
                        "kmlc takes an ONNX file or onnx.ModelProto, a torch.nn.Module or a "
                        "scikit-learn estimator with example inputs, or a TVM Relax IRModule")
    return Imported(onnx_frontend.load(model, name=name), source,
                    hashlib.sha256(raw).hexdigest())


def takes_example_inputs(model) -> bool:
    """Whether ``model``'s frontend needs example inputs: a torch.nn.Module
    or a scikit-learn estimator."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return True
    return any(c.__module__.split(".")[0] == "sklearn" for c in type(model).__mro__)


def graph_sha256(g: Graph) -> str:
    """A digest of an imported graph: its printed form and every constant's bytes."""
    h = hashlib.sha256(print_graph(g).encode())
    for c in g.constants():
        h.update(c.data.tobytes())
    return h.hexdigest()


def default_name(text: str) -> str:
    """A model name from a class or function name: ``HeimdallNet`` -> ``heimdall_net``."""
    import re

    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", c_identifier(text, "model"))
    return snake.lower()[:40]


def require(package: str, what: str, extra: str):
    """Import ``package`` or say what to install."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise KmlcError(f"{what} needs the '{package}' package, which cannot be imported "
                        f"({e}); install it with: pip install 'kmlc[{extra}]'") from None
