"""kmlc's own fuzzer: seeded, reproducible mutations through the real CLI.

Every case is a model and its data files, made from (seed, case number)
alone, in one of six classes:

  bytes    the serialized model's bytes: flips, cuts, insertions, repeats
  graph    structure: nodes dropped, repeated, rewired, reordered, op types
           and attributes changed, outputs added or pointed at inputs
  shapes   dimensions (0, huge, symbolic, wrong rank) and element types
  values   weights, biases and attributes: 0, denormals, 1e-40, 1e38,
           infinities, NaN, very wide ranges
  names    hostile names of inputs, outputs, nodes, weights, the graph, the
           model file and --name
  files    calibration and input .npy files: NaN rows, wrong shapes and
           dtypes, pickles, truncations, garbage

The base model is a fresh random MLP (onnx.helper) or a bundled one, and
the numerics float or fixed.  Each case runs ``kmlc compile`` into an
OUTDIR that already holds a kmlc output, then, when the compile succeeds,
``kmlc run`` on the case's input file and on clean rows.  Outcomes:

  refused     exit 1 and one line "kmlc: error: ...", no traceback, OUTDIR
              and its directory exactly as before
  accepted    exit 0; the twin's outputs on clean rows match onnxruntime
              (float: within 1e-5 + 1e-5 |ref| + 1e-5 M, M the largest
              magnitude onnxruntime computes on the row, dot products'
              |a|.|b| included; fixed: within the error bound the compiler
              states in kmlc.json, on the calibration rows), and a build of
              the twin's C under -fsanitize=address,undefined gives the
              same bits with no report, on clean and extreme rows

Anything else is a defect: internal error (exit 2), traceback, multi-line
message, hang, crash, OUTDIR touched, accepted-but-C-fails (a twin build
that warns or fails), accepted-but-wrong, sanitizer report, a failing
``kmlc run`` on clean rows.

    python tests/fuzz/kmlfuzz.py --cases 5000 --budget 3600   (make fuzz)
    python tests/fuzz/kmlfuzz.py --only 1234 --keep /tmp/c    one case, kept
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"
KMLC = Path(sys.executable).parent / "kmlc"
CLASSES = ("bytes", "graph", "shapes", "values", "names", "files")
DEFECTS = ("internal error", "traceback", "multi-line", "hang", "crash", "outdir touched",
           "accepted, C fails", "accepted, wrong", "sanitizer", "run fails")
TIMEOUT = 120
FLT_MAX = float(np.finfo(np.float32).max)

# ---- base models ----------------------------------------------------------------


def _f32(rng, shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(np.float32)


def fresh_model(rng) -> onnx.ModelProto:
    """A random MLP over ONNX ops kmlc compiles: a normalization, 1-4 dense
    layers (Gemm with either transB and any alpha/beta, or MatMul + Add,
    with or without a bias), activations of every kind, elementwise
    constants, Identity/Flatten/Reshape between layers, a Softmax / ArgMax
    head, a symbolic or fixed batch, and sometimes a second output tapping
    a hidden layer."""
    k = int(rng.integers(1, 13))
    nodes, inits, x = [], {}, "x"
    if rng.random() < 0.5:
        inits["mu"], inits["sd"] = _f32(rng, k, 3), np.abs(_f32(rng, k, 2)) + 0.1
        nodes += [helper.make_node("Sub", ["x", "mu"], ["xc"], name="sub"),
                  helper.make_node("Div", ["xc", "sd"], ["xn"], name="div")]
        x = "xn"
    layers = int(rng.integers(1, 5))
    width, taps = k, []
    for i in range(layers):
        n = int(rng.integers(1, 17))
        w = _f32(rng, (width, n), 1 / np.sqrt(width))
        bias = rng.random() < 0.85
        if rng.random() < 0.5:
            tb = int(rng.integers(0, 2))
            inits[f"W{i}"] = np.ascontiguousarray(w.T) if tb else w
            ins = [x, f"W{i}"] + ([f"b{i}"] if bias else [])
            extra = {} if rng.random() < 0.7 else {"alpha": float(rng.choice([0.5, 2.0, -1.0])),
                                                   "beta": float(rng.choice([0.0, 0.5, 3.0]))}
            nodes.append(helper.make_node("Gemm", ins, [f"h{i}"], name=f"fc{i}", transB=tb,
                                          **extra))
        else:
            inits[f"W{i}"] = w
            nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"mm{i}"))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"h{i}"], name=f"add{i}")
                         if bias else helper.make_node("Identity", [f"m{i}"], [f"h{i}"],
                                                       name=f"id{i}"))
        if bias:
            inits[f"b{i}"] = _f32(rng, n, 0.5)
        x, width = f"h{i}", n
        if rng.random() < 0.2:                       # an elementwise constant
            op = str(rng.choice(["Mul", "Add", "Sub", "Div"]))
            inits[f"c{i}"] = (_f32(rng, n) if rng.random() < 0.5 else _f32(rng, ())) + \
                np.float32(2.0 if op == "Div" else 0.0)
            nodes.append(helper.make_node(op, [x, f"c{i}"], [f"e{i}"], name=f"ew{i}"))
            x = f"e{i}"
        last = i == layers - 1
        act = rng.choice(["none", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip"] +
                         (["Softmax", "ArgMax"] if last and n > 1 else []))
        if act != "none":
            attrs, ins = {}, [x]
            if act == "LeakyRelu":
                attrs["alpha"] = float(rng.choice([0.01, 0.2, -0.5, 1.5, 0.0]))
            elif act in ("Softmax", "ArgMax"):
                attrs["axis"] = int(rng.choice([1, -1]))
            elif act == "Clip":
                lo, hi = sorted(rng.normal(size=2))
                inits[f"lo{i}"] = np.float32(lo)
                inits[f"hi{i}"] = np.float32(hi if rng.random() < 0.9 else lo - 1)
                ins += [f"lo{i}", f"hi{i}"]
            nodes.append(helper.make_node(str(act), ins, [f"a{i}"], name=f"act{i}", **attrs))
            x = f"a{i}"
        if not last and rng.random() < 0.2:          # shape ops between layers
            op = str(rng.choice(["Identity", "Flatten", "Reshape"]))
            ins = [x]
            if op == "Reshape":
                inits[f"s{i}"] = np.array([1, -1], np.int64)
                ins.append(f"s{i}")
            nodes.append(helper.make_node(op, ins, [f"r{i}"], name=f"shape{i}"))
            x = f"r{i}"
        if not last and rng.random() < 0.15:
            taps.append((x, width))
    argmax = nodes[-1].op_type == "ArgMax"
    batch = 1 if rng.random() < 0.6 else "N"
    outs = [helper.make_tensor_value_info(x, TensorProto.INT64 if argmax else TensorProto.FLOAT,
                                          [batch, 1 if argmax else width])]
    outs += [helper.make_tensor_value_info(t, TensorProto.FLOAT, [batch, w]) for t, w in taps]
    g = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])], outs,
        [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", int(rng.integers(13, 22)))])
    m.ir_version = int(rng.integers(7, 11))
    return m


BUNDLED = ("readahead", "nfs_rsize", "heimdall")


def base_model(rng) -> tuple[onnx.ModelProto, str | None]:
    if rng.random() < 0.3:
        name = str(rng.choice(BUNDLED))
        return onnx.load(str(EXAMPLES / f"{name}.onnx")), name
    return fresh_model(rng), None


def in_elems(m: onnx.ModelProto) -> int:
    inits = {i.name for i in m.graph.initializer}
    total = 0
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 1
                for d in vi.type.tensor_type.shape.dim]
        total += int(np.prod(dims[1:])) if len(dims) > 1 else int(np.prod(dims or [1]))
    return max(total, 1)


def clean_rows(rng, m, bundled: str | None, n: int) -> np.ndarray:
    if bundled:
        sys.path.insert(0, str(EXAMPLES))
        import seed_models
        return seed_models.sample_inputs(bundled, n, seed=int(rng.integers(1 << 30)))
    return (rng.normal(size=(n, in_elems(m))) * rng.choice([0.5, 2.0, 10.0])).astype(np.float32)


# ---- mutations ------------------------------------------------------------------

TINY = [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1e-30, 1e-20]
HUGE = [1e20, -1e20, 1e30, 1e38, -1e38, 3.4028235e38]
BAD = [np.inf, -np.inf, np.nan]
HOSTILE_NAMES = ["in*/x", "*/", "/*", "//", "a\nb", "\u202eevil", "é", "ü", "Y", "y", 'q"u',
                 "b\\s", "??=", "%s%n", " ", "", "9lives", "n" * 300, "\t", "kml_features",
                 "kml_fixed", "kml_readahead", "kml_x", "../x", "-o", "con", "\x00", "ELEMS",
                 "$(id)", "a.b", "日本"]
OPS = ["Relu", "Sigmoid", "Tanh", "Softmax", "Exp", "Abs", "Neg", "Add", "Mul", "Sub", "Div",
       "MatMul", "Gemm", "Identity", "Flatten", "Transpose", "Concat", "ArgMax", "Clip",
       "LeakyRelu", "Elu", "Pow", "Max", "HardSigmoid", "Reshape", "Foo", "If", "Cast",
       "Log", "Sqrt", "Erf", "Reciprocal", "Slice", "Split", "Gather", "Expand", "Squeeze",
       "Unsqueeze", "ReduceSum", "ReduceMax", "ReduceMean", "ReduceL2", "ReduceLogSumExp",
       "LayerNormalization", "BatchNormalization", "Gelu", "LogSoftmax", "Sum", "Mean",
       "CastLike", "Size"]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))] if len(seq) else None


def mutate_bytes(rng, data: bytes) -> tuple[bytes, str]:
    b = bytearray(data)
    how = _pick(rng, ["flip", "cut", "insert", "repeat", "zero", "empty", "text"])
    if how == "flip":
        for _ in range(int(rng.integers(1, 12))):
            i = int(rng.integers(len(b)))
            b[i] ^= 1 << int(rng.integers(8))
    elif how == "cut":
        b = b[:int(rng.integers(len(b)))]
    elif how == "insert":
        i = int(rng.integers(len(b)))
        b[i:i] = rng.integers(0, 256, int(rng.integers(1, 64))).astype(np.uint8).tobytes()
    elif how == "repeat":
        i = int(rng.integers(len(b)))
        j = min(len(b), i + int(rng.integers(1, 256)))
        b[j:j] = b[i:j]
    elif how == "zero":
        i = int(rng.integers(len(b)))
        b[i:i + int(rng.integers(1, 128))] = bytes(min(len(b) - i, 128))
    elif how == "empty":
        b = bytearray()
    else:
        b = bytearray(b"this is not an onnx model\n")
    return bytes(b), how


def mutate_graph(rng, m: onnx.ModelProto) -> str:
    g = m.graph
    nodes = g.node
    how = _pick(rng, ["drop", "repeat", "rewire", "reverse", "retype", "attr", "out-extra",
                      "out-input", "cycle", "opset", "ir", "domain", "no-output", "dup-name"])
    n = _pick(rng, list(nodes))
    values = [v.name for v in g.input] + [o for nd in nodes for o in nd.output] + \
        [i.name for i in g.initializer]
    if how == "drop" and len(nodes):
        nodes.remove(n)
    elif how == "repeat":
        nodes.append(onnx.NodeProto.FromString(n.SerializeToString()))
    elif how == "rewire" and n.input:
        n.input[int(rng.integers(len(n.input)))] = _pick(rng, values + ["nowhere"])
    elif how == "reverse":
        rev = list(nodes)[::-1]
        del nodes[:]
        nodes.extend(rev)
    elif how == "retype":
        n.op_type = _pick(rng, OPS)
    elif how == "attr":
        name = _pick(rng, ["axis", "alpha", "beta", "transA", "transB", "min", "max", "to",
                           "axes", "keepdims", "epsilon", "perm", "num_outputs"])
        val = _pick(rng, [0, 1, -1, 5, -7, 2.5, -1.0, 0.0, 1e30, float("nan")])
        kept = [a for a in n.attribute if a.name != name]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute(name, val)])
    elif how == "out-extra":
        g.output.append(helper.make_tensor_value_info(_pick(rng, values), TensorProto.FLOAT,
                                                      None))
    elif how == "out-input":
        g.output[0].name = _pick(rng, [v.name for v in g.input] + [i.name for i in g.initializer])
    elif how == "cycle" and n.input:
        n.input[0] = n.output[0]
    elif how == "opset":
        m.opset_import[0].version = int(rng.integers(1, 26))
    elif how == "ir":
        m.ir_version = int(rng.integers(0, 13))
    elif how == "domain":
        n.domain = _pick(rng, ["ai.onnx.ml", "com.microsoft", "x.y"])
    elif how == "no-output":
        del g.output[:]
    elif how == "dup-name" and len(nodes) > 1:
        nodes[0].name = nodes[1].name = "same"
    return f"{how} {n.name if n is not None else ''}".strip()


def mutate_shapes(rng, m: onnx.ModelProto) -> str:
    g = m.graph
    how = _pick(rng, ["in-dim", "in-rank", "in-type", "out-type", "out-dim", "init-dims",
                      "init-type", "batch"])
    vi = _pick(rng, list(g.input) if how.startswith("in") or how == "batch" else list(g.output))
    init = _pick(rng, list(g.initializer))
    dims = vi.type.tensor_type.shape.dim if vi is not None else []
    if how in ("in-dim", "out-dim") and len(dims):
        d = dims[int(rng.integers(len(dims)))]
        v = _pick(rng, [0, 2**31, 2**40, 7, 1000000, "sym", -1])
        if isinstance(v, str):
            d.dim_param = v
        else:
            d.dim_value = v
    elif how == "in-rank":
        if rng.random() < 0.5 and len(dims):
            del dims[-1]
        else:
            dims.add().dim_value = int(rng.integers(1, 4))
    elif how in ("in-type", "out-type"):
        vi.type.tensor_type.elem_type = int(_pick(rng, [0, 2, 6, 7, 9, 10, 11, 16, 999]))
    elif how == "init-dims" and init is not None:
        if len(init.dims):
            init.dims[int(rng.integers(len(init.dims)))] = int(rng.integers(0, 40))
        else:
            init.dims.append(3)
    elif how == "init-type" and init is not None:
        arr = numpy_helper.to_array(init)
        to = _pick(rng, [np.float64, np.float16, np.int64, np.int32, np.bool_])
        init.CopyFrom(numpy_helper.from_array(arr.astype(to), init.name))
    elif how == "batch" and len(dims):
        dims[0].dim_value = int(_pick(rng, [2, 8, 1000000]))
    return how


def mutate_values(rng, m: onnx.ModelProto) -> str:
    g = m.graph
    floats = [i for i in g.initializer if i.data_type == TensorProto.FLOAT]
    if rng.random() < 0.25 and len(g.node):
        n = _pick(rng, list(g.node))
        name = _pick(rng, ["alpha", "beta"])
        val = float(_pick(rng, TINY + HUGE + BAD + [-1.0, 0.5]))
        kept = [a for a in n.attribute if a.name != name]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute(name, val)])
        return f"attr {name}={val} on {n.op_type}"
    if not floats:
        return "none"
    init = _pick(rng, floats)
    arr = numpy_helper.to_array(init).astype(np.float32).copy()
    how = _pick(rng, ["one", "all", "scale", "wide"])
    v = np.float32(_pick(rng, TINY + HUGE + BAD))
    flat = arr.reshape(-1)
    if how == "one" and flat.size:
        flat[int(rng.integers(flat.size))] = v
    elif how == "all":
        flat[:] = v
    elif how == "scale":
        with np.errstate(all="ignore"):
            flat *= np.float32(10.0 ** rng.uniform(-40, 38))
    elif flat.size:
        with np.errstate(all="ignore"):
            flat *= (10.0 ** rng.uniform(-20, 20, flat.size)).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    return f"{how} {init.name} ({v:g})"


def mutate_names(rng, m: onnx.ModelProto) -> tuple[str, str | None, str]:
    """Renames consistently (the model stays valid) or not; returns also a
    --name option and a model file stem."""
    g = m.graph
    name = _pick(rng, HOSTILE_NAMES)
    where = _pick(rng, ["input", "output", "node", "init", "graph", "option", "file",
                        "every"])
    opt, stem = None, "model"

    def rename(old, new):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.name == old:
                vi.name = new
        for i in g.initializer:
            if i.name == old:
                i.name = new
        for nd in g.node:
            nd.input[:] = [new if v == old else v for v in nd.input]
            nd.output[:] = [new if v == old else v for v in nd.output]

    if where == "input":
        rename(g.input[0].name, name)
    elif where == "output":
        rename(g.output[0].name, name)
    elif where == "node" and len(g.node):
        _pick(rng, list(g.node)).name = name
    elif where == "init" and len(g.initializer):
        rename(_pick(rng, list(g.initializer)).name, name)
    elif where == "graph":
        g.name = name
    elif where == "option":
        opt = name.replace("\x00", "\\0")    # argv cannot hold a NUL byte
    elif where == "file":
        stem = (name.replace("/", "_").replace("\x00", "_") or "_")[:200]
    else:
        for i, nd in enumerate(g.node):
            nd.name = _pick(rng, HOSTILE_NAMES) + str(i)
        rename(g.input[0].name, _pick(rng, HOSTILE_NAMES))
        rename(g.output[0].name, _pick(rng, HOSTILE_NAMES) + "_o")
    return f"{where}={name!r}", opt, stem


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def mutate_rows(rng, rows: np.ndarray) -> tuple[bytes, str]:
    how = _pick(rng, ["nan", "inf", "huge", "tiny", "cols", "1d", "3d", "empty", "one",
                      "int", "bool", "object", "complex", "f16", "f64", "struct", "cut",
                      "garbage", "fortran", "const"])
    r = rows.astype(np.float32).copy()
    if how == "nan":
        r[int(rng.integers(len(r))), int(rng.integers(r.shape[1]))] = np.nan
    elif how == "inf":
        r[int(rng.integers(len(r))), int(rng.integers(r.shape[1]))] = _pick(rng, [np.inf, -np.inf])
    elif how == "huge":
        r[int(rng.integers(len(r)))] = np.float32(_pick(rng, HUGE))
    elif how == "tiny":
        r[:] *= np.float32(1e-40)
    elif how == "cols":
        r = r[:, :-1] if r.shape[1] > 1 and rng.random() < 0.5 else np.hstack([r, r[:, :1]])
    elif how == "1d":
        r = r[0]
    elif how == "3d":
        r = r[:, None, :]
    elif how == "empty":
        r = r[:0]
    elif how == "one":
        r = r[:1]
    elif how == "int":
        r = r.astype(np.int64)
    elif how == "bool":
        r = r > 0
    elif how == "object":
        r = r.astype(object)
    elif how == "complex":
        r = r.astype(np.complex64)
    elif how == "f16":
        with np.errstate(over="ignore"):
            r = r.astype(np.float16)
    elif how == "f64":
        r = r.astype(np.float64) * 1e300
    elif how == "struct":
        r = np.zeros(len(r), dtype=[("a", "f4"), ("b", "i4")])
    elif how == "fortran":
        r = np.asfortranarray(r)
    elif how == "const":
        r[:, 0] = 3.0
    data = _npy(r)
    if how == "cut":
        data = data[:int(rng.integers(len(data)))]
    elif how == "garbage":
        data = bytes(rng.integers(0, 256, 200).astype(np.uint8))
    return data, how


# ---- one case -----------------------------------------------------------------


@dataclass
class Case:
    index: int
    cls: str
    numerics: str
    note: str = ""
    model: bytes = b""
    stem: str = "model"
    name_opt: str | None = None
    cal: bytes | None = None      # .npy bytes (fixed)
    rows: bytes = b""             # .npy bytes for `kmlc run`
    clean: np.ndarray | None = None   # rows for the oracle
    extra: list = field(default_factory=list)


def make_case(seed: int, index: int) -> Case:
    rng = np.random.default_rng([seed, index])
    cls = CLASSES[index % len(CLASSES)]
    numerics = "fixed" if rng.random() < 0.5 else "float"
    m, bundled = base_model(rng)
    c = Case(index, cls, numerics)
    cal = clean_rows(rng, m, bundled, 300)
    c.clean = cal if numerics == "fixed" else clean_rows(rng, m, bundled, 64)
    if cls == "graph":
        c.note = mutate_graph(rng, m)
    elif cls == "shapes":
        c.note = mutate_shapes(rng, m)
    elif cls == "values":
        c.note = mutate_values(rng, m)
    elif cls == "names":
        c.note, c.name_opt, c.stem = mutate_names(rng, m)
    c.model = m.SerializeToString()
    if cls == "bytes":
        c.model, c.note = mutate_bytes(rng, c.model)
    c.cal = _npy(cal) if numerics == "fixed" else None
    c.rows = _npy(c.clean)
    if cls == "files":
        data, how = mutate_rows(rng, cal if numerics == "fixed" else c.clean)
        if numerics == "fixed" and rng.random() < 0.5:
            c.cal, c.note = data, f"calibration {how}"
            used = _rows_of(data)        # the oracle's rows are the ones calibrated on
            if used is not None and used.shape[1:] == cal.shape[1:] and len(used):
                c.clean = used
        else:
            c.rows, c.note = data, f"input {how}"
    c.note = f"{'bundled ' + bundled if bundled else 'fresh'} {numerics}: {c.note}"
    return c


def _rows_of(data: bytes) -> np.ndarray | None:
    """The float32 rows an .npy holds, if it holds a 2-D array of numbers."""
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception:
        return None
    if a.ndim != 2 or not (np.issubdtype(a.dtype, np.floating) or
                           np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
        return None
    with np.errstate(all="ignore"):
        return a.astype(np.float32)


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                    if p.is_file() else "dir")
            for p in sorted(d.rglob("*"))} if d.exists() else {}


def _cli_outcome(r: subprocess.CompletedProcess) -> str | None:
    """None when the command succeeded, 'refused' for a clean refusal,
    else the defect."""
    text = r.stdout + r.stderr
    if "Traceback" in text:
        return "traceback"
    if r.returncode < 0 or r.returncode > 2:
        return "crash"
    if r.returncode == 2:
        return "internal error"
    if r.returncode == 0:
        return None
    lines = r.stderr.strip("\n").split("\n")
    if len(lines) != 1 or not lines[0].startswith("kmlc: error: ") or r.stdout.strip():
        return "multi-line"
    if "a kmlc bug" in lines[0]:
        return "accepted, C fails"
    return "refused"


def _kmlc(args, cwd, timeout=TIMEOUT):
    return subprocess.run([str(KMLC), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, errors="replace",
                          env=dict(os.environ, KMLC_DEBUG=""))


def run_case(seed: int, index: int, work: Path, baseline: Path, kernel_every: int = 0) -> dict:
    c = make_case(seed, index)
    d = work / f"case{index}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    res = {"index": index, "cls": c.cls, "note": c.note, "outcome": "", "detail": ""}
    model = d / f"{c.stem}.onnx"
    model.write_bytes(c.model)
    out = d / "out"
    shutil.copytree(baseline, out, symlinks=True)
    args = ["compile", model.name, "-o", "out", "--target", "user"]
    if c.numerics == "fixed":
        (d / "cal.npy").write_bytes(c.cal)
        args += ["--numerics", "fixed", "--calibration", "cal.npy"]
    before, entries = _tree(out), sorted(p.name for p in d.iterdir())
    if c.name_opt is not None:
        args += ["--name", c.name_opt]
    try:
        r = _kmlc(args, d)
    except subprocess.TimeoutExpired:
        return dict(res, outcome="hang", detail="kmlc compile " + " ".join(args[1:]))
    outcome = _cli_outcome(r)
    res["detail"] = (r.stderr.strip() or r.stdout.strip())[:2000]
    if outcome == "refused":
        now = sorted(p.name for p in d.iterdir())
        touched = _tree(out) != before or now != entries
        return dict(res, outcome="outdir touched" if touched else "refused")
    if outcome is not None:
        return dict(res, outcome=outcome)
    try:
        return dict(res, **check_accepted(c, d, out, kernel_every and index % kernel_every == 0))
    except subprocess.TimeoutExpired as e:
        return dict(res, outcome="hang", detail=str(e.cmd))


def check_accepted(c: Case, d: Path, out: Path, kernel: bool) -> dict:
    meta = json.loads((out / "kmlc.json").read_text())
    if c.clean.shape[1] != meta["in_elems"]:   # a batch or dimension the case changed
        reps = -(-meta["in_elems"] // c.clean.shape[1])
        c.clean = np.tile(c.clean, reps)[:, :meta["in_elems"]]
    (d / "rows.npy").write_bytes(c.rows)
    r = _kmlc(["run", "out", "--input", "rows.npy", "--output", "y.npy"], d)
    bad = _cli_outcome(r)
    if bad not in (None, "refused"):
        return {"outcome": bad, "detail": "kmlc run: " + r.stderr.strip()[:2000]}
    np.save(d / "clean.npy", c.clean)
    r = _kmlc(["run", "out", "--input", "clean.npy", "--output", "yc.npy"], d)
    if r.returncode != 0:
        bad = _cli_outcome(r)
        return {"outcome": "run fails" if bad == "refused" else bad,
                "detail": "kmlc run on clean rows: " + r.stderr.strip()[:2000]}
    y = np.load(d / "yc.npy")
    wrong = oracle(c.model, meta, c.clean, y)
    if wrong:
        return {"outcome": "accepted, wrong", "detail": wrong}
    san = sanitized(out, meta, c.clean, y, d)
    if san:
        return {"outcome": "sanitizer", "detail": san}
    if kernel:
        r = _kmlc(["compile", c.stem + ".onnx", "-o", "kout", "--target", "kernel"] +
                  (["--numerics", "fixed", "--calibration", "cal.npy"]
                   if c.numerics == "fixed" else []) +
                  (["--name", c.name_opt] if c.name_opt is not None else []), d)
        r = r if r.returncode else _kmlc(["build", "kout"], d, timeout=600)
        if r.returncode:
            return {"outcome": "accepted, C fails", "detail": "kernel: " + r.stderr[-2000:]}
    return {"outcome": "accepted"}


# ---- oracles --------------------------------------------------------------------

def _ort_with_intermediates(model_bytes: bytes):
    import onnxruntime as ort

    m = onnx.ModelProto.FromString(model_bytes)
    known = {o.name for o in m.graph.output}
    for nd in m.graph.node:
        for o in nd.output:
            if o and o not in known:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                known.add(o)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return m, ort.InferenceSession(m.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])


def _magnitudes(m, vals: dict) -> float:
    """The largest |value| on the row, and |a|.|b| of every dot product."""
    big = max((float(np.nanmax(np.abs(v))) for v in vals.values()
               if np.size(v) and np.issubdtype(np.asarray(v).dtype, np.floating)
               and np.isfinite(v).any()), default=0.0)
    for nd in m.graph.node:
        if nd.op_type in ("MatMul", "Gemm") and all(i in vals for i in nd.input[:2]):
            a, b = (np.abs(np.asarray(vals[i], np.float64)) for i in nd.input[:2])
            at = {x.name: x.i for x in nd.attribute}
            a = a.T if at.get("transA") else a
            b = b.T if at.get("transB") else b
            try:
                with np.errstate(all="ignore"):
                    s = a @ b
                big = max(big, float(np.nanmax(s)) if np.isfinite(s).any() else big)
            except ValueError:
                pass
    return big


def oracle(model_bytes: bytes, meta: dict, x: np.ndarray, y: np.ndarray) -> str:
    """'' when the twin's rows ``y`` are right, else what is wrong."""
    try:
        m, sess = _ort_with_intermediates(model_bytes)
    except Exception as e:  # kmlc accepted what onnxruntime refuses
        return f"onnxruntime refuses the model kmlc compiled: {str(e).splitlines()[0][:300]}"
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    names = [o.name for o in m.graph.output]
    fixed = meta["fixed"]
    for r, row in enumerate(x):
        feed = {p["name"]: row[p["offset"]:p["offset"] + p["elems"]].reshape(p["shape"])
                for p in meta["inputs"]}
        with np.errstate(all="ignore"):
            got = dict(zip(names, sess.run(names, feed)))
        vals = {**inits, **feed, **got}
        big = _magnitudes(m, vals)
        if not big <= FLT_MAX:   # float32 overflowed on the way: the result depends on
            continue             # the order of additions (inf, NaN or finite), not a bug
        for k, p in enumerate(meta["outputs"]):
            ref = np.asarray(got[p["name"]], np.float64).reshape(-1)
            t = y[r, p["offset"]:p["offset"] + p["elems"]].astype(np.float64)
            fo = fixed["outputs"][k] if fixed else {}
            if p["dtype"] == "i64" or fo.get("index"):
                src = next(nd for nd in m.graph.node if p["name"] in nd.output)
                scores = np.asarray(vals[src.input[0]], np.float64).reshape(-1)
                top = np.sort(scores)[-2:]
                gap = top[-1] - top[0] if len(top) == 2 else np.inf
                need = fo.get("gap", 0.0) + 1e-5 * (1 + big)
                if not np.array_equal(ref, t) and gap > need:
                    return f"row {r} output {p['name']!r}: class {t} where onnxruntime {ref} " \
                           f"(top-2 gap {gap:.3g})"
                continue
            tol = 1e-5 + 1e-5 * np.abs(ref) + 1e-5 * big + fo.get("error_bound", 0.0)
            with np.errstate(all="ignore"):
                err = np.abs(t - ref)
            ok = (err <= tol) | (np.isnan(t) & np.isnan(ref)) | (t == ref)
            if not ok.all():
                i = int(np.argmin(ok))
                return f"row {r} output {p['name']!r}[{i}]: twin {t[i]:.9g}, onnxruntime " \
                       f"{ref[i]:.9g}, |err| {err[i]:.3g} > {tol[i]:.3g}"
    return ""


DRIVER = r"""
#include <stdio.h>
#include "%(name)s.h"
typedef %(tin)s in_elem;
typedef %(tout)s out_elem;
int main(int argc, char **argv)
{
	static in_elem in[%(N)s_IN_ELEMS];
	static out_elem out[%(N)s_OUT_ELEMS];
	static unsigned long long ws[%(N)s_WORKSPACE_BYTES / 8 + 1];
	FILE *fi = fopen(argv[1], "rb"), *fo = fopen(argv[2], "wb");

	if (!fi || !fo)
		return 4;
	while (fread(in, sizeof(in), 1, fi) == 1) {
		if (kml_%(name)s_infer(in, out, ws) < 0)
			return 3;
		fwrite(out, sizeof(out), 1, fo);
	}
	fclose(fo);
	return 0;
}
"""


# kmlc.json's element types of in[] and out[]: C and numpy
C_TYPES = {"f32": "float", "i32": "s32", "i64": "s64", "bool": "u8"}
NP_TYPES = {"f32": np.float32, "i32": np.int32, "i64": np.int64, "bool": np.uint8}


def io_types(meta: dict) -> tuple[str, str]:
    fixed = bool(meta["fixed"])
    return (meta.get("in_dtype", "i32" if fixed else "f32"),
            meta.get("out_dtype", "i32" if fixed else "f32"))


def _raw(meta: dict, x: np.ndarray) -> np.ndarray:
    """Twin.encode's rows, from kmlc.json (float32 as is; fixed round(x 2^F);
    integer features as integers)."""
    if meta["inputs"][0].get("onnx_dtype", "f32") != "f32":
        return np.round(x).astype(NP_TYPES[io_types(meta)[0]])
    if not meta["fixed"]:
        return x.astype(np.float32)
    v = x.astype(np.float64) * np.ldexp(1.0, np.array(meta["fixed"]["frac_bits"]))
    v = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return np.clip(v, -2**31, 2**31 - 1).astype(np.int32)


def sanitized(out: Path, meta: dict, x: np.ndarray, y: np.ndarray, d: Path) -> str:
    """The twin's C under ASan and UBSan on clean and extreme rows: no
    report, and the clean rows' raw outputs as `kmlc run` gave them."""
    from kmlc.targets.buildcache import compile_twin
    from kmlc.targets.user import sources

    name, fixed = meta["name"], bool(meta["fixed"])
    tin, tout = io_types(meta)
    (d / "drv.c").write_text(DRIVER % {"name": name, "N": f"KML_{name.upper()}",
                                       "tin": C_TYPES[tin], "tout": C_TYPES[tout]})
    exe = d / "drv"
    # paths relative to the case's directory, so that a case built before
    # (the same seed) is taken from kmlc's twin cache (compiler/targets/buildcache.py)
    rel = out.relative_to(d) / "user"
    srcs = [str(rel / s) for s in sources(out / "user", name) if not s.endswith("_twin.c")]
    rc, err = compile_twin(["gcc", "-std=gnu11", "-O1", "-g", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=all", "-ffp-contract=off", f"-I{rel}", "-o",
                            "drv", "drv.c", *srcs], d,
                           lambda c: subprocess.run(c, cwd=d, capture_output=True, text=True,
                                                    timeout=TIMEOUT))
    if rc:
        return "sanitizer build fails: " + err[-1500:]
    raw = _raw(meta, x)
    n = raw.shape[1]
    if raw.dtype.kind in "iu":
        info = np.iinfo(raw.dtype)
        ext = np.array([info.min, info.max, 0, 1], np.int64)
        extreme = np.stack([np.full(n, v) for v in ext]).astype(raw.dtype)
    else:
        ext = [np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, 0.0]
        extreme = np.stack([np.full(n, v) for v in ext]).astype(np.float32)
    rows = np.concatenate([raw, extreme])
    rows.tofile(d / "in.bin")
    r = subprocess.run([str(exe), str(d / "in.bin"), str(d / "out.bin")], capture_output=True,
                       text=True, timeout=TIMEOUT, env=dict(os.environ, ASAN_OPTIONS=
                                                            "detect_leaks=0"))
    if r.returncode or "runtime error" in r.stderr or "Sanitizer" in r.stderr:
        return f"exit {r.returncode}: " + r.stderr[-1500:]
    got = np.fromfile(d / "out.bin", dtype=NP_TYPES[tout])
    got = got.reshape(len(rows), -1)[:len(raw)]
    if tout not in ("f32", "i32") or (tout == "i32" and not fixed):
        if not np.array_equal(got, np.asarray(y).reshape(got.shape).astype(got.dtype)):
            return "sanitized build's integer outputs differ from the twin's"
    elif fixed:
        ref_raw = _encode_out(meta, y)
        if not np.array_equal(got, ref_raw):
            return "sanitized build's raw outputs differ from the twin's"
    elif not np.array_equal(got.view(np.uint32), y.astype(np.float32).view(np.uint32)):
        if not np.array_equal(np.isnan(got), np.isnan(y)) or \
                not np.array_equal(got[~np.isnan(got)], y[~np.isnan(y)]):
            return "sanitized build's outputs differ from the twin's"
    return ""


def _encode_out(meta: dict, y: np.ndarray) -> np.ndarray:
    """Back from `kmlc run`'s decoded rows to the raw int32 outputs."""
    cols = []
    for o, p in zip(meta["fixed"]["outputs"], meta["outputs"]):
        v = y[:, p["offset"]:p["offset"] + p["elems"]].astype(np.float64)
        cols.append(v if "scale" not in o else np.round(v / o["scale"] + o["zp"]))
    return np.concatenate(cols, axis=1).astype(np.int32)


# ---- campaigns ------------------------------------------------------------------

def make_baseline(work: Path) -> Path:
    """A kmlc OUTDIR each case's compile must replace or leave alone."""
    base = work / "baseline"
    if not (base / "kmlc.json").is_file():
        m = fresh_model(np.random.default_rng(0))
        onnx.save(m, work / "baseline.onnx")
        r = _kmlc(["compile", "baseline.onnx", "-o", "baseline", "--target", "user"], work)
        if r.returncode:
            raise SystemExit("kmlfuzz: cannot compile the baseline model: " + r.stderr)
    return base


def campaign(seed: int, cases: list[int], work: Path, jobs: int, budget: float,
             kernel_every: int = 0, keep: bool = False, progress=None) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    base = make_baseline(work)
    deadline = time.monotonic() + budget
    results = []
    with ProcessPoolExecutor(jobs) as pool:
        pending = {}
        it = iter(cases)
        for i in it:
            pending[pool.submit(_one, seed, i, work, base, kernel_every, keep)] = i
            if len(pending) >= jobs * 2:
                break
        while pending:
            done = next(as_completed(pending))
            pending.pop(done)
            res = done.result()
            results.append(res)
            if progress:
                progress(res, len(results))
            if time.monotonic() < deadline:
                nxt = next(it, None)
                if nxt is not None:
                    pending[pool.submit(_one, seed, nxt, work, base, kernel_every, keep)] = nxt
    return sorted(results, key=lambda r: r["index"])


def _one(seed, index, work, base, kernel_every, keep):
    try:
        res = run_case(seed, index, work, base, kernel_every)
    except Exception as e:  # a fuzzer bug is reported, never hidden
        res = {"index": index, "cls": CLASSES[index % 6], "note": "", "outcome": "fuzzer error",
               "detail": f"{type(e).__name__}: {e}"}
    if not keep and res["outcome"] in ("refused", "accepted"):
        shutil.rmtree(work / f"case{index}", ignore_errors=True)
    return res


def table(results: list[dict]) -> str:
    cols = ["cases", "refused", "accepted"] + list(DEFECTS) + ["fuzzer error"]
    short = {"internal error": "internal", "outdir touched": "outdir", "accepted, C fails":
             "C fails", "accepted, wrong": "wrong", "fuzzer error": "fuzzer"}
    head = ["class"] + [short.get(c, c) for c in cols]
    counts = defaultdict(Counter)
    for r in results:
        counts[r["cls"]][r["outcome"]] += 1
        counts["all"][r["outcome"]] += 1
    rows = [head]
    for cls in list(CLASSES) + ["all"]:
        c = counts[cls]
        rows.append([cls, str(sum(c.values()))] + [str(c[k]) for k in cols[1:]])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.rjust(w[i]) for i, v in enumerate(r)) for r in rows)


def defects(results: list[dict]) -> list[dict]:
    return [r for r in results if r["outcome"] not in ("refused", "accepted")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--only", type=int, nargs="*", help="Run just these case numbers.")
    ap.add_argument("--budget", type=float, default=3600, help="Seconds; no new case after.")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--kernel-every", type=int, default=0,
                    help="Also build the kernel module (W=1) of every Nth accepted case.")
    ap.add_argument("--work", type=Path, help="Work directory (default: a temporary one).")
    ap.add_argument("--keep", action="store_true", help="Keep every case's directory.")
    ap.add_argument("--json", type=Path, help="Write every case's result here.")
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="kmlfuzz-"))
    cases = a.only if a.only else list(range(a.start, a.start + a.cases))
    t0 = time.monotonic()

    def progress(res, n):
        if res["outcome"] not in ("refused", "accepted"):
            print(f"  case {res['index']} [{res['cls']}] {res['outcome']}: {res['note']}\n"
                  f"    {res['detail'][:400]}", flush=True)
        if n % 100 == 0:
            print(f"  {n} cases, {time.monotonic() - t0:.0f} s", flush=True)

    results = campaign(a.seed, cases, work, a.jobs, a.budget, a.kernel_every, a.keep, progress)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    print(f"\nkmlfuzz: seed {a.seed}, {len(results)} cases in {time.monotonic() - t0:.0f} s "
          f"({a.jobs} jobs), work directory {work}")
    print(table(results))
    bad = defects(results)
    print(f"{len(bad)} defect(s)" + (": rerun one with --only N --keep" if bad else ""))
    if not a.work and not a.keep and not bad:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
