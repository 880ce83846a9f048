"""TVM frontend: a TVM Relax ``IRModule`` to kmlc graph IR.

It reads the module's ``main`` function, as TVM's importers produce it
(``tvm.relax.frontend.onnx.from_onnx``, ``tvm.relax.frontend.torch.
from_exported_program``, ...) before any lowering: binding blocks of Relax
operator calls.  Each call becomes the IR op the ONNX frontend makes for
the same computation, so both routes meet in one graph: a Gemm that TVM
imported as ``permute_dims`` + ``matmul`` + ``add`` folds and fuses into the
same ``dense`` op as the ONNX ``Gemm`` (docs/frontends.md shows the test).

  Relax                                   kmlc IR
  add subtract multiply divide            add sub mul div
  matmul                                  matmul
  nn.relu sigmoid tanh nn.leakyrelu clip  relu sigmoid tanh leaky_relu clip
  nn.softmax argmax                       softmax argmax
  reshape flatten expand_dims squeeze,    reshape (a view)
  astype to float32 of float32
  permute_dims sqrt exp log abs negative  compile-time only: the fold-constants
  power maximum minimum                   pass must remove them
  isnan where, astype (on constants)      evaluated while importing

Weights are ``relax.Constant`` operands, or parameters of ``main`` bound to
values: the ``params`` function attribute TVM's importers set with
``keep_params_in_input=True`` / ``keep_params_as_input=True``, or the
``params`` argument (a dict by parameter name, the ``{"main": [...]}`` of
``relax.frontend.detach_params``, or a list for the trailing parameters).
The other parameters are the model's inputs: float32 with static shapes,
except that a symbolic leading dimension is bound to 1 (one sample per
call).  Value names and op origins come from the Relax variables
(``lv3 (relax.matmul)``).  Anything else is a ``KmlcError`` naming the
binding and the Relax op.
"""
from __future__ import annotations

import numpy as np

from ..errors import KmlcError
from ..ir import (DTYPES, F32, Graph, IRError, Op, TensorType, Value, c_identifier, const,
                  fresh_namer, verify)
from ..ops import infer_types
from . import Imported, graph_sha256

_SIMPLE = {"relax.add": "add", "relax.subtract": "sub", "relax.multiply": "mul",
           "relax.divide": "div", "relax.matmul": "matmul", "relax.nn.relu": "relu",
           "relax.sigmoid": "sigmoid", "relax.tanh": "tanh"}
_MATH = {"relax.sqrt": "sqrt", "relax.exp": "exp", "relax.log": "log", "relax.abs": "abs",
         "relax.negative": "neg", "relax.maximum": "max", "relax.minimum": "min",
         "relax.power": "pow"}
# pow has no kernel: a power of runtime data is refused when lowered
_FOLD_ONLY = {"relax.power"}
_VIEWS = ("relax.reshape", "relax.flatten", "relax.expand_dims", "relax.squeeze")
_STATIC = {"relax.isnan": np.isnan, "relax.where": np.where}
SUPPORTED = tuple(sorted(set(_SIMPLE) | set(_VIEWS) | (set(_MATH) - _FOLD_ONLY) | {
    "relax.nn.leakyrelu", "relax.clip", "relax.nn.softmax", "relax.argmax", "relax.astype",
    "relax.permute_dims"}))


def supported_ops_text() -> str:
    return (", ".join(o.removeprefix("relax.") for o in SUPPORTED) + "; and, on constant "
            "inputs only, " + ", ".join(sorted(o.removeprefix("relax.") for o in
                                               [*_FOLD_ONLY, *_STATIC])))


def load(mod, params=None, *, name: str | None = None) -> Imported:
    graph = RelaxImporter(mod, params).run(name or "model")
    return Imported(graph, "a TVM Relax IRModule", graph_sha256(graph))


class RelaxImporter:
    where = "TVM IRModule @main"

    def __init__(self, mod, params):
        import tvm
        from tvm import relax

        self.tvm, self.relax = tvm, relax
        if "main" not in [g.name_hint for g in mod.get_global_vars()]:
            self.fail("the IRModule has no 'main' function")
        func = mod["main"]
        if not isinstance(func, relax.Function):
            self.fail(f"'main' is a {type(func).__name__}, not a Relax function")
        self.func, self.params = func, params

    def fail(self, msg: str, var=None, op: str | None = None):
        if var is not None:
            msg = f"binding '{var.name}'{f' ({op})' if op else ''}: {msg}"
        raise KmlcError(msg, where=self.where)

    # -- parameters ------------------------------------------------------------

    def param_values(self, func) -> dict[int, np.ndarray]:
        """Values bound to ``main``'s parameters, by position."""
        attrs = func.attrs
        get = lambda key: attrs[key] if attrs is not None and key in attrs else None  # noqa: E731
        names = [p.name for p in func.params]
        given = self.params if self.params is not None else get("params")
        if isinstance(given, dict) and set(given) == {"main"}:
            given = given["main"]  # relax.frontend.detach_params
        if given is None:
            return {}
        if isinstance(given, dict):
            unknown = sorted(set(given) - set(names))
            if unknown:
                self.fail(f"params name {', '.join(map(repr, unknown))}, which main does not "
                          f"take (its parameters: {', '.join(names)})")
            return {names.index(k): _numpy(v) for k, v in given.items()}
        given = list(given)
        num_input = get("num_input")
        first = int(num_input) if num_input is not None else len(names) - len(given)
        if first < 0 or first + len(given) != len(names):
            self.fail(f"{len(given)} parameter values for main's {len(names)} parameters "
                      f"{'after its ' + str(first) + ' inputs' if num_input is not None else ''}")
        return {first + i: _numpy(v) for i, v in enumerate(given)}

    def static_type(self, ty, what: str, var=None) -> TensorType:
        if not isinstance(ty, self.relax.TensorType) or ty.shape is None:
            self.fail(f"{what} has type {ty}; kmlc computes on tensors of known shape", var)
        dims = []
        for i, d in enumerate(ty.shape.values):
            if isinstance(d, self.tvm.ir.Var) or not hasattr(d, "value"):
                self.fail(f"{what} has a dynamic dimension {i} ('{d}'); only a leading batch "
                          "dimension of an input may be symbolic", var)
            dims.append(int(d.value))
        return TensorType(_dtype(str(ty.dtype), what, self, var), tuple(dims))

    # -- the walk ---------------------------------------------------------------

    def run(self, name: str) -> Graph:
        func = self.func
        values = self.param_values(func)
        batch = {}
        for i, p in enumerate(func.params):
            shape = getattr(p.ty, "shape", None)
            if i not in values and shape is not None and len(shape.values) \
                    and isinstance(shape.values[0], self.tvm.ir.Var):
                batch[shape.values[0]] = 1  # symbolic batch: one sample per call
        if batch:
            func = func.bind_symbolic_vars(batch)

        self.fresh = fresh_namer()
        self.env: dict = {}
        self.ops: list[Op] = []
        inputs, source_names = [], {}
        for i, p in enumerate(func.params):
            if i in values:
                arr = values[i]
                self.env[p] = const(self.fresh(c_identifier(p.name, "c")), arr) \
                    if arr.dtype in (np.float32, np.int64) and arr.size else arr
                continue
            t = self.static_type(p.ty, f"input '{p.name}'")
            if t.dtype != F32:
                self.fail(f"input '{p.name}' has element type {t.dtype}; kmlc models take "
                          "float32 inputs")
            v = Value(self.fresh(c_identifier(p.name, "in")), t)
            self.env[p] = v
            inputs.append(v)
            source_names[v] = p.name
        if not inputs:
            self.fail("main has no runtime inputs")

        body = func.body
        if not isinstance(body, self.relax.SeqExpr):
            body = self.relax.SeqExpr([], body)
        for block in body.blocks:
            for b in block.bindings:
                if not isinstance(b, self.relax.VarBinding):
                    self.fail(f"{type(b).__name__} bindings are not supported", b.var)
                self.env[b.var] = self.bind(b.var, b.value)
        result = self.expr(body.body, None)
        outputs = []
        for x in result if isinstance(result, list) else [result]:
            v = self.operand(x, None, "an output")
            if v.type.dtype.name not in ("f32", "i64"):
                self.fail(f"an output has type {v.type}; kmlc outputs float32 (or an argmax "
                          "index)")
            outputs.append(v)
        for i, v in enumerate(outputs):
            source_names.setdefault(v, "output" if len(outputs) == 1 else f"output{i}")
        graph = Graph(name, inputs, outputs, self.ops, source_names)
        return verify(graph)

    def expr(self, e, var):
        """A Relax expression's meaning: a Value, a numpy array (a compile-time
        tensor), a list (a tuple), or a Python scalar."""
        relax, ir = self.relax, self.tvm.ir
        if isinstance(e, ir.Var):
            if e not in self.env:
                self.fail(f"'{e.name}' is not defined before its use", var)
            return self.env[e]
        if isinstance(e, ir.Tuple):
            return [self.expr(f, var) for f in e.fields]
        if isinstance(e, ir.TupleGetItem):
            t = self.expr(e.tuple_value, var)
            return t[int(e.index)]
        if isinstance(e, (ir.prim.expr.FloatImm, ir.prim.expr.IntImm)):
            return e.value
        if isinstance(e, ir.Constant) and hasattr(e, "value") and hasattr(e.value, "numpy"):
            return _numpy(e.value)
        if isinstance(e, relax.ShapeExpr):
            return [int(d.value) if hasattr(d, "value") else d for d in e.values]
        self.fail(f"{type(e).__name__} expressions are not supported", var)

    def bind(self, var, value):
        if not isinstance(value, self.tvm.ir.Call):
            return self.expr(value, var)
        if not isinstance(value.op, self.tvm.ir.Op):
            self.fail(f"calls '{getattr(value.op, 'name_hint', value.op)}'; kmlc imports Relax "
                      f"operators only: {supported_ops_text()}", var)
        op = value.op.name
        if op not in _SIMPLE and op not in _MATH and op not in _STATIC and op not in SUPPORTED:
            callee = value.args[0] if value.args else None
            if isinstance(callee, self.tvm.ir.GlobalVar):
                self.fail(f"calls '{callee.name_hint}'; kmlc imports Relax operators only, as "
                          f"TVM's importers emit them before lowering: {supported_ops_text()}",
                          var, op)
            self.fail(f"kmlc cannot compile {op}; supported Relax ops: {supported_ops_text()}",
                      var, op)
        args = [self.expr(a, var) for a in value.args]
        known = [_known(x) for x in args]
        a = value.attrs
        if op in _STATIC or (op == "relax.astype" and known[0] is not None
                             and str(a.dtype) != "float32"):
            if any(k is None for k in known):
                self.fail(f"{op} on runtime data is not supported; kmlc evaluates it only on "
                          "constants", var, op)
            if op == "relax.astype":
                return known[0].astype(str(a.dtype))
            return np.asarray(_STATIC[op](*known))
        if op in _SIMPLE:
            return self.emit(var, op, _SIMPLE[op], args)
        if op in _MATH:
            return self.emit(var, op, _MATH[op], args)
        x = args[0] if args else None
        if op == "relax.permute_dims":
            rank = len(self.operand(x, var, "operand 0", op).type.shape)
            perm = list(range(rank))[::-1] if a.axes is None else [int(i) % rank for i in a.axes]
            return self.emit(var, op, "transpose", [x], {"perm": perm})
        if op == "relax.nn.leakyrelu":
            return self.emit(var, op, "leaky_relu", [x], {"alpha": float(np.float32(a.alpha))})
        if op == "relax.clip":
            if any(k is None or np.size(k) != 1 for k in known[1:3]):
                self.fail("clip bounds must be constant scalars", var, op)
            lo, hi = (float(np.float32(np.reshape(k, ()))) for k in known[1:3])
            return self.emit(var, op, "clip", [x], {"min": lo, "max": hi})
        if op == "relax.nn.softmax":
            return self.emit(var, op, "softmax", [x], {"axis": int(a.axis)})
        if op == "relax.argmax":
            rank = len(self.operand(x, var, "operand 0", op).type.shape)
            if a.axis is None and rank != 1:
                self.fail("argmax over all elements of a rank-%d tensor is not supported; "
                          "give an axis" % rank, var, op)
            return self.emit(var, op, "argmax", [x], {
                "axis": 0 if a.axis is None else int(a.axis), "keepdims": int(bool(a.keepdims)),
                "select_last_index": 0})
        if op in _VIEWS or (op == "relax.astype" and str(a.dtype) == "float32"):
            shape = self.static_type(var.ty, f"'{var.name}'", var).shape
            return self.emit(var, op, "reshape", [x], {"shape": list(shape)})
        self.fail(f"astype to {a.dtype} of runtime data is not supported; kmlc computes in "
                  "float32", var, op)

    def operand(self, x, var, what: str, op: str | None = None) -> Value:
        if isinstance(x, Value):
            return x
        if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.int64) and x.size:
            if x.dtype == np.float32 and not np.all(np.isfinite(x)):
                self.fail(f"{what} is a constant holding non-finite values", var, op)
            return const(self.fresh(c_identifier(f"{var.name}_c" if var is not None else "c")), x)
        desc = (f"a {x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, np.ndarray)
                else f"a {type(x).__name__}")
        self.fail(f"{what} is {desc}; kmlc computes on non-empty float32 tensors only", var, op)

    def emit(self, var, op: str, kind: str, args: list, attrs: dict | None = None) -> Value:
        attrs = attrs or {}
        ins = [self.operand(x, var, f"operand {i}", op) for i, x in enumerate(args)]
        for i, v in enumerate(ins):
            if v.type.dtype != F32:
                self.fail(f"operand {i} has element type {v.type.dtype}; kmlc computes in "
                          "float32 only", var, op)
        try:
            (t,) = infer_types(kind, [v.type for v in ins], attrs)
        except ValueError as e:
            self.fail(str(e), var, op)
        want = self.static_type(var.ty, f"'{var.name}'", var)
        if want != t:
            raise IRError(f"kmlc infers {t} for '{var.name}' ({op}) but Relax gives {want}")
        out = Value(self.fresh(c_identifier(var.name, "t")), t)
        self.ops.append(Op(kind, ins, [out], attrs, (f"{var.name} ({op})",)))
        return out


def _known(x):
    """A compile-time tensor's value, or None for runtime data."""
    if isinstance(x, Value):
        return x.data
    return None if isinstance(x, list) else np.asarray(x)


def _numpy(x) -> np.ndarray:
    arr = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    return arr.astype(np.int64) if arr.dtype.kind in "iu" else arr


def _dtype(name: str, what: str, importer: RelaxImporter, var):
    d = {"float32": "f32", "int64": "i64"}.get(name)
    if d is None:
        importer.fail(f"{what} has element type {name}; kmlc computes in float32 (and int64 "
                      "for argmax indices)", var)
    return DTYPES[d]
