"""PyTorch frontend: a ``torch.nn.Module`` and example inputs to kmlc graph IR.

The module is exported with ``torch.onnx.export`` (the dynamo exporter,
torch's default) entirely in memory: the ``ONNXProgram``'s ModelProto, with
its weights inline, goes to the ONNX importer, so the PyTorch route yields
exactly the graph the same export written to a file would.  The exporter's
artifacts directory is a temporary directory that is always removed, and
its console output (progress lines, warnings, log records) is swallowed.

Example inputs are a tensor or a tuple of tensors (numpy arrays are
accepted), float32.  kmlc compiles one sample per call: the leading
dimension of every input of rank 2 or more is the batch, and the export
uses the first sample only (leading dimension 1); a rank-1 input is one
sample.  The module is exported in eval mode and its mode is restored.

Failures are one ``KmlcError`` naming the module: a forward that fails on
the example inputs (PyTorch's own message, e.g. a shape mismatch), an
export failure (the exporter's innermost cause, e.g. data-dependent control
flow), or an op the ONNX importer cannot compile (the ONNX node's name).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import sys
import tempfile
import warnings

import numpy as np

from ..errors import KmlcError
from . import Imported, default_name


def load(module, example_inputs, *, name: str | None = None) -> Imported:
    import torch

    from .onnx import Importer

    where = f"{type(module).__name__} (torch.nn.Module)"
    args = example_args(example_inputs, where)
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            try:
                with _quiet():
                    module(*args)
            except Exception as e:
                shapes = ", ".join(str(list(a.shape)) for a in args)
                raise KmlcError(f"the module fails on example inputs of shape {shapes}: "
                                f"{_cause(e)}", where=where) from None
            model = export(module, args, where)
    finally:
        for m, training in modes:
            m.training = training
    graph = Importer(model, where).run(name or default_name(type(module).__name__))
    return Imported(graph, where, hashlib.sha256(model.SerializeToString()).hexdigest())


def example_args(example_inputs, where: str) -> tuple:
    """The example inputs as a tuple of float32 tensors holding one sample."""
    import torch

    if example_inputs is None:
        raise KmlcError("a torch.nn.Module needs example inputs (a tensor or a tuple of "
                        "tensors with the model's input shapes)", where=where)
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not items:
        raise KmlcError("example inputs are empty; give a tensor per model input", where=where)
    args = []
    for i, x in enumerate(items):
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not isinstance(x, torch.Tensor):
            raise KmlcError(f"example input {i} is a {type(x).__name__}, not a tensor",
                            where=where)
        if x.dtype != torch.float32:
            raise KmlcError(f"example input {i} has dtype {str(x.dtype).replace('torch.', '')}; "
                            "kmlc models take float32 inputs", where=where)
        if x.ndim == 0 or 0 in x.shape:
            raise KmlcError(f"example input {i} has shape {list(x.shape)}; give at least one "
                            "value per input", where=where)
        args.append((x[:1] if x.ndim >= 2 else x).detach().clone())
    return tuple(args)


def export(module, args: tuple, where: str):
    """``module`` exported to an ONNX ModelProto in memory."""
    import torch

    with tempfile.TemporaryDirectory(prefix="kmlc-torch-") as scratch, _quiet():
        try:
            program = torch.onnx.export(module, args, dynamo=True, verbose=False,
                                        artifacts_dir=scratch)
            return program.model_proto
        except Exception as e:
            hint = "; install the exporter's dependencies with: pip install 'kmlc[torch]'" \
                if isinstance(_innermost(e), ImportError) else ""
            raise KmlcError(f"torch.onnx.export failed: {_cause(e)}{hint}", where=where) from None


def _innermost(e: BaseException) -> BaseException:
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen[-1]


def _cause(e: BaseException) -> str:
    """The innermost exception of a chain, on one line."""
    inner = _innermost(e)
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(inner)).splitlines()
             if ln.strip()]
    return f"{type(inner).__name__}: {lines[0] if lines else '(no message)'}"


@contextlib.contextmanager
def _quiet():
    """Swallow everything written to stdout/stderr (Python and C level) and
    every warning: the exporter reports progress, graphs and log records."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def module_from_file(path, attr: str):
    """``attr`` of the Python file ``path``, for ``kmlc compile FILE.py:NAME``:
    an nn.Module class (instantiated without arguments) or a function that
    returns a module.  The file is imported under a private name with its
    directory on sys.path, and both are removed again afterwards."""
    import importlib.util
    from pathlib import Path

    import torch

    path = Path(path)
    where = f"{path}:{attr}"
    if not path.is_file():
        raise KmlcError("no such file", where=str(path))
    if not attr.isidentifier():
        raise KmlcError(f"'{attr}' is not a Python name; write FILE.py:ClassOrFunction",
                        where=where)
    modname = f"_kmlc_model_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(modname, path)
    pymod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = pymod
    sys.path.insert(0, str(path.resolve().parent))
    try:
        try:
            with _quiet():
                spec.loader.exec_module(pymod)
        except BaseException as e:  # SyntaxError, ImportError, SystemExit, ...
            if isinstance(e, KeyboardInterrupt):
                raise
            raise KmlcError(f"cannot import the file: {_cause(e)}", where=str(path)) from None
        if not hasattr(pymod, attr):
            found = sorted(k for k, v in vars(pymod).items() if not k.startswith("_") and (
                (isinstance(v, type) and issubclass(v, torch.nn.Module)
                 and v.__module__ == modname)
                or (callable(v) and getattr(v, "__module__", None) == modname
                    and not isinstance(v, type))))
            raise KmlcError(f"the file defines no '{attr}'"
                            + (f" (it defines: {', '.join(found)})" if found else ""),
                            where=str(path))
        obj = getattr(pymod, attr)
        is_class = isinstance(obj, type)
        if (is_class and not issubclass(obj, torch.nn.Module)) or not callable(obj):
            raise KmlcError(f"'{attr}' is a {type(obj).__name__ if not is_class else 'class'} "
                            "that is not a torch.nn.Module; name an nn.Module class or a "
                            "function returning a module", where=where)
        try:
            with _quiet():
                module = obj()
        except Exception as e:
            raise KmlcError(f"cannot {'instantiate' if is_class else 'call'} '{attr}' without "
                            f"arguments: {_cause(e)}", where=where) from None
    finally:
        sys.modules.pop(modname, None)
        sys.path.remove(str(path.resolve().parent))
    if not isinstance(module, torch.nn.Module):
        raise KmlcError(f"'{attr}()' returned a {type(module).__name__}, not a torch.nn.Module",
                        where=where)
    return module.eval()
