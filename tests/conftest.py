"""Shared test helpers: small ONNX graphs built by hand, the seed models,
and paths to the tools the kernel tests need."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
SEED_MODELS = ("readahead", "nfs_rsize", "heimdall")
sys.path.insert(0, str(EXAMPLES))

import seed_models  # noqa: E402


def kmlc_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """Run the installed ``kmlc`` command line."""
    exe = Path(sys.executable).parent / "kmlc"
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=cwd)


def check_refused(m, why: str, where: str, tmp_path) -> None:
    """``m`` is refused by the API (a KmlcError matching ``why``) and by the
    command line in one line naming ``where`` (a node), exit 1, no
    traceback, no output directory."""
    from kmlc.api import compile as kcompile
    from kmlc.errors import KmlcError

    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(KmlcError, match=why):
        kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user")
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "o2")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and where in res.stderr, res.stderr
    assert not (tmp_path / "o2").exists()


def float_bound_holds(program, y, ref64, rows):
    """kmlc verify's float bound (compiler/float_bound.py) holds on every
    finite element of the float32 outputs: the twin's outputs ``y`` on
    ``rows`` within it of onnxruntime's float64 ``ref64``.  Yields each
    output's (port, value64, finite-bound mask) for further checks."""
    from kmlc.float_bound import float_bound

    for p, (v64, bound) in zip(program.outputs, float_bound(program.graph, rows)):
        if p.type.dtype.name != "f32":
            continue
        sl = slice(p.buffer.offset, p.buffer.offset + p.buffer.numel)
        err = np.abs(y[:, sl] - ref64[:, sl])
        fin = np.isfinite(bound) & np.isfinite(err)
        assert (err[fin] <= bound[fin]).all(), (p.name, (err - bound)[fin].max())
        yield p, v64, fin


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8, name="m"):
    """A ModelProto from onnx.helper pieces; ``inputs``/``outputs`` are
    (name, shape) pairs (float32) or ready ValueInfoProtos; ``inits`` maps
    names to numpy arrays."""
    def vi(x):
        if isinstance(x, onnx.ValueInfoProto):
            return x
        return helper.make_tensor_value_info(x[0], TensorProto.FLOAT, x[1])
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()]
    g = helper.make_graph(nodes, name, [vi(i) for i in inputs], [vi(o) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def fixed_math():
    """Functions and products of activations in fixed point: Exp, Log,
    Sqrt, Erf, Reciprocal (tables), products (one of a value with itself),
    quotients by an activation and of a constant by one, LayerNormalization
    (a product, a square root and a quotient), Gelu as PyTorch exports it
    (Erf and products), ReduceL2, LogSoftmax, ReduceLogSumExp, Pow by 2.5
    and by 3, and Max and Concat of activations on two scales (each
    requantized to one encoding spanning both)."""
    n = helper.make_node
    rng = np.random.default_rng(5)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    nodes = [n("Gemm", ["x", "w0", "b0"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
             n("Gemm", ["x", "w1", "b1"], ["h2"], transB=1), n("Add", ["r", "one"], ["r1"]),
             n("Exp", ["h2"], ["e"]), n("Log", ["r1"], ["l"]), n("Sqrt", ["r"], ["s"]),
             n("Erf", ["h2"], ["er"]), n("Reciprocal", ["r1"], ["rc"]),
             n("Mul", ["r", "h2"], ["p"]), n("Mul", ["h2", "h2"], ["sq"]),
             n("Div", ["h2", "r1"], ["dv"]), n("Div", ["three", "r1"], ["cd"]),
             n("LayerNormalization", ["h2", "sc", "bi"], ["ln"], axis=-1),
             n("Div", ["h2", "sqrt2"], ["gd"]), n("Erf", ["gd"], ["ge"]),
             n("Add", ["ge", "one"], ["g1"]), n("Mul", ["h2", "g1"], ["gm"]),
             n("Mul", ["gm", "half"], ["gelu"]),
             n("ReduceL2", ["h2"], ["l2"], axes=[1]), n("LogSoftmax", ["h2"], ["ls"], axis=1),
             n("ReduceLogSumExp", ["h2"], ["lse"], axes=[1]), n("Pow", ["r1", "p25"], ["pw"]),
             n("Pow", ["h2", "p3"], ["cube"]), n("Max", ["r", "h2"], ["mx"]),
             n("Concat", ["r", "h2"], ["cc"], axis=1)]
    inits = {"w0": f(6, 4), "b0": f(6), "w1": f(6, 4), "b1": f(6), "one": np.float32(1),
             "three": np.float32(3), "sc": f(6), "bi": f(6),
             "sqrt2": np.float32(np.sqrt(2)), "half": np.float32(0.5),
             "p25": np.float32(2.5), "p3": np.float32(3)}
    outs = [(o, [1, 6]) for o in ("e", "l", "s", "er", "rc", "p", "sq", "dv", "cd", "ln", "gelu",
                                  "ls", "pw", "cube", "mx")]
    outs += [("l2", [1, 1]), ("lse", [1, 1]), ("cc", [1, 12])]
    return make_model(nodes, [("x", [1, 4])], outs, inits, opset=17)


def mlp_model(sizes, act="Relu", seed=0, batch="N", transB=1):
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "x"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.normal(size=(b, a) if transB else (a, b)).astype(np.float32) * 0.5
        inits[f"w{i}"], inits[f"b{i}"] = w, rng.normal(size=b).astype(np.float32)
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"h{i}"], name=f"fc{i}",
                                      transB=transB))
        x = f"h{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node(act, [x], [f"a{i}"], name=f"act{i}"))
            x = f"a{i}"
    return make_model(nodes, [("x", [batch, sizes[0]])], [(x, [batch, sizes[-1]])], inits)


def readahead_policy():
    """A transparent test policy on KML's features: readseq while the mean
    |page difference| of a window is under 1024 pages, readrandom above."""
    w = np.zeros((4, 5), np.float32)
    w[0, 3], w[2, 3] = 1 / 1024, -1 / 1024
    b = np.float32([-1, -100, 1, -100])
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="policy", transB=1)], "ra",
        [helper.make_tensor_value_info("x", 1, ["N", 5])],
        [helper.make_tensor_value_info("y", 1, ["N", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    r = np.random.default_rng(0)
    cal = np.stack([r.uniform(2, 1024, 3000), r.uniform(0, 3e4, 3000), r.uniform(0, 3e4, 3000),
                    r.uniform(0, 65536, 3000), r.uniform(0, 1, 3000)], 1).astype(np.float32)
    return m, cal


def nfs_policy():
    """A transparent test policy on KML's NFS features: readseq (rsize
    256 KiB) while the mean |offset difference| between successive NFS
    reads of a window is under 1024 x 4 KiB, readrandom (4 KiB) above."""
    w = np.zeros((4, 8), np.float32)
    w[0, 4], w[2, 4] = 1 / 1024, -1 / 1024
    b = np.float32([-1, -100, 1, -100])
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="policy", transB=1)], "nfs",
        [helper.make_tensor_value_info("x", 1, ["N", 8])],
        [helper.make_tensor_value_info("y", 1, ["N", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    r = np.random.default_rng(0)
    hi = [2e5, 1e5, 1e5, 1e5, 65536, 65536, 4096, 256]
    cal = np.stack([r.uniform(0, h, 3000) for h in hi], 1).astype(np.float32)
    return m, cal


def tree_admission_policy():
    """A gradient-boosted tree admission policy on Heimdall's 11 features
    (scikit-learn, 30 trees of depth 3, through skl2onnx): decline the
    reads its label calls slow, as a bool output; and its calibration rows."""
    import warnings

    from sklearn.ensemble import GradientBoostingClassifier

    from kmlc.frontends import sklearn as sk

    x = seed_models.sample_inputs("heimdall", 3000, seed=7).astype(np.float32)
    slow = (x[:, 1] + x[:, 2] > np.median(x[:, 1] + x[:, 2])).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0)
        m, _ = sk.convert(clf.fit(x, slow), x)
    g = m.graph
    label = g.output[0].name
    g.node.append(helper.make_node("Cast", [label], ["decline"], name="decide",
                                   to=TensorProto.BOOL))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("decline", TensorProto.BOOL, [None]))
    return m, x


def tree_readahead_policy():
    """A random-forest readahead policy on KML's 5 features (10 trees of
    depth 4): readahead_policy's rule as labels, a few rows of the other
    two classes; its class probabilities are the output."""
    import warnings

    from sklearn.ensemble import RandomForestClassifier

    from kmlc.frontends import sklearn as sk

    _, x = readahead_policy()
    y = np.where(x[:, 3] < 1024, 2, 0)
    y[:40:2], y[1:40:2] = 1, 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rf = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0)
        m, _ = sk.convert(rf.fit(x, y), x)
    g = m.graph
    keep = g.output[1]
    del g.output[:]
    g.output.append(keep)
    return m, x


def constant_policy(n_in: int, bias, act: str | None = None, name: str = "const"):
    """A model that ignores its inputs: Gemm with zero weights and these
    biases (then ``act``, e.g. "Sigmoid"), and calibration rows for it: a
    policy kmlc's hooks must carry as well as any (every decision the same
    class, or every read declined)."""
    bias = np.float32(bias)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["z" if act else "y"], name="policy",
                              transB=1)]
    if act:
        nodes.append(helper.make_node(act, ["z"], ["y"], name="act"))
    g = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", 1, ["N", n_in])],
        [helper.make_tensor_value_info("y", 1, ["N", len(bias)])],
        [numpy_helper.from_array(np.zeros((len(bias), n_in), np.float32), "w"),
         numpy_helper.from_array(bias, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    cal = np.random.default_rng(1).uniform(0, 1000, (500, n_in)).astype(np.float32)
    return m, cal


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def kernel_tree() -> Path:
    """The cached kernel source tree (unpacked on first use)."""
    from kmlc.targets.kunit import source_tree

    return source_tree()


@pytest.fixture
def seed_inputs():
    return seed_models.sample_inputs



# The slowest test modules and about how long each takes on 2 cores, in
# seconds (the durations of a full run: pytest --durations).  Under xdist's
# work stealing each worker starts on an equal share of the collection, in
# order; these go first, spread over the shares so that every worker starts
# on a long module (one worker's tail of qemu boots would otherwise end the
# run alone).  Only the order changes: a stale figure costs time, not
# correctness.
SLOW_MODULES = {"e2e/test_qemu.py": 2200, "e2e/test_arm64.py": 600,
                "conformance/test_trees.py": 450, "fuzz/test_fuzz.py": 250,
                "examples/test_admission_example.py": 250, "e2e/test_fixed_models.py": 200,
                "e2e/test_package.py": 200, "examples/test_examples_in_kernel.py": 190,
                "conformance/test_tensor_ops.py": 150, "e2e/test_bench.py": 150,
                "e2e/test_decision_models.py": 120, "e2e/test_signing.py": 40}


# The tests that build a kernel from source on a cold cache (the debug
# kernel, 20-25 minutes on 2 cores, then its own 10 minutes of scenarios, and
# the tests that use it after; the arm64 KUnit kernel, 15): each goes first
# in its share, so that those chains start when the run does instead of
# ending it.
FIRST = ("e2e/test_qemu.py::test_hooks_in_debug_kernel", "e2e/test_arm64.py::test_kunit_on_arm64")


def pytest_collection_modifyitems(session, config, items):
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    modules: dict[str, list] = {}
    for it in items:
        modules.setdefault(Path(str(it.fspath)).relative_to(Path(__file__).parent).as_posix(),
                           []).append(it)
    shares, cost = [[] for _ in range(workers)], [0.0] * workers
    for mod in sorted((m for m in modules if m in SLOW_MODULES), key=lambda m: -SLOW_MODULES[m]):
        i = cost.index(min(cost))           # the least loaded share takes the next longest
        shares[i] += modules.pop(mod)
        cost[i] += SLOW_MODULES[mod]
    rest = [it for its in modules.values() for it in its]
    size = -(-len(items) // workers)
    for share in shares:                    # the quick tests fill each share to its count
        take = max(0, size - len(share))
        share += rest[:take]
        rest = rest[take:]
    for share in shares:                    # stable: the rest keep their order
        share.sort(key=lambda it: it.nodeid.split("tests/", 1)[-1] not in FIRST)
    items[:] = [it for share in shares for it in share] + rest
