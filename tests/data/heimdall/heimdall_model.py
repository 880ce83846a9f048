"""Heimdall's published admission model as ONNX, from its numbers.

Heimdall (ucare-uchicago/Heimdall) ships each trained device's network as
int64 arrays (devN.json here holds them as published, see README.md): a
min-max normalization of 12 integer features (``weight_0_T`` the minima,
``bias_0`` = round(2^30 / range)), then Dense(128, relu), Dense(16, relu)
and Dense(1) with weights scaled by 10^3 and biases by 10^3, 10^6 and 10^9
(each layer's scale times the previous one's), and the rule "decline when
the output >= 0" (a sigmoid's 0.5).  ``model(dev)`` writes that network
as float32 ONNX with the decision inside: int64 features in, a bool out.
Its float arithmetic is the network the integers stand for; the authors'
own integer inference (``authors_int64``) is kept beside it as a peer.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES = ("io_type", "size", "queue_len", "prev_queue_len_1", "prev_queue_len_2",
            "prev_queue_len_3", "prev_latency_1", "prev_latency_2", "prev_latency_3",
            "prev_throughput_1", "prev_throughput_2", "prev_throughput_3")
STARTUP_THROUGHPUT = 99999999     # the kernel's throughput before any latency is known


def numbers(dev: int) -> dict:
    return json.loads((HERE / f"dev{dev}.json").read_text())


def arrays(dev: int) -> dict:
    """The published arrays as the float network's parameters."""
    n = numbers(dev)
    a = {k: np.array(v, dtype=np.int64) for k, v in n.items() if isinstance(v, list)}
    return {
        "min": a["weight_0_T"].astype(np.float32),
        "scale": (a["bias_0"] / 2.0**30).astype(np.float32),
        "w1": (a["weight_1_T"].reshape(128, 12).T / 1e3).astype(np.float32),
        "b1": (a["bias_1"] / 1e3).astype(np.float32),
        "w2": (a["weight_2_T"].reshape(16, 128).T / 1e3).astype(np.float32),
        "b2": (a["bias_2"] / 1e6).astype(np.float32),
        "w3": (a["weight_3_T"].reshape(1, 16).T / 1e3).astype(np.float32),
        "b3": (a["bias_3"] / 1e9).astype(np.float32),
    }


def model(dev: int):
    from onnx import TensorProto as T, helper, numpy_helper

    p = arrays(dev)
    nodes = [helper.make_node("Cast", ["features"], ["x"], name="to_float", to=T.FLOAT),
             helper.make_node("Sub", ["x", "min"], ["xc"], name="minus_min"),
             helper.make_node("Mul", ["xc", "scale"], ["xn"], name="over_range"),
             helper.make_node("Gemm", ["xn", "w1", "b1"], ["h1"], name="dense1"),
             helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
             helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"], name="dense2"),
             helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
             helper.make_node("Gemm", ["a2", "w3", "b3"], ["score"], name="dense3"),
             helper.make_node("GreaterOrEqual", ["score", "zero"], ["decline"], name="decide")]
    inits = [numpy_helper.from_array(v, k) for k, v in p.items()]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    g = helper.make_graph(nodes, f"heimdall_dev{dev}",
                          [helper.make_tensor_value_info("features", T.INT64, ["N", 12])],
                          [helper.make_tensor_value_info("decline", T.BOOL, ["N", 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def authors_int64(dev: int, x: np.ndarray) -> np.ndarray:
    """The published integer inference, rewritten from its description in
    numpy int64: x - min, times 2^30 / range; each first-layer product
    floor-divided by 2^30 before the sum; ReLU; the decision output >= 0."""
    a = {k: np.array(v, dtype=np.int64) for k, v in numbers(dev).items() if isinstance(v, list)}
    n = (np.asarray(x, np.int64) - a["weight_0_T"]) * a["bias_0"]
    w1 = a["weight_1_T"].reshape(128, 12)
    h1 = np.floor_divide(n[:, None, :] * w1[None], 2**30).sum(axis=2) + a["bias_1"]
    h1 = np.maximum(h1, 0)
    h2 = np.maximum(h1 @ a["weight_2_T"].reshape(16, 128).T + a["bias_2"], 0)
    y = h2 @ a["weight_3_T"].reshape(1, 16).T + a["bias_3"]
    return y[:, 0] >= 0


def feature_range(dev: int) -> tuple[np.ndarray, np.ndarray]:
    """The training data's per-feature minimum and range, from the
    published normalization (range = 2^30 / bias_0; 1 where bias_0 is 0)."""
    n = numbers(dev)
    lo = np.array(n["weight_0_T"], np.float64)
    b = np.array(n["bias_0"], np.float64)
    return lo, np.where(b > 0, 2.0**30 / np.maximum(b, 1), 1.0)


def rows(dev: int, n: int, seed: int, beyond: float = 1.0) -> np.ndarray:
    """``n`` integer feature rows (reads: io_type 1): each feature uniform in
    [min, min + range * f], f uniform in [1, ``beyond``] per row (1: the
    calibrated range itself)."""
    r = np.random.default_rng(seed)
    lo, width = feature_range(dev)
    f = r.uniform(1.0, beyond, (n, 1)) if beyond > 1 else np.ones((n, 1))
    x = np.round(lo + r.random((n, 12)) * width * f).astype(np.int64)
    x[:, 0] = 1
    return x


def startup_rows(dev: int, n: int, seed: int) -> np.ndarray:
    """Rows the kernel produces before any completion: no history (previous
    queue lengths and latencies 0), throughputs at the placeholder."""
    x = rows(dev, n, seed)
    x[:, 3:9] = 0
    x[:, 9:] = STARTUP_THROUGHPUT
    return x


if __name__ == "__main__":
    import onnx

    for dev in (0, 1):
        out = Path(sys.argv[1] if len(sys.argv) > 1 else ".") / f"heimdall_dev{dev}.onnx"
        onnx.save(model(dev), out)
        print(out)
