"""ONNX frontend: an ONNX model (file or ModelProto) to kmlc graph IR.

What it guarantees about the graph it returns:
  * every value has a static type; a symbolic (or absent) leading dimension
    of a graph input is bound to 1, which means one sample per call;
  * the shapes agree with ONNX's own shape inference wherever ONNX knows
    them (a disagreement is a kmlc bug and is reported as one);
  * shape computations (Shape, Gather, Concat, ... on constants) have been
    evaluated, so no op in the graph works on shapes;
  * every op is one of ``kmlc.ops``; ONNX nodes carry over their names as
    the ops' ``origin``.

Every problem with the model raises ``KmlcError`` naming the file and the
node or tensor: unreadable or truncated files, missing external data,
invalid models, opsets outside 13..newest, unsupported ops or types, and
dynamic dimensions other than the batch.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..errors import KmlcError, node_ref
from ..ir import BOOL, F32, I32, I64, Graph, IRError, Op, TensorType, Value, c_identifier, const, \
    fresh_namer, verify
from ..ops import broadcast_shape, evaluate, infer_types
from . import onnx_ml

MIN_OPSET = 13

# ONNX ops kmlc compiles to kernels.
SUPPORTED = ("Abs", "Add", "And", "ArgMax", "BatchNormalization", "Cast", "CastLike", "Ceil",
             "Clip", "Concat", "Div", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor",
             "Gather", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "HardSigmoid", "Identity",
             "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
             "MatMul", "Max", "Mean", "Min", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal",
             "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
             "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu",
             "Reshape", "Round", "Sigmoid", "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
             "Tanh", "Transpose", "Unsqueeze", "Where")
# Element types of runtime tensors: ONNX's name -> kmlc's.
ELEM_TYPES = {1: F32, 6: I32, 7: I64, 9: BOOL}   # FLOAT, INT32, INT64, BOOL
_ONNX_NAMES = {F32: "float32", I32: "int32", I64: "int64", BOOL: "bool"}
# ONNX ops evaluated while importing when their inputs are known, because
# shapes depend on them (Concat, Gather, Slice, Split, Squeeze and Unsqueeze
# of runtime data are IR ops).
STATIC = ("Concat", "Constant", "ConstantOfShape", "Gather", "Shape", "Size", "Slice", "Split",
          "Squeeze", "Unsqueeze")
RUNTIME_STATIC = ("Concat", "Gather", "Slice", "Split", "Squeeze", "Unsqueeze", "Cast")
REDUCE = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min",
          "ReduceProd": "prod", "ReduceL1": "sum", "ReduceL2": "sum", "ReduceSumSquare": "sum",
          "ReduceLogSum": "sum", "ReduceLogSumExp": "sum"}

_SIMPLE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Relu": "relu",
           "Sigmoid": "sigmoid", "Tanh": "tanh", "MatMul": "matmul", "Where": "where",
           "Not": "not", "And": "and", "Or": "or", "Floor": "floor", "Ceil": "ceil",
           "Round": "round", "Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log",
           "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Erf": "erf"}
_COMPARE = {"Greater": "gt", "GreaterOrEqual": "ge", "Less": "lt", "LessOrEqual": "le",
            "Equal": "eq"}


def supported_ops_text() -> str:
    return (", ".join(SUPPORTED) + "; and, on constant inputs only, "
            + ", ".join(sorted(set(STATIC) - set(SUPPORTED))))


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------

def _load_proto(path: Path):
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise KmlcError("no such file", where=str(path))
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise KmlcError(f"not a readable ONNX model (truncated or corrupt protobuf: {e})",
                        where=str(path)) from None
    if not model.HasField("graph") or not model.graph.node:
        raise KmlcError("not a readable ONNX model (no graph; truncated or not ONNX)",
                        where=str(path))
    _load_external_data(model, path)
    return model


def _load_external_data(model, path: Path) -> None:
    from onnx import external_data_helper as edh

    base = path.parent
    for t in edh._get_all_tensors(model):
        if not edh.uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if (not loc or os.path.isabs(loc) or ".." in Path(loc).parts
                or not loc.isprintable()):
            raise KmlcError(f"initializer '{t.name}' has an unsafe external data location "
                            f"{loc!r}", where=str(path))
        target = (base / loc).resolve()
        for key in ("offset", "length"):
            if key in info and not re.fullmatch(r"[0-9]{1,18}", info[key]):
                raise KmlcError(f"initializer '{t.name}' has external data {key} "
                                f"{info[key]!r}, not a decimal byte count", where=str(path))
        if not target.is_file():
            raise KmlcError(f"external data file '{loc}' for initializer '{t.name}' not found "
                            f"next to the model", where=str(path))
        offset, length = int(info.get("offset", 0)), info.get("length")
        size = target.stat().st_size
        if offset > size or (length is not None and offset + int(length) > size):
            raise KmlcError(f"external data file '{loc}' is too short for initializer "
                            f"'{t.name}'", where=str(path))
    try:
        edh.load_external_data_for_model(model, str(base))
    except Exception as e:  # onnx raises assorted types here
        raise KmlcError(f"cannot load external data: {e}", where=str(path)) from None


def load(source, *, name: str | None = None) -> Graph:
    """Load an ONNX model from a path or a ``ModelProto`` and import it."""
    import onnx

    if isinstance(source, onnx.ModelProto):
        model, where = source, name or "<model>"
        stem = name or model.graph.name or "model"
    else:
        path = Path(source)
        model, where, stem = _load_proto(path), str(path), path.stem
    return Importer(model, where).run(c_identifier(name or stem, "model").lower())


# --------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------

class Importer:
    def __init__(self, model, where: str):
        self.model = model
        self.where = where

    def fail(self, msg: str, node=None):
        raise KmlcError(f"{node_ref(node.op_type, self.node_name(node))}: {msg}" if node else msg,
                        where=self.where)

    def node_name(self, node) -> str:
        return node.name or f"{node.op_type}_{self.node_index[id(node)]}"

    # -- model-level checks ---------------------------------------------------

    def check_model(self):
        import onnx

        m = self.model
        opset = None
        for imp in m.opset_import:
            if imp.domain in ("", "ai.onnx"):
                opset = imp.version
        newest = onnx.defs.onnx_opset_version()
        if opset is None and self.nodes and all(n.domain == onnx_ml.DOMAIN for n in self.nodes):
            opset = newest          # ONNX-ML nodes only: no default-domain op to read
        if opset is None:
            self.fail("model imports no default-domain (ai.onnx) opset")
        if not MIN_OPSET <= opset <= newest:
            self.fail(f"opset {opset} is not supported: kmlc reads opsets {MIN_OPSET}..{newest}"
                      + (" (convert with onnx.version_converter)" if opset < MIN_OPSET else ""))
        self.opset = opset
        if not m.graph.output:
            self.fail("the graph has no outputs; there is nothing to compute")
        known = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
        for what, vis in (("output", m.graph.output), ("value_info entry", m.graph.value_info)):
            for vi in vis:   # onnxruntime refuses either as an invalid tensor type
                t = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None
                if t == 0:
                    self.fail(f"{what} '{vi.name}' has no element type (elem_type 0, UNDEFINED)")
                if t is not None and t not in known:
                    self.fail(f"{what} '{vi.name}' has element type {_type_name(t)}")
        seen = {}
        for node in self.nodes:
            if node.name and seen.setdefault(node.name, node) is not node:
                self.fail(f"two nodes are named '{node.name}'; ONNX node names are unique "
                          "(onnxruntime refuses this model too)", node)
        defined = {i.name for i in m.graph.input} | {i.name for i in m.graph.initializer}
        for node in self.nodes:
            for name in node.input:
                if name and name not in defined:
                    self.fail(f"input '{name}' is not a graph input, an initializer or an "
                              "earlier node's output (a missing initializer?)", node)
            defined.update(node.output)
        try:
            onnx.checker.check_model(m)
        except UnicodeDecodeError:
            self.fail("a name or op type is not valid UTF-8 (ONNX strings are UTF-8)")
        except onnx.checker.ValidationError as e:
            self.fail(f"invalid ONNX model: {' '.join(str(e).split()) or 'checker failed'}")

    def bind_inputs(self):
        """Graph inputs with the batch dimension bound; returns {name: TensorType}."""
        inits = {i.name for i in self.model.graph.initializer}
        bound = {}
        for vi in self.model.graph.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                self.fail(f"input '{vi.name}' is not a tensor")
            if tt.elem_type not in ELEM_TYPES:
                self.fail(f"input '{vi.name}' has element type "
                          f"{_type_name(tt.elem_type)}; "
                          "kmlc models take float32, int32, int64 or bool inputs")
            if not tt.HasField("shape"):
                self.fail(f"input '{vi.name}' has no shape; give it a static shape "
                          "(a symbolic leading batch dimension is allowed)")
            dims = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(d.dim_value)
                elif d.HasField("dim_value"):
                    self.fail(f"input '{vi.name}' has dimension {i} of size {d.dim_value}")
                elif i == 0:
                    dims.append(1)  # symbolic batch: one sample per call
                else:
                    label = f" ('{d.dim_param}')" if d.dim_param else ""
                    self.fail(f"input '{vi.name}' has a dynamic dimension {i}{label}; only a "
                              "leading batch dimension may be symbolic")
            bound[vi.name] = TensorType(ELEM_TYPES[tt.elem_type], tuple(dims))
        if not bound:
            self.fail("model has no runtime inputs")
        return bound

    def onnx_shapes(self, bound):
        """Run ONNX shape inference on a copy with the batch bound."""
        import onnx

        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        for vi in m.graph.input:
            if vi.name in bound:
                for d, n in zip(vi.type.tensor_type.shape.dim, bound[vi.name].shape):
                    d.Clear()
                    d.dim_value = n
        try:
            m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True,
                                                   data_prop=True)
        except Exception as e:  # InferenceError, ValidationError
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.fail(f"ONNX shape inference failed: {first}")
        shapes = {}
        for vi in list(m.graph.value_info) + list(m.graph.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shapes[vi.name] = tuple(d.dim_value for d in dims)
        return shapes

    # -- the walk -----------------------------------------------------------------

    def run(self, name: str) -> Graph:
        from onnx import numpy_helper

        g = self.model.graph
        self.nodes = list(g.node)  # stable objects: node_name() keys on them
        self.node_index = {id(n): i for i, n in enumerate(self.nodes)}
        self.check_model()
        bound = self.bind_inputs()
        onnx_shapes = self.onnx_shapes(bound)

        self.fresh = fresh_namer()
        self.env: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}
        self.producer: dict[Value, Op] = {}
        self.steps = 0          # intermediates of nodes written as several ops
        self.ops: list[Op] = []
        inputs = []
        for vi in g.input:
            if vi.name in bound:
                v = Value(self.fresh(c_identifier(vi.name, "in")), bound[vi.name])
                self.env[vi.name] = v
                inputs.append(v)
        for init in g.initializer:
            if init.name in bound:
                continue
            try:
                arr = numpy_helper.to_array(init)
            except Exception as e:
                self.fail(f"initializer '{init.name}' cannot be read: {e}")
            self.constant(init.name, arr)

        for node in self.nodes:
            self.convert(node)

        outputs = []
        for vi in g.output:
            if vi.name not in self.env:
                self.fail(f"graph output '{vi.name}' is not produced by any node")
            v = self.env[vi.name]
            if v.type.dtype not in ELEM_TYPES.values():
                self.fail(f"output '{vi.name}' has type {v.type.dtype}; kmlc outputs float32, "
                          "int32, int64 or bool")
            outputs.append(v)

        graph = Graph(name, inputs, outputs, self.ops)
        graph.source_names = {v: vi.name for v, vi in zip(inputs, [i for i in g.input
                                                                     if i.name in bound])}
        for v, vi in zip(outputs, g.output):
            graph.source_names.setdefault(v, vi.name)
        for onnx_name, v in self.env.items():
            want = onnx_shapes.get(onnx_name)
            if want is not None and not v.is_const and want != v.type.shape:
                raise IRError(f"kmlc infers {v.type} for '{onnx_name}' but ONNX shape inference "
                              f"gives {list(want)}")
        return verify(graph)

    def constant(self, onnx_name: str, arr: np.ndarray) -> None:
        """Record a compile-time tensor; it becomes an IR constant if it can be one."""
        arr = np.asarray(arr)
        if arr.dtype == np.float32 and not np.all(np.isfinite(arr)):
            self.fail(f"tensor '{onnx_name}' holds non-finite values")
        typed = arr if arr.dtype in (np.float32, np.int32, np.int64, np.bool_) else None
        if arr.dtype.kind in "iub":
            arr = arr.astype(np.int64)      # shape arithmetic works in int64
        self.known[onnx_name] = arr
        if typed is not None and arr.size:
            self.env[onnx_name] = const(self.fresh(c_identifier(onnx_name, "c")), typed)

    def get(self, node, i: int) -> Value | None:
        if i >= len(node.input) or node.input[i] == "":
            return None
        name = node.input[i]
        if name in self.env:
            return self.env[name]
        if name in self.known:
            self.fail(f"operand '{name}' is a {self.known[name].dtype} tensor of shape "
                      f"{list(self.known[name].shape)}; kmlc computes on non-empty float32, "
                      "int32, int64 and bool tensors only", node)
        self.fail(f"input '{name}' is not a graph input, an initializer or an earlier "
                  "node's output", node)

    def emit(self, node, kind: str, inputs: list[Value], attrs: dict | None = None,
             out: str | None = None) -> None:
        """One IR op for ``node``, its result bound to the node's output (or
        to ``out``, an intermediate of a node that becomes several ops)."""
        attrs = attrs or {}
        try:
            types = infer_types(kind, [v.type for v in inputs], attrs)
        except ValueError as e:
            if "is not f32" in str(e):       # an integer operand of a float op
                i, v = next((i, v) for i, v in enumerate(inputs) if v.type.dtype != F32)
                self.fail(f"operand '{node.input[i]}' has element type "
                          f"{_ONNX_NAMES.get(v.type.dtype, v.type.dtype)}; {node.op_type} "
                          "computes on float32 only (Cast it to float first)", node)
            self.fail(str(e), node)
        name = out or node.output[0]
        outs = [Value(self.fresh(c_identifier(name, "t")), t) for t in types]
        op = Op(kind, list(inputs), outs, attrs, (f"{self.node_name(node)} ({node.op_type})",))
        self.ops.append(op)
        self.producer[outs[0]] = op
        self.env[name] = outs[0]

    def attrs(self, node) -> dict:
        from onnx import helper

        out = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for k, v in out.items():
            vals = v if isinstance(v, (list, tuple)) else [v]
            if any(isinstance(x, float) and not np.isfinite(x) for x in vals):
                self.fail(f"attribute {k} = {v}: kmlc needs finite attributes", node)
        return out

    def value_of(self, name: str) -> np.ndarray | None:
        """A tensor's value if it is known at compile time: a constant, or an
        IR op's result computed from constants only (evaluated here so that
        shape computations can use it; the op itself stays for the
        fold-constants pass)."""
        if not name:
            return None
        if name in self.known:
            return self.known[name]
        v = self.env.get(name)
        return None if v is None else self._evaluate(v)

    def _evaluate(self, v: Value) -> np.ndarray | None:
        if v.is_const:
            return v.data
        op = self.producer.get(v)
        if op is None:
            return None
        ins = [self._evaluate(i) for i in op.inputs]
        return None if any(i is None for i in ins) else evaluate(op.kind, ins, op.attrs)[0]

    def convert(self, node) -> None:
        if node.domain == onnx_ml.DOMAIN:
            onnx_ml.convert(self, node)
            return
        if node.domain not in ("", "ai.onnx"):
            self.fail(f"op domain '{node.domain}' is not supported; kmlc supports the default "
                      f"ONNX domain ({supported_ops_text()}) and {onnx_ml.DOMAIN} "
                      f"({', '.join(onnx_ml.SUPPORTED)})", node)
        op = node.op_type
        if op not in SUPPORTED and op not in STATIC:
            self.fail(f"kmlc cannot compile {op}; supported ops: {supported_ops_text()}", node)
        known = [n in self.known for n in node.input if n]
        if op in STATIC or (known and all(known) and any(
                self.known[n].dtype != np.float32 for n in node.input if n)):
            # Shape arithmetic (or integer math on it): evaluate now.
            if self.evaluate_now(node):
                return
        a = self.attrs(node)
        # empty constants (no axes, no split sizes) are attributes' stand-ins
        ins = [None if node.input[i] in self.known and self.known[node.input[i]].size == 0
               else self.get(node, i) for i in range(len(node.input))]
        x = ins[0] if ins else None
        if op in _SIMPLE:
            self.emit(node, _SIMPLE[op], ins)
        elif op in _COMPARE:
            self.emit(node, "compare", ins, {"cmp": _COMPARE[op]})
        elif op == "Cast":
            to = ELEM_TYPES.get(a.get("to"))
            if to is None:
                self.fail(f"Cast to {_type_name(a.get('to', 0))} of runtime data; kmlc casts "
                          "to float32, int32, int64 and bool", node)
            if to == x.type.dtype:
                self.emit(node, "reshape", [x], {"shape": list(x.type.shape)})
            else:
                self.emit(node, "cast", [x], {"to": to.name})
        elif op == "LeakyRelu":
            self.emit(node, "leaky_relu", [x], {"alpha": float(np.float32(a.get("alpha", 0.01)))})
        elif op == "Clip":
            bounds = []
            for i, default in ((1, -np.finfo(np.float32).max), (2, np.finfo(np.float32).max)):
                name = node.input[i] if i < len(node.input) else ""
                val = self.value_of(name) if name else np.float32(default)
                if val is None or np.asarray(val).size != 1:
                    self.fail("Clip bounds must be constant scalars", node)
                bounds.append(float(np.asarray(val, dtype=np.float32).reshape(())))
            self.emit(node, "clip", [x], {"min": bounds[0], "max": bounds[1]})
        elif op == "Softmax":
            self.emit(node, "softmax", [x], {"axis": int(a.get("axis", -1))})
        elif op == "ArgMax":
            self.emit(node, "argmax", [x], {"axis": int(a.get("axis", 0)),
                                            "keepdims": int(a.get("keepdims", 1)),
                                            "select_last_index": int(a.get("select_last_index", 0))})
        elif op == "Gemm":
            self.emit(node, "gemm", [v for v in ins if v is not None],
                      {"alpha": float(np.float32(a.get("alpha", 1.0))),
                       "beta": float(np.float32(a.get("beta", 1.0))),
                       "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))})
        elif op == "Flatten":
            shape = x.type.shape
            axis = int(a.get("axis", 1))
            if not -len(shape) <= axis <= len(shape):
                self.fail(f"Flatten axis {axis} out of range for rank {len(shape)}", node)
            axis += len(shape) if axis < 0 else 0
            self.emit(node, "reshape", [x], {"shape": [int(np.prod(shape[:axis])),
                                                       int(np.prod(shape[axis:]))]})
        elif op == "Reshape":
            target = self.value_of(node.input[1]) if len(node.input) > 1 else None
            if target is None:
                self.fail("the target shape must be a constant (or computable at compile time)",
                          node)
            self.emit(node, "reshape", [x], {"shape": self.reshape_target(
                node, x.type.shape, target.reshape(-1).tolist(), int(a.get("allowzero", 0)))})
        elif op == "Identity":
            self.emit(node, "reshape", [x], {"shape": list(x.type.shape)})
        else:
            self.convert_more(node, op, a, ins)

    # -- ops written as several IR ops, and data movement ------------------------

    def step(self, node, kind: str, ins: list, attrs: dict | None = None,
             last: bool = False) -> Value:
        """One IR op of a node that becomes several; the last one binds the
        node's output."""
        self.steps += 1
        name = node.output[0] if last else f"{node.output[0]}#{self.steps}"
        self.emit(node, kind, ins, attrs, out=name)
        return self.env[name]

    def scalar(self, value: float) -> Value:
        return const(self.fresh("c"), np.asarray(value, np.float32).reshape(()))

    def known_ints(self, node, i: int, what: str) -> list[int] | None:
        """Operand i's value as integers (axes, sizes, shapes): None when
        absent; it must be known at compile time."""
        if i >= len(node.input) or not node.input[i]:
            return None
        val = self.value_of(node.input[i])
        if val is None:
            self.fail(f"the {what} must be known at compile time", node)
        return [int(x) for x in np.asarray(val).reshape(-1)]

    def convert_more(self, node, op: str, a: dict, ins: list) -> None:
        x = ins[0] if ins else None
        rank = len(x.type.shape) if x is not None else 0
        if op == "Transpose":
            perm = list(a.get("perm", range(rank)[::-1]))
            self.emit(node, "transpose", [x], {"perm": perm})
        elif op == "Concat":
            self.emit(node, "concat", [v for v in ins if v is not None],
                      {"axis": int(a["axis"])})
        elif op == "Slice":
            self.slice(node, x, self.known_ints(node, 1, "starts"),
                       self.known_ints(node, 2, "ends"), self.known_ints(node, 3, "axes"),
                       self.known_ints(node, 4, "steps"))
        elif op == "Split":
            axis = int(a.get("axis", 0)) % rank
            split = self.known_ints(node, 1, "split")
            try:
                sizes = split_sizes(x.type.shape[axis], split,
                                    int(a.get("num_outputs", len(node.output))))
            except KmlcError as e:
                self.fail(str(e), node)
            at = 0
            for name, size in zip(node.output, sizes):
                starts, ends = [0] * rank, list(x.type.shape)
                starts[axis], ends[axis] = at, at + size
                at += size
                self.slice(node, x, starts, ends, None, None, out=name)
        elif op in ("Squeeze", "Unsqueeze"):
            axes = self.known_ints(node, 1, "axes") if len(node.input) > 1 else a.get("axes")
            shape = list(x.type.shape)
            if op == "Squeeze":
                axes = [i % rank for i in axes] if axes else [i for i, n in enumerate(shape)
                                                               if n == 1]
                if any(shape[i] != 1 for i in axes):
                    self.fail(f"cannot squeeze axes {axes} of shape {shape}", node)
                shape = [n for i, n in enumerate(shape) if i not in axes]
            else:
                out = rank + len(axes)
                for i in sorted(ax % out for ax in axes):
                    shape.insert(i, 1)
            self.emit(node, "reshape", [x], {"shape": shape})
        elif op == "Gather":
            self.emit(node, "gather", ins[:2], {"axis": int(a.get("axis", 0))})
        elif op == "Expand":
            target = self.known_ints(node, 1, "shape")
            try:
                shape = broadcast_shape(x.type.shape, tuple(target))
            except ValueError as e:
                self.fail(str(e), node)
            self.emit(node, "expand" if shape != x.type.shape else "reshape", [x],
                      {"shape": list(shape)})
        elif op == "CastLike":
            to = ins[1].type.dtype
            self.emit(node, "reshape" if to == x.type.dtype else "cast", [x],
                      {"shape": list(x.type.shape)} if to == x.type.dtype else {"to": to.name})
        elif op in ("Sum", "Mean", "Max", "Min"):
            # variadic: a chain of binary ops, left to right, as onnxruntime
            # folds them; Mean then divides by the count
            kind = {"Sum": "add", "Mean": "add", "Max": "max", "Min": "min"}[op]
            acc = x
            for i, v in enumerate(ins[1:], 1):
                acc = self.step(node, kind, [acc, v], last=op != "Mean" and i == len(ins) - 1)
            if op == "Mean" and len(ins) > 1:
                self.step(node, "div", [acc, self.scalar(len(ins))], last=True)
            elif len(ins) == 1:
                self.emit(node, "reshape", [x], {"shape": list(x.type.shape)})
        elif op == "Pow":
            self.power(node, x)
        elif op == "HardSigmoid":       # max(0, min(1, alpha * x + beta))
            y = self.step(node, "add", [self.step(node, "mul", [
                x, self.scalar(a.get("alpha", 0.2))]), self.scalar(a.get("beta", 0.5))])
            self.step(node, "clip", [y], {"min": 0.0, "max": 1.0}, last=True)
        elif op == "LogSoftmax":        # (x - m) - log(sum(exp(x - m))), m the maximum
            red = {"axes": [int(a.get("axis", -1)) % rank], "keepdims": 1}
            d = self.step(node, "sub", [x, self.step(node, "reduce", [x], {**red, "fn": "max"})])
            s = self.step(node, "reduce", [self.step(node, "exp", [d])], {**red, "fn": "sum"})
            self.step(node, "sub", [d, self.step(node, "log", [s])], last=True)
        elif op in REDUCE:
            self.reduction(node, op, a, x)
        elif op == "BatchNormalization":
            self.batch_norm(node, a, ins)
        elif op == "LayerNormalization":
            self.layer_norm(node, a, ins)
        elif op == "Gelu":
            half = self.step(node, "mul", [x, self.scalar(0.5)])
            if a.get("approximate", b"none") in (b"tanh", "tanh"):
                cube = self.step(node, "mul", [self.step(node, "mul", [x, x]), x])
                inner = self.step(node, "add", [x, self.step(node, "mul", [
                    cube, self.scalar(0.044715)])])
                t = self.step(node, "tanh", [self.step(node, "mul", [
                    inner, self.scalar(np.sqrt(2 / np.pi))])])
            else:
                t = self.step(node, "erf", [self.step(node, "mul", [
                    x, self.scalar(np.sqrt(0.5))])])
            self.step(node, "mul", [half, self.step(node, "add", [t, self.scalar(1.0)])],
                      last=True)
        else:
            raise AssertionError(op)

    def slice(self, node, x, starts, ends, axes, steps, out=None):
        """ONNX Slice, its indices clamped as ONNX says, as a slice op with
        every axis's start, step and length."""
        shape = list(x.type.shape)
        rank = len(shape)
        axes = axes if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            self.fail("starts, ends, axes and steps differ in length", node)
        st, sp, ln = [0] * rank, [1] * rank, list(shape)
        for s0, e0, ax, step in zip(starts, ends, axes, steps):
            if not -rank <= ax < rank or step == 0:
                self.fail(f"slice axis {ax} or step {step} is invalid", node)
            ax %= rank
            n = shape[ax]
            s0, e0 = s0 + n if s0 < 0 else s0, e0 + n if e0 < 0 else e0
            if step > 0:
                s0, e0 = min(max(s0, 0), n), min(max(e0, 0), n)
                count = max(0, -(-(e0 - s0) // step))
            else:
                s0, e0 = min(max(s0, 0), n - 1), min(max(e0, -1), n - 1)
                count = max(0, -(-(s0 - e0) // -step))
            if count == 0:
                self.fail(f"the slice of axis {ax} is empty; kmlc computes on non-empty tensors",
                          node)
            st[ax], sp[ax], ln[ax] = s0, step, count
        if ln == shape and all(s == 1 for s in sp):
            self.emit(node, "reshape", [x], {"shape": shape}, out=out)
        else:
            self.emit(node, "slice", [x], {"starts": st, "steps": sp, "shape": ln}, out=out)

    def power(self, node, x):
        """Pow by a constant: products for integers up to 16 in magnitude
        (x * x * ... left to right, then a reciprocal for negative ones),
        sqrt for halves, exp(e * log(x)) otherwise (NaN for x < 0, as pow);
        each a pow's special values (C99 F.9.4.4) where the cases meet them."""
        e = self.value_of(node.input[1])
        if e is None:
            self.fail("the exponent must be a constant (kmlc computes Pow by a constant)", node)
        if x.type.dtype != F32:
            self.fail("Pow computes on float32 only (Cast it to float first)", node)
        e = np.asarray(e).astype(np.float32)
        if x.is_const:      # folded: pow in f64, rounded once
            self.emit(node, "pow", [x, const(self.fresh("exponent"), e)])
            return
        if e.size != 1 and np.all(e == e.reshape(-1)[0]) and e.ndim <= len(x.type.shape):
            e = e.reshape(-1)[:1]
        if e.size != 1:
            self.power_tensor(node, x, e)
            return
        e = float(e.reshape(()))
        if e == 1.0:
            self.emit(node, "reshape", [x], {"shape": list(x.type.shape)})
        elif e in (0.5, -0.5):      # + 0: pow(-0, 1/2) is +0 where sqrt(-0) is -0
            r = self.step(node, "add", [self.step(node, "sqrt", [x]), self.scalar(0.0)],
                          last=e > 0)
            if e < 0:
                self.step(node, "reciprocal", [r], last=True)
        elif e == int(e) and 0 < abs(e) <= 16:
            acc = x
            for i in range(1, int(abs(e))):
                acc = self.step(node, "mul", [acc, x], last=e > 0 and i == abs(e) - 1)
            if e < 0:
                self.step(node, "reciprocal", [acc], last=True)
        elif e == 0.0:      # 1, even for NaN (IEEE pow)
            self.step(node, "expand", [self.scalar(1.0)], {"shape": list(x.type.shape)},
                      last=True)
        elif e == int(e):
            self.fail(f"Pow by {e:g}: kmlc computes integer powers up to 16 in magnitude",
                      node)
        else:
            lg = self.step(node, "log", [x])
            self.step(node, "exp", [self.step(node, "mul", [lg, self.scalar(e)])], last=True)

    def power_tensor(self, node, x, e):
        """Pow by a constant tensor of exponents: exp(e * log(b)), b = |x|
        where e is an integer and x otherwise (so a non-integer power of a
        negative number is NaN), negated where e is odd and x negative, and
        1 where e is 0 (pow(x, 0) is 1 for every x, NaN and 0 included)."""
        whole = e == np.round(e)
        odd = whole & (np.mod(e, 2) == 1)
        ax = self.step(node, "abs", [x])
        b = self.step(node, "where", [const(self.fresh("whole"), whole), ax, x]) \
            if not whole.all() else ax
        y = self.step(node, "exp", [self.step(node, "mul", [
            self.step(node, "log", [b]), const(self.fresh("exponent"), e)])])
        if odd.any():
            neg = self.step(node, "and", [const(self.fresh("odd"), odd), self.step(
                node, "compare", [x, self.scalar(0.0)], {"cmp": "lt"})])
            y = self.step(node, "where", [neg, self.step(node, "neg", [y]), y])
        if (e == 0).any():
            y = self.step(node, "where", [const(self.fresh("zero"), e == 0), self.scalar(1.0), y])
        self.emit(node, "reshape", [y], {"shape": list(y.type.shape)})

    def reduction(self, node, op, a, x):
        rank = len(x.type.shape)
        if len(node.input) > 1 and node.input[1]:
            axes = self.known_ints(node, 1, "axes")
        else:
            axes = a.get("axes")
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                self.emit(node, "reshape", [x], {"shape": list(x.type.shape)})
                return
            axes = list(range(rank))
        if any(not -rank <= ax < rank for ax in axes):
            self.fail(f"axes {axes} out of range for rank {rank}", node)
        axes = sorted({ax % rank for ax in axes})
        keep = int(a.get("keepdims", 1))
        n = int(np.prod([x.type.shape[i] for i in axes]))
        if x.type.dtype != F32 and op not in ("ReduceMax", "ReduceMin"):
            self.fail(f"{op} computes on float32 only (Cast it to float first)", node)
        attrs = {"fn": REDUCE[op], "axes": axes, "keepdims": keep}
        if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
            self.step(node, "reduce", [x], attrs, last=True)
        elif op == "ReduceMean":
            s = self.step(node, "reduce", [x], attrs)
            self.step(node, "div", [s, self.scalar(n)], last=True)
        elif op == "ReduceL1":
            self.step(node, "reduce", [self.step(node, "abs", [x])], attrs, last=True)
        elif op in ("ReduceL2", "ReduceSumSquare"):
            s = self.step(node, "reduce", [self.step(node, "mul", [x, x])], attrs,
                          last=op == "ReduceSumSquare")
            if op == "ReduceL2":
                self.step(node, "sqrt", [s], last=True)
        elif op == "ReduceLogSum":
            self.step(node, "log", [self.step(node, "reduce", [x], attrs)], last=True)
        else:   # ReduceLogSumExp: m + log(sum(exp(x - m))), m the maximum
            m = self.step(node, "reduce", [x], {**attrs, "fn": "max", "keepdims": 1})
            e = self.step(node, "exp", [self.step(node, "sub", [x, m])])
            s = self.step(node, "log", [self.step(node, "reduce", [e], attrs)])
            if not keep:
                m = self.step(node, "reshape", [m], {"shape": list(s.type.shape)})
            self.step(node, "add", [s, m], last=True)

    def batch_norm(self, node, a, ins):
        """Inference BatchNormalization: x * s + (B - mean * s), s = scale /
        sqrt(var + epsilon) per channel (axis 1), computed here in float32;
        in fixed point fold-affine merges it into the adjacent dense layer."""
        if int(a.get("training_mode", 0)) or len(node.output) > 1:
            self.fail("BatchNormalization in training mode (kmlc compiles inference)", node)
        vals = [self.value_of(n) for n in node.input[1:5]]
        if any(v is None for v in vals):
            self.fail("scale, B, mean and var must be constants", node)
        scale, b, mean, var = (np.asarray(v, np.float32) for v in vals)
        x = ins[0]
        if len(x.type.shape) < 2:
            self.fail(f"input of rank {len(x.type.shape)}; BatchNormalization needs N x C x ...",
                      node)
        shape = (-1,) + (1,) * (len(x.type.shape) - 2)
        with np.errstate(all="ignore"):
            s = (scale / np.sqrt(var + np.float32(a.get("epsilon", 1e-5)))).astype(np.float32)
            t = (b - mean * s).astype(np.float32)
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
            self.fail("its constants compute to non-finite values (var + epsilon <= 0?)", node)
        y = self.step(node, "mul", [x, const(self.fresh("bn_scale"), s.reshape(shape))])
        self.step(node, "add", [y, const(self.fresh("bn_shift"), t.reshape(shape))], last=True)

    def layer_norm(self, node, a, ins):
        """LayerNormalization over axes [axis, rank): (x - mean) / sqrt(var +
        epsilon) * scale + B, the mean and the (biased) variance each a sum
        in order divided by the count."""
        x = ins[0]
        rank = len(x.type.shape)
        axis = int(a.get("axis", -1)) % rank
        axes = list(range(axis, rank))
        n = self.scalar(int(np.prod(x.type.shape[axis:])))
        red = {"fn": "sum", "axes": axes, "keepdims": 1}
        mean = self.step(node, "div", [self.step(node, "reduce", [x], red), n])
        d = self.step(node, "sub", [x, mean])
        var = self.step(node, "div", [self.step(node, "reduce", [
            self.step(node, "mul", [d, d])], red), n])
        den = self.step(node, "sqrt", [self.step(node, "add", [
            var, self.scalar(float(np.float32(a.get("epsilon", 1e-5))))])])
        # the optional outputs: the mean and 1 / sqrt(var + epsilon)
        if len(node.output) > 1 and node.output[1]:
            self.emit(node, "reshape", [mean], {"shape": list(mean.type.shape)},
                      out=node.output[1])
        if len(node.output) > 2 and node.output[2]:
            self.emit(node, "reciprocal", [den], out=node.output[2])
        y = self.step(node, "mul", [self.step(node, "div", [d, den]), ins[1]],
                      last=len(ins) < 3 or ins[2] is None)
        if len(ins) > 2 and ins[2] is not None:
            self.step(node, "add", [y, ins[2]], last=True)

    def reshape_target(self, node, shape, target, allowzero):
        out = []
        for i, d in enumerate(target):
            if d == 0 and not allowzero:
                if i >= len(shape):
                    self.fail(f"Reshape dim {i} is 0 but the input has rank {len(shape)}", node)
                out.append(shape[i])
            else:
                out.append(int(d))
        if out.count(-1) > 1:
            self.fail("Reshape target has more than one -1", node)
        if -1 in out:
            rest = int(np.prod([d for d in out if d != -1]))
            total = int(np.prod(shape))
            if rest == 0 or total % rest:
                self.fail(f"cannot reshape {list(shape)} to {target}", node)
            out[out.index(-1)] = total // rest
        if any(d <= 0 for d in out) or int(np.prod(out)) != int(np.prod(shape)):
            self.fail(f"cannot reshape {list(shape)} to {target}", node)
        return out

    def evaluate_now(self, node) -> bool:
        """Evaluate ``node`` at import time; False for a float Cast of runtime
        data, which is an Identity."""
        from onnx import helper, numpy_helper

        op = node.op_type
        a = self.attrs(node)
        if op in ("Shape", "Size"):
            v = self.get(node, 0) if node.input[0] not in self.known else None
            shape = np.array(self.known[node.input[0]].shape if v is None else v.type.shape,
                             dtype=np.int64)
            result = shape[a.get("start", 0):a.get("end", None)] if op == "Shape" else \
                np.array(np.prod(shape), np.int64)
        else:
            d = [self.value_of(n) if n else None for n in node.input]
            if any(x is None for n, x in zip(node.input, d) if n):
                if op in RUNTIME_STATIC:
                    return False       # on runtime data: IR ops
                self.fail(f"{op} on runtime data is not supported; kmlc evaluates {op} only "
                          "when its inputs are known at compile time", node)
            if op not in STATIC and op not in _STATIC_RULES:
                return False           # IR ops on constants, which fold_constants folds
            try:
                result = _static_eval(op, d, {**a, "_outputs": len(node.output)}, helper,
                                      numpy_helper)
            except KmlcError:
                raise
            except Exception as e:
                self.fail(f"cannot evaluate at compile time: {e}", node)
        if op == "Split":
            for name, part in zip(node.output, result):
                self.constant(name, np.asarray(part))
            return True
        self.constant(node.output[0], np.asarray(result))
        return True


# Ops _static_eval computes (integer arithmetic on shapes among them)
_STATIC_RULES = ("Cast", "Abs", "Exp", "Log", "Neg", "Reciprocal", "Sqrt", "Max", "Min", "Pow",
                 "Transpose", "Add", "Sub", "Mul", "Div")
_NUMPY_UNARY = {"Abs": np.abs, "Exp": np.exp, "Log": np.log, "Neg": np.negative,
                "Reciprocal": np.reciprocal, "Sqrt": np.sqrt}


def _static_eval(op, d, a, helper, numpy_helper):
    if op == "Constant":
        if "value" in a:
            return numpy_helper.to_array(a["value"])
        for key, dt in (("value_float", np.float32), ("value_floats", np.float32),
                        ("value_int", np.int64), ("value_ints", np.int64)):
            if key in a:
                return np.array(a[key], dtype=dt)
        raise KmlcError("Constant without a supported value attribute")
    if op == "Cast":
        return d[0].astype(helper.tensor_dtype_to_np_dtype(a["to"]))
    if op in _NUMPY_UNARY:
        with np.errstate(all="ignore"):
            return _NUMPY_UNARY[op](d[0]).astype(d[0].dtype)
    if op in ("Max", "Min"):
        f = np.maximum if op == "Max" else np.minimum
        out = d[0]
        for x in d[1:]:
            out = f(out, x)
        return out
    if op == "Pow":
        with np.errstate(all="ignore"):
            return np.power(d[0], d[1]).astype(d[0].dtype)
    if op == "Transpose":
        return np.transpose(d[0], a.get("perm"))
    if op in ("Add", "Sub", "Mul"):
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](d[0], d[1])
    if op == "Div" and d[0].dtype.kind in "iu":
        return (np.sign(d[0]) * np.sign(d[1]) * (np.abs(d[0]) // np.abs(d[1]))).astype(d[0].dtype)
    if op == "Concat":
        return np.concatenate(d, axis=a["axis"])
    if op == "Gather":
        return np.take(d[0], d[1], axis=a.get("axis", 0))
    if op == "Unsqueeze":
        out = d[0]
        rank = out.ndim + len(d[1].reshape(-1))
        for ax in sorted(int(x) % rank for x in d[1].reshape(-1)):
            out = np.expand_dims(out, ax)
        return out
    if op == "Squeeze":
        if len(d) < 2 or d[1] is None:
            return np.squeeze(d[0])
        return np.squeeze(d[0], axis=tuple(int(x) for x in d[1].reshape(-1)))
    if op == "ConstantOfShape":
        val = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
        return np.full(tuple(int(x) for x in d[0].reshape(-1)), val.reshape(-1)[0], val.dtype)
    if op == "Split":
        sizes = split_sizes(d[0].shape[a.get("axis", 0)], d[1] if len(d) > 1 else None,
                            a.get("num_outputs", a["_outputs"]))
        return np.split(d[0], np.cumsum(sizes)[:-1], axis=a.get("axis", 0))
    if op == "Slice":
        data, starts, ends = d[0], d[1].reshape(-1), d[2].reshape(-1)
        axes = d[3].reshape(-1) if len(d) > 3 and d[3] is not None else range(len(starts))
        steps = d[4].reshape(-1) if len(d) > 4 and d[4] is not None else [1] * len(starts)
        idx = [slice(None)] * data.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            idx[int(ax)] = slice(int(s), int(e), int(st))
        return data[tuple(idx)]
    raise KmlcError(f"no compile-time evaluation for {op}")


def split_sizes(n: int, split, parts: int) -> list[int]:
    """Split's pieces of an axis of n: the ``split`` input's sizes, or
    ``parts`` pieces of ceil(n / parts), the last one smaller (opset 18)."""
    if split is not None:
        sizes = [int(x) for x in np.asarray(split).reshape(-1)]
        if sum(sizes) != n or any(x < 0 for x in sizes):
            raise KmlcError(f"split sizes {sizes} do not add up to the axis's {n}")
        return sizes
    step = -(-n // parts)
    return [min(step, n - i * step) for i in range(parts)]


def _type_name(elem_type: int) -> str:
    """An ONNX element type's name, or what it is when ONNX has none."""
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"{elem_type} (not an ONNX element type)"
