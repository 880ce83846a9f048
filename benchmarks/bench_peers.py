"""The peers: TVM, onnxruntime and PyTorch, single-threaded, batch 1.

Each peer is prepared once (``prepare``: compile, load, warm up) and then
timed in short bursts (``samples``) that the harness interleaves with every
other system.  A peer that cannot run a model raises ``Unavailable`` with
the reason, which the table prints in its row.

  onnxruntime      InferenceSession, intra- and inter-op threads 1,
                   sequential execution, all graph optimizations; timed from
                   Python with perf_counter_ns around each session.run(), the
                   way users call it
  pytorch          the same MLP as an nn.Module, torch.set_num_threads(1),
                   inference_mode, perf_counter_ns per call
  torch.compile    torch.compile(module) (inductor, CPU), same timing
  tvm              tvm.relax.frontend.onnx.from_onnx on the same ONNX file,
                   tvm.compile(target="llvm"), Relax VM; timed by TVM's own
                   time_evaluator with number=1, so each of its repeats is
                   one call (TVM's C++ timer, no Python in the loop; it passes
                   the same input every call)

For the Python-timed peers the cost of the timer itself (two
perf_counter_ns calls, measured in the same process) is subtracted.
"""
from __future__ import annotations

import os
import time

import numpy as np

# Single-threaded everywhere; must be set before the libraries load.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(var, "1")

PEERS = ("tvm", "onnxruntime", "pytorch", "torch.compile")


class Unavailable(Exception):
    """This peer cannot run this model (or at all here); str() says why."""


def python_timer_ns(n: int = 20000) -> float:
    pc = time.perf_counter_ns
    d = np.empty(n)
    for i in range(n):
        t0 = pc()
        d[i] = pc() - t0
    return float(np.median(d))


class PyPeer:
    """A callable timed from Python, one call per sample."""

    timer = "python"

    def __init__(self, fn, make, rows):
        self.fn, self.make = fn, make
        self.inputs = [make(r) for r in rows]

    def samples(self, n: int) -> np.ndarray:
        fn, xs, k = self.fn, self.inputs, len(self.inputs)
        pc = time.perf_counter_ns
        out = np.empty(n)
        for i in range(n):
            x = xs[i % k]
            t0 = pc()
            fn(x)
            out[i] = pc() - t0
        return out

    def run(self, row):
        y = self.fn(self.make(row))
        return np.asarray(y.numpy() if hasattr(y, "numpy") else y).reshape(-1)


def prepare_onnxruntime(onnx_path, rows):
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise Unavailable(f"onnxruntime not importable ({e})")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    peer = PyPeer(lambda x: sess.run(None, {name: x})[0],
                  lambda r: np.ascontiguousarray(r[None, :], dtype=np.float32), rows)
    peer.version = ort.__version__
    return peer


def _torch():
    try:
        import torch
    except Exception as e:  # a broken CUDA wheel raises more than ImportError
        raise Unavailable(f"torch not importable ({type(e).__name__}: {e})")
    torch.set_num_threads(1)
    return torch


def _tensor_maker(torch):
    return lambda r: torch.from_numpy(np.ascontiguousarray(r[None, :], dtype=np.float32))


def prepare_pytorch(spec, rows):
    torch = _torch()
    module = spec.torch_module()

    def call(x, m=module):
        with torch.inference_mode():
            return m(x)
    peer = PyPeer(call, _tensor_maker(torch), rows)
    peer.version = torch.__version__
    return peer


def prepare_torch_compile(spec, rows):
    torch = _torch()
    module = spec.torch_module()
    make = _tensor_maker(torch)
    # Every model's forward() is the same code object, and dynamo counts
    # recompilations per code object: without this, the later models would
    # silently run eagerly once the default limit (8) is reached.
    cfg = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, limit):
            setattr(cfg, limit, max(getattr(cfg, limit), 256))
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(module)
        with torch.inference_mode():
            for r in rows[:3]:
                compiled(make(r))
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise Unavailable(f"torch.compile failed: {type(e).__name__}: {msg}")

    def call(x, m=compiled):
        with torch.inference_mode():
            return m(x)
    peer = PyPeer(call, make, rows)
    peer.version = torch.__version__
    peer.compile_s = time.perf_counter() - t0
    return peer


class TvmPeer:
    timer = "tvm"

    def __init__(self, vm, dev, x, tvm):
        self.vm, self.dev, self.x, self.tvm = vm, dev, x, tvm

    def samples(self, n: int) -> np.ndarray:
        te = self.vm.time_evaluator("main", self.dev, number=1, repeat=n)
        return np.asarray(te(self.x).results, dtype=np.float64) * 1e9

    def run(self, x):
        arr = self._tensor(np.ascontiguousarray(x[None, :], dtype=np.float32))
        out = self.vm["main"](arr)
        return out.numpy().reshape(-1)

    def _tensor(self, a):
        rt = self.tvm.runtime
        return rt.tensor(a, self.dev) if hasattr(rt, "tensor") else self.tvm.nd.array(a, self.dev)


def prepare_tvm(onnx_model, rows):
    try:
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx
    except Exception as e:
        raise Unavailable(f"TVM not importable ({type(e).__name__}: {e}); "
                          "pip install -e '.[bench]'")
    t0 = time.perf_counter()
    try:
        mod = from_onnx(onnx_model, keep_params_in_input=False)
        ex = tvm.compile(mod, target="llvm")
    except Exception as e:
        msg = str(e).strip().splitlines()[-1][:160] if str(e).strip() else ""
        raise Unavailable(f"TVM could not compile it: {type(e).__name__}: {msg}")
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    peer = TvmPeer(vm, dev, None, tvm)
    peer.x = peer._tensor(np.ascontiguousarray(rows[0][None, :], dtype=np.float32))
    peer.version = tvm.__version__
    peer.compile_s = time.perf_counter() - t0
    return peer


def prepare(peer: str, spec, onnx_path, rows):
    if peer == "onnxruntime":
        return prepare_onnxruntime(onnx_path, rows)
    if peer == "pytorch":
        return prepare_pytorch(spec, rows)
    if peer == "torch.compile":
        return prepare_torch_compile(spec, rows)
    if peer == "tvm":
        import onnx

        return prepare_tvm(onnx.load(str(onnx_path)), rows)
    raise KeyError(peer)
