"""The benchmark's models: one description, many systems.

A ``Spec`` is an MLP as every system under test sees it: optional input
normalization ``(x - shift) / scale``, dense layers ``y = W x + b`` with a
hidden activation between them and an optional output activation.  From it
come the ONNX file (kmlc, onnxruntime and TVM read the same bytes), the
PyTorch module, the naive C loop's weights and the input rows.

  readahead   KML readahead, 5-15-5-4 sigmoid          (examples/models)
  nfs_rsize   KML NFS rsize, 8-25-10-5-4 sigmoid       (examples/models)
  heimdall    Heimdall admission, 11-128-16-1 ReLU     (examples/models)
  linnos      LinnOS, 31-256-2 ReLU (digit features)   (built here)
  mlp_large   64-512-512-8 ReLU, to show scaling       (built here)
  sweep_<H>   32-H-H-8 ReLU, the hidden-width sweep    (built here)

The three seed models are the checked-in, trained ONNX files; LinnOS and
the larger MLPs get seeded PyTorch-style initial weights
(U(-1/sqrt(fan_in), 1/sqrt(fan_in))): their timings do not depend on what
the weights are, and fixed point calibrates them on their own input rows.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
sys.path.insert(0, str(EXAMPLES))

import seed_models  # noqa: E402

SEEDS = ("readahead", "nfs_rsize", "heimdall", "linnos")
LARGE = "mlp_large"
TITLES = {"readahead": "KML readahead", "nfs_rsize": "KML NFS rsize",
          "heimdall": "Heimdall admission", "linnos": "LinnOS", LARGE: "larger MLP"}


@dataclass
class Spec:
    name: str
    sizes: list[int]
    act: str                          # hidden activation: "sigmoid" | "relu"
    out_act: str | None               # "sigmoid" or None
    weights: list[np.ndarray]         # W[l] of shape (out, in), float32
    biases: list[np.ndarray]
    shift: np.ndarray | None = None   # input normalization, or None
    scale: np.ndarray | None = None
    onnx_path: Path | None = None     # the checked-in file, if any
    title: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def shape(self) -> str:
        return "-".join(str(s) for s in self.sizes)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the dense layers (the work every system does)."""
        return sum(a * b for a, b in zip(self.sizes[:-1], self.sizes[1:]))

    def rows(self, n: int, seed: int) -> np.ndarray:
        """Realistic input rows (float32, (n, in))."""
        if self.name in seed_models.IN_FEATURES:
            return seed_models.sample_inputs(self.name, n, seed=seed)
        r = np.random.default_rng(seed)
        if self.name == "linnos":  # LinnOS feeds decimal digits of queue lengths/latencies
            return r.integers(0, 10, (n, self.sizes[0])).astype(np.float32)
        return r.standard_normal((n, self.sizes[0])).astype(np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """float64 reference (a sanity check of every system's output)."""
        h = x.astype(np.float64)
        if self.shift is not None:
            h = (h - self.shift) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w.T.astype(np.float64) + b
            act = self.act if i < len(self.weights) - 1 else self.out_act
            if act == "relu":
                h = np.maximum(h, 0)
            elif act == "sigmoid":
                h = 1 / (1 + np.exp(-h))
        return h

    # -- the same model for each system ------------------------------------

    def onnx_model(self):
        """The ONNX model: the checked-in file, or Sub/Div/Gemm/act nodes built
        here (the shape torch's exporter gives for the seed models)."""
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        if self.onnx_path is not None:
            return onnx.load(str(self.onnx_path))
        nodes, inits, cur = [], [], "features"

        def const(name, a):
            inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
            return name

        if self.shift is not None:
            nodes.append(helper.make_node("Sub", [cur, const("shift", self.shift)], ["sub"]))
            nodes.append(helper.make_node("Div", ["sub", const("scale", self.scale)], ["div"]))
            cur = "div"
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            out = f"linear_{i}"
            nodes.append(helper.make_node(
                "Gemm", [cur, const(f"layers.{i}.weight", w), const(f"layers.{i}.bias", b)],
                [out], transB=1))
            act = self.act if i < last else self.out_act
            if act:
                nodes.append(helper.make_node({"relu": "Relu", "sigmoid": "Sigmoid"}[act],
                                              [out], [f"{act}_{i}"]))
                out = f"{act}_{i}"
            cur = out
        nodes[-1].output[0] = "output"
        graph = helper.make_graph(
            nodes, self.name, [helper.make_tensor_value_info("features", TensorProto.FLOAT,
                                                             [1, self.sizes[0]])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, self.sizes[-1]])],
            inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

    def write_onnx(self, path: Path) -> Path:
        import onnx

        onnx.save(self.onnx_model(), str(path))
        return path

    def torch_module(self):
        import torch
        from torch import nn

        spec = self

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.linears = nn.ModuleList()
                for w, b in zip(spec.weights, spec.biases):
                    lin = nn.Linear(w.shape[1], w.shape[0])
                    lin.weight.data = torch.from_numpy(w.copy())
                    lin.bias.data = torch.from_numpy(b.copy())
                    self.linears.append(lin)
                if spec.shift is not None:
                    self.register_buffer("shift", torch.from_numpy(spec.shift.copy()))
                    self.register_buffer("scale", torch.from_numpy(spec.scale.copy()))
                else:
                    self.shift = None

            def forward(self, x):
                if self.shift is not None:
                    x = (x - self.shift) / self.scale
                last = len(self.linears) - 1
                for i, lin in enumerate(self.linears):
                    x = lin(x)
                    act = spec.act if i < last else spec.out_act
                    if act == "relu":
                        x = torch.relu(x)
                    elif act == "sigmoid":
                        x = torch.sigmoid(x)
                return x

        return MLP().eval()

    def naive_header(self) -> str:
        """The weights as C arrays for benchmarks/c/naive.c (row n of W[l]
        holds output n's weights: the textbook layout)."""
        def arr(name, a):
            vals = ", ".join(repr(float(v)) + "f" for v in np.asarray(a, np.float32).ravel())
            return f"static const float {name}[{a.size}] = {{ {vals} }};\n"

        act = {"relu": 1, "sigmoid": 2, None: 0}
        n = len(self.weights)
        out = [f"/* {self.name} {self.shape}: generated by benchmarks/bench_models.py */\n",
               f"#define NAIVE_IN {self.sizes[0]}\n#define NAIVE_OUT {self.sizes[-1]}\n",
               f"#define NAIVE_LAYERS {n}\n#define NAIVE_MAXW {max(self.sizes)}\n",
               f"#define NAIVE_NORMALIZE {int(self.shift is not None)}\n"]
        if self.shift is not None:
            out += [arr("naive_shift", self.shift), arr("naive_scale", self.scale)]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            out += [arr(f"naive_w{i}", w), arr(f"naive_b{i}", b)]
        out.append("static const struct naive_layer naive_layers[NAIVE_LAYERS] = {\n")
        for i in range(n):
            a = self.act if i < n - 1 else self.out_act
            out.append(f"\t{{ {self.sizes[i]}, {self.sizes[i + 1]}, naive_w{i}, naive_b{i}, "
                       f"{act[a]} }},\n")
        out.append("};\n")
        return "".join(out)


def from_onnx_file(name: str, path: Path) -> Spec:
    """Read a Sub/Div/(Gemm act)* chain, the shape of the seed models."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    init = {i.name: numpy_helper.to_array(i).astype(np.float32) for i in m.graph.initializer}
    shift = scale = None
    ws, bs, acts = [], [], []
    for node in m.graph.node:
        op = node.op_type
        if op == "Sub":
            shift = init[node.input[1]]
        elif op == "Div":
            scale = init[node.input[1]]
        elif op == "Gemm":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            w = init[node.input[1]]
            ws.append(w if attrs.get("transB", 0) else w.T.copy())
            bs.append(init[node.input[2]])
            acts.append(None)
        elif op in ("Relu", "Sigmoid"):
            acts[-1] = op.lower()
        else:
            raise ValueError(f"{path}: unexpected {op} node for a benchmark MLP")
    sizes = [ws[0].shape[1]] + [w.shape[0] for w in ws]
    return Spec(name, sizes, acts[0] or "relu", acts[-1], ws, bs, shift, scale,
                onnx_path=path, title=TITLES.get(name, name))


def random_mlp(name: str, sizes: list[int], seed: int) -> Spec:
    r = np.random.default_rng(seed)
    ws, bs = [], []
    for a, b in zip(sizes[:-1], sizes[1:]):
        lim = 1 / np.sqrt(a)
        ws.append(r.uniform(-lim, lim, (b, a)).astype(np.float32))
        bs.append(r.uniform(-lim, lim, b).astype(np.float32))
    return Spec(name, list(sizes), "relu", None, ws, bs, title=TITLES.get(name, name))


def spec(name: str) -> Spec:
    if name in seed_models.IN_FEATURES:
        return from_onnx_file(name, EXAMPLES / f"{name}.onnx")
    if name == "linnos":
        return random_mlp("linnos", [31, 256, 2], seed=4)
    if name == LARGE:
        return random_mlp(LARGE, [64, 512, 512, 8], seed=5)
    if name.startswith("sweep_"):
        h = int(name.split("_", 1)[1])
        return random_mlp(name, [32, h, h, 8], seed=6)
    raise KeyError(name)
