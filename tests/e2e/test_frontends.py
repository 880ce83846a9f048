"""The three frontends meet in one IR.

For each seed model, the routes below must give the same graph after the
pass pipeline, the same lowered schedule and memory plan, and twins that
agree bit for bit on realistic rows:

  ONNX file             examples/models/<m>.onnx
  Relax from_onnx       tvm.relax.frontend.onnx.from_onnx of the same file
  PyTorch module        kmlc.compile(module, example_inputs): torch.onnx in memory
  ONNX file of module   torch.onnx.export(module, ..., file) (dynamo and legacy)
  Relax exported        tvm.relax.frontend.torch.from_exported_program(module)

Relax variables have no ONNX names, so Relax routes are compared modulo
names: every value renamed by first appearance, op origins dropped, and
every constant compared bit for bit.  The PyTorch route and the same
dynamo export written to a file give byte-identical IR, names included.
Independent oracles: onnxruntime, PyTorch itself and TVM's own VM.
"""
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx
import pytest
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.relax.frontend.torch import from_exported_program

from conftest import EXAMPLES, ROOT, SEED_MODELS, kmlc_cli, make_model, mlp_model, seed_models
from kmlc import KmlcError
from kmlc.api import compile as kcompile, load, lower_model
from kmlc.frontends import load as import_model
from kmlc.passes import GRAPH_PASSES
from kmlc.verify import reference_outputs

pytestmark = pytest.mark.torch


def routes_graph(model, *args, **kw):
    """The graph after the pass pipeline's graph passes."""
    g = import_model(model, *args, **kw).graph
    for _, fn in GRAPH_PASSES:
        g = fn(g)
    return g


def canonical(text: str) -> str:
    """Printed IR with values renamed by first appearance, origins and source names dropped."""
    names = {}
    text = re.sub(r"  // .*$", "", text, flags=re.M)
    text = re.sub(r"^(graph|schedule) @\w+", r"\1", text, flags=re.M)
    text = re.sub(r"'\w+'", "'_'", text)  # source names of inputs and outputs
    return re.sub(r"%(\w+)|\b(t_\w+)",  # values; workspace buffers in the memory plan
                  lambda m: "%v" + str(names.setdefault(m.group(1) or m.group(2), len(names))),
                  text)


def same_ir(a, b, exact=False):
    """Two routes' graphs are the same computation: printed IR (modulo names
    unless ``exact``) and every constant's bits."""
    if exact:
        assert str(a) == str(b)
    assert canonical(str(a)) == canonical(str(b))
    ca, cb = a.constants(), b.constants()
    assert [c.type for c in ca] == [c.type for c in cb]
    for x, y in zip(ca, cb):
        assert x.data.tobytes() == y.data.tobytes(), (x.name, y.name)


def stages(model, *args, **kw):
    out = {}
    lower_model(model, *args, print_after=lambda s, t: out.__setitem__(s, t), **kw)
    return out


def same_program(a, b):
    """Identical lowered schedules and memory plans (modulo names)."""
    sa, sb = stages(*a), stages(*b)
    for stage in ("lower", "plan-memory"):
        assert canonical(sa[stage]) == canonical(sb[stage]), stage


def bits(y):
    return np.ascontiguousarray(y, dtype=np.float32).view(np.uint32)


def twin_outputs(tmp_path, tag, model, *args, rows, **kw):
    kcompile(model, *args, tmp_path / tag, targets="user", **kw)
    return load(tmp_path / tag).run(rows)


def module(name):
    return seed_models.build(name, train=False)


def example(name):
    return torch.zeros(1, seed_models.IN_FEATURES[name])


def rows(name, n=200):
    return seed_models.sample_inputs(name, n, seed=21)


def tvm_vm_outputs(mod, x):
    """TVM's own compiled Relax module, row by row: the oracle for the Relax route."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    shape = [int(d.value) for d in mod["main"].params[0].ty.shape.values]
    out = []
    for row in x:
        y = vm["main"](tvm.runtime.tensor(row.reshape(shape)))
        ys = [y] if hasattr(y, "numpy") else list(y)
        out.append(np.concatenate([np.asarray(t.numpy(), np.float32).reshape(-1) for t in ys]))
    return np.stack(out)


def quiet_export(m, args, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, args, str(path), verbose=False, **kw)
    return path


# --------------------------------------------------------------------------
# Same IR, same outputs
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", SEED_MODELS)
def test_relax_from_onnx_matches_onnx_route(tmp_path, name):
    path = EXAMPLES / f"{name}.onnx"
    mod = from_onnx(onnx.load(path))
    same_ir(routes_graph(path, name=name), routes_graph(mod, name=name))
    same_program((path,), (mod,))
    x = rows(name)
    y_onnx = twin_outputs(tmp_path, "onnx", path, rows=x, name=name)
    y_relax = twin_outputs(tmp_path, "relax", mod, rows=x, name=name)
    assert np.array_equal(bits(y_onnx), bits(y_relax))
    prog = lower_model(path)
    assert np.abs(y_onnx - reference_outputs(path, prog, x)).max() <= 1e-5  # onnxruntime
    assert np.abs(y_relax[:50] - tvm_vm_outputs(mod, x[:50])).max() <= 1e-5  # TVM itself


@pytest.mark.parametrize("name", SEED_MODELS)
def test_torch_route_matches_relax_exported_program(tmp_path, name):
    m, x0 = module(name), example(name)
    mod = from_exported_program(torch.export.export(m, (x0,)))
    same_ir(routes_graph(m, x0, name=name), routes_graph(mod, name=name))
    same_program((m, x0), (mod,))
    x = rows(name)
    y_torch = twin_outputs(tmp_path, "torch", m, x0, rows=x, name=name)
    y_relax = twin_outputs(tmp_path, "relax", mod, rows=x, name=name)
    assert np.array_equal(bits(y_torch), bits(y_relax))
    with torch.no_grad():
        assert np.abs(y_torch - m(torch.from_numpy(x)).numpy()).max() <= 1e-5  # PyTorch


@pytest.mark.parametrize("name", SEED_MODELS)
def test_torch_route_matches_onnx_file_route(tmp_path, name):
    m, x0 = module(name), example(name)
    dynamo = quiet_export(m, (x0,), tmp_path / "d.onnx", dynamo=True, external_data=False)
    legacy = quiet_export(m, (x0,), tmp_path / "l.onnx", dynamo=False)
    g = routes_graph(m, x0, name=name)
    same_ir(g, routes_graph(dynamo, name=name), exact=True)  # names included
    same_ir(g, routes_graph(legacy, name=name))
    x = rows(name)
    y_torch = twin_outputs(tmp_path, "torch", m, x0, rows=x, name=name)
    y_file = twin_outputs(tmp_path, "file", dynamo, rows=x, name=name)
    assert np.array_equal(bits(y_torch), bits(y_file))


def test_torch_route_fixed_point_matches_onnx_file(tmp_path):
    """The issue's call: kmlc.compile(module, example_inputs, outdir=..., numerics="fixed",
    calibration=X); the integer IR and the twin's bits equal the file route's."""
    m, x0 = module("readahead"), example("readahead")
    cal, x = seed_models.sample_inputs("readahead", 500, seed=3), rows("readahead")
    path = quiet_export(m, (x0,), tmp_path / "ra.onnx", dynamo=True, external_data=False)
    kw = dict(numerics="fixed", calibration=cal, name="ra")
    a, b = stages(m, x0, **kw), stages(path, **kw)
    assert a["bound-ranges"] == b["bound-ranges"] and a["plan-memory"] == b["plan-memory"]
    r = kcompile(m, x0, outdir=tmp_path / "t", targets="user", **kw)
    assert r.manifest["numerics"] == "fixed"
    kcompile(path, tmp_path / "f", targets="user", **kw)
    assert np.array_equal(load(tmp_path / "t").run(x), load(tmp_path / "f").run(x))


# --------------------------------------------------------------------------
# PyTorch frontend
# --------------------------------------------------------------------------

class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b = nn.Linear(3, 4), nn.Linear(2, 4)

    def forward(self, u, v):
        return torch.tanh(self.a(u) + self.b(v))


def test_torch_route_inputs_batch_and_mode(tmp_path):
    """Tuples of inputs, numpy inputs, a batch of example rows (one sample
    per call), eval mode during export with the module's mode restored."""
    m = TwoInputs().train()
    u, v = np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 2))
    r = kcompile(m, (u.astype(np.float32), torch.from_numpy(v).float()), tmp_path / "o",
                 targets="user")
    assert m.training
    assert r.manifest["name"] == "two_inputs" and r.manifest["in_elems"] == 5
    assert [p["shape"] for p in r.manifest["inputs"]] == [[1, 3], [1, 2]]
    x = np.random.default_rng(1).normal(size=(20, 5)).astype(np.float32)
    with torch.no_grad():
        ref = m.eval()(torch.from_numpy(x[:, :3]), torch.from_numpy(x[:, 3:])).numpy()
    assert np.abs(load(tmp_path / "o").run(x) - ref).max() <= 1e-6


def test_torch_export_leaves_nothing_behind_and_prints_nothing(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tempfile.gettempdir()))
    import_model(module("readahead"), example("readahead"))
    with pytest.raises(KmlcError):
        import_model(DataDependent(), torch.zeros(1, 4))
    assert os.listdir(tmp_path) == []
    assert not [p for p in set(os.listdir(tempfile.gettempdir())) - before
                if p.startswith("kmlc-torch-")]
    out, err = capfd.readouterr()
    assert out == "" and err == ""


class DataDependent(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


class WithCumSum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)


@pytest.mark.parametrize("model, inputs, message", [
    (TwoInputs(), (torch.zeros(1, 3), torch.zeros(1, 5)),
     r"TwoInputs \(torch.nn.Module\): the module fails on example inputs of shape \[1, 3\], "
     r"\[1, 5\]: RuntimeError: .*mat1 and mat2 shapes cannot be multiplied"),
    (DataDependent(), torch.zeros(1, 4),
     r"DataDependent \(torch.nn.Module\): torch.onnx.export failed: \w+: .*data-dependent"),
    (WithCumSum(), torch.zeros(1, 4),
     r"WithCumSum \(torch.nn.Module\): node '\w+' \(CumSum\): kmlc cannot "
     r"compile CumSum; supported ops: Abs, Add"),
    (TwoInputs(), None, r"needs example inputs"),
    (TwoInputs(), (torch.zeros(1, 3, dtype=torch.float64), torch.zeros(1, 2)),
     r"example input 0 has dtype float64; kmlc models take float32 inputs"),
    (TwoInputs(), ("a", torch.zeros(1, 2)), r"example input 0 is a str, not a tensor"),
])
def test_torch_route_errors(tmp_path, model, inputs, message):
    with pytest.raises(KmlcError, match=message) as e:
        kcompile(model, inputs, tmp_path / "out", targets="user")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_api_argument_errors(tmp_path):
    with pytest.raises(KmlcError, match="example inputs are only for a torch.nn.Module"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "a", tmp_path / "b")
    with pytest.raises(KmlcError, match="no output directory"):
        kcompile(module("readahead"), example("readahead"))
    with pytest.raises(KmlcError, match="params are for a TVM IRModule"):
        lower_model(EXAMPLES / "readahead.onnx", params={})
    with pytest.raises(KmlcError, match="cannot compile a builtins.int"):
        lower_model(3)


# --------------------------------------------------------------------------
# TVM frontend
# --------------------------------------------------------------------------

class Ops(nn.Module):
    """Every Relax op the frontend maps, as from_exported_program emits them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x.flatten(1))) * 2.0 - 0.5
        h = nn.functional.leaky_relu(h, 0.1) / 1.5
        h = torch.clamp(torch.relu(h) + torch.sigmoid(h), -1.0, 1.25).reshape(-1, 8)
        y = self.b(h)
        return torch.softmax(y, -1), torch.argmax(y, -1)


def test_relax_op_set_against_pytorch_and_tvm(tmp_path):
    m, x0 = Ops().eval(), torch.zeros(1, 2, 3)
    mod = from_exported_program(torch.export.export(m, (x0,)))
    g = import_model(mod).graph
    assert sorted({op.kind for op in g.ops}) == sorted({
        "reshape", "transpose", "matmul", "add", "tanh", "mul", "sub", "leaky_relu", "div",
        "relu", "sigmoid", "clip", "softmax", "argmax"})
    assert all(re.fullmatch(r"\w+ \(relax\.[\w.]+\)", op.origin[0]) for op in g.ops)
    x = np.random.default_rng(2).normal(size=(100, 6)).astype(np.float32) * 3
    y = twin_outputs(tmp_path, "relax", mod, rows=x)
    with torch.no_grad():
        p, i = m(torch.from_numpy(x).reshape(100, 2, 3))
    assert np.abs(y[:, :4] - p.numpy()).max() <= 1e-6
    assert np.array_equal(y[:, 4], i.numpy())
    assert np.abs(y[:20] - tvm_vm_outputs(mod, x[:20])).max() <= 1e-6
    # the PyTorch route computes the same bits
    assert np.array_equal(bits(y), bits(twin_outputs(tmp_path, "torch", m, x0, rows=x)))


def test_relax_params_and_symbolic_batch(tmp_path):
    """Weights as bound parameters (the importers' params attribute, detach_params'
    dict, a dict by name, a list), and a symbolic batch dimension bound to 1."""
    model = mlp_model([4, 6, 3], batch="N")
    ref = routes_graph(model)
    kept = from_onnx(model, keep_params_in_input=True)
    bare, detached = relax.frontend.detach_params(kept)
    names = [p.name for p in kept["main"].params]
    arrays = [a.numpy() for a in detached["main"]]
    for mod, params in [(from_onnx(model), None), (kept, None), (bare, detached),
                        (bare, dict(zip(names[1:], arrays))), (bare, arrays)]:
        g = routes_graph(mod, params=params)
        same_ir(ref, g)
        assert g.inputs[0].type.shape == (1, 4)
    with pytest.raises(KmlcError, match=r"params name 'nope', which main does not take"):
        import_model(bare, params={"nope": arrays[0]})


@pytest.mark.parametrize("op, message", [
    (lambda x: relax.op.nn.gelu(x),
     r"TVM IRModule @main: binding '\w+' \(relax.nn.gelu\): kmlc cannot compile relax.nn.gelu; "
     r"supported Relax ops: abs, add, argmax, "),
    (lambda x: relax.op.astype(x, "int32"),
     r"binding '\w+' \(relax.astype\): astype to int32 of runtime data is not supported"),
    (lambda x: relax.op.power(x, x), r"'\w+ \(relax.power\)' .*kmlc evaluates pow only at "
                                     r"compile time"),
])
def test_relax_errors(op, message):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    with pytest.raises(KmlcError, match=message):
        lower_model(bb.get())


def test_relax_rejects_dynamic_dims_and_lowered_calls():
    n, k = tvm.ir.Var("n", "int64"), tvm.ir.Var("k", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    with pytest.raises(KmlcError, match=r"input 'x' has a dynamic dimension 1 \('k'\)"):
        lower_model(bb.get())
    # TVM's ONNX importer lowers Clip to TIR calls, which kmlc does not read
    clip = make_model([onnx.helper.make_node("Clip", ["x", "lo"], ["y"])], [("x", [1, 4])],
                      [("y", [1, 4])], {"lo": np.float32(0)})
    with pytest.raises(KmlcError, match=r"calls 'maximum'; kmlc imports Relax operators only"):
        lower_model(from_onnx(clip))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

MODEL_PY = '''
import torch
from torch import nn


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x):
        return self.net(x)


class Pair(nn.Module):
    def forward(self, u, v):
        return torch.sigmoid(u) * v


def make_policy():
    return Policy()


def needs_size(n):
    return Policy()


class Helper:
    pass


class Branchy(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x
'''


@pytest.fixture
def model_py(tmp_path):
    p = tmp_path / "policy.py"
    p.write_text(MODEL_PY)
    return p


def cli(capfd, *args):
    """``kmlc ARGS`` in this process (torch is imported once): status, stdout, stderr."""
    from kmlc.cli import main

    rc = main([str(a) for a in args])
    out, err = capfd.readouterr()
    return rc, out, err


def test_cli_compiles_module_class_and_factory(tmp_path, model_py, capfd):
    r = kmlc_cli("compile", f"{model_py}:Policy", "--input-shape", "1,5", "-o", tmp_path / "a",
                 "--target", "user")  # the installed command, in its own process
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "compiled policy (float): 5 -> 4 values" in r.stdout
    path, modules = list(sys.path), set(sys.modules)
    rc, out, err = cli(capfd, "compile", f"{model_py}:make_policy", "--input-shape", "1,5",
                       "-o", tmp_path / "b", "--target", "user", "--name", "made")
    assert rc == 0 and err == "", err
    assert sys.path == path  # the model file's directory and module are gone again
    assert not [m for m in set(sys.modules) - modules if m.startswith("_kmlc_model")]
    x = np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32)
    ns = {}
    exec(MODEL_PY, ns)
    with torch.no_grad():
        ref = ns["Policy"]().eval()(torch.from_numpy(x)).numpy()
    ya, yb = load(tmp_path / "a").run(x), load(tmp_path / "b").run(x)
    assert np.array_equal(bits(ya), bits(yb)) and np.abs(ya - ref).max() <= 1e-6
    rc, out, err = cli(capfd, "compile", f"{model_py}:Pair", "--input-shape", "1,3",
                       "--input-shape", "3", "-o", tmp_path / "c", "--target", "user")
    assert rc == 0, err
    assert [p["shape"] for p in load(tmp_path / "c").meta["inputs"]] == [[1, 3], [3]]
    rc, out, err = cli(capfd, "inspect", f"{model_py}:Policy", "--input-shape", "5")
    assert rc == 0 and "graph @policy(%x: f32[5])" in out and "IR Dump After plan-memory" in out


@pytest.mark.parametrize("spec, shapes, message", [
    ("missing.py:Policy", ["1,5"], r"missing.py: no such file"),
    ("{py}:Nope", ["1,5"], r"policy.py: the file defines no 'Nope' \(it defines: Branchy, "
                           r"Pair, Policy, make_policy, needs_size\)"),
    ("{py}:Helper", ["1,5"], r"policy.py:Helper: 'Helper' is a class that is not a "
                             r"torch.nn.Module"),
    ("{py}:needs_size", ["1,5"], r"cannot call 'needs_size' without arguments: TypeError"),
    ("{py}:Policy", ["1,4"], r"Policy \(torch.nn.Module\): the module fails on example inputs "
                             r"of shape \[1, 4\]: RuntimeError"),
    ("{py}:Policy", ["1,x"], r"--input-shape takes positive integers separated by commas"),
    ("{py}:Policy", [], r"policy.py:Policy: a PyTorch model needs --input-shape"),
    ("{py}:Branchy", ["1,5"], r"Branchy \(torch.nn.Module\): torch.onnx.export failed: "),
    ("{onnx}", ["1,5"], r"readahead.onnx: --input-shape is for a PyTorch model"),
])
def test_cli_errors(tmp_path, model_py, capfd, spec, shapes, message):
    spec = spec.format(py=model_py, onnx=EXAMPLES / "readahead.onnx")
    args = [a for s in shapes for a in ("--input-shape", s)]
    rc, out, err = cli(capfd, "compile", spec, *args, "-o", tmp_path / "out")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, err
    assert re.match(r"kmlc: error: .*" + message, err), err
    assert not (tmp_path / "out").exists()


def test_kmlc_works_without_torch_and_tvm(tmp_path):
    """torch and tvm are imported lazily: kmlc compiles ONNX without them, and
    a PyTorch model without torch is a clear error saying what to install."""
    block = "import sys; sys.modules['torch'] = None; sys.modules['tvm'] = None; "
    code = block + ("import kmlc; kmlc.compile(sys.argv[1], sys.argv[2], targets='user'); "
                    "from kmlc.cli import main; sys.exit(main(sys.argv[3:]))")
    r = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "readahead.onnx"),
                        str(tmp_path / "o"), "compile", f"{ROOT}/x.py:M", "--input-shape", "5",
                        "-o", str(tmp_path / "p")], capture_output=True, text=True)
    assert (tmp_path / "o" / "kmlc.json").is_file(), r.stderr
    assert r.returncode == 1 and r.stderr.startswith(
        "kmlc: error: a PyTorch model (FILE.py:NAME) needs the 'torch' package"), r.stderr
    assert "pip install 'kmlc[torch]'" in r.stderr
