"""The model shapes of kmlc's seed papers, as PyTorch modules.

  readahead   KML readahead (brief §2): 5 -> 15 -> 5 -> 4, sigmoid, z-score
              normalization with the paper's training-set means and stds
  nfs_rsize   KML NFS rsize: 8 -> 25 -> 10 -> 5 -> 4, sigmoid, z-score
  heimdall    Heimdall admission: 11 -> 128 -> 16 -> 1, ReLU, sigmoid output,
              min-max normalization

Weights are seeded random (Xavier) initializations, not trained models: they
exercise the compiler with the real shapes, normalizations and input ranges.
Trained versions come with the worked examples.  ``sample_inputs`` draws
feature rows in each model's realistic raw (unnormalized) range.

Regenerate the checked-in .onnx files with:  python examples/models/seed_models.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# KML readahead training-set statistics (paper 000 via the brief).
RA_MEAN = [50766.9, 512.914, 512.936, 66.48, 0.425]
RA_STD = [47039.5, 79.69, 79.69, 163.64, 0.419]
# NFS: events/s, mean read->done latency (us), mean gap between reads and
# between dones (us), mean |offset delta| of reads and of pages, mean
# reclaimed pages, current rsize / 4096.
NFS_MEAN = [1800.0, 900.0, 550.0, 550.0, 120.0, 90.0, 12.0, 32.0]
NFS_STD = [1500.0, 700.0, 480.0, 480.0, 300.0, 250.0, 30.0, 28.0]
# Heimdall: I/O size (B), queue length, last 3 queue lengths, last 3
# latencies (us), last 3 throughputs (B/us).
HD_MIN = [512.0] + [0.0] * 4 + [1.0] * 3 + [0.0] * 3
HD_MAX = [1048576.0] + [128.0] * 4 + [20000.0] * 3 + [4096.0] * 3


def build(name: str):
    import torch
    from torch import nn

    class Normalized(nn.Module):
        def __init__(self, shift, scale, layers, out_act=None):
            super().__init__()
            self.register_buffer("shift", torch.tensor(shift, dtype=torch.float32))
            self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
            self.layers = layers
            self.out_act = out_act

        def forward(self, x):
            y = self.layers((x - self.shift) / self.scale)
            return torch.sigmoid(y) if self.out_act == "sigmoid" else y

    def mlp(sizes, act):
        mods = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            lin = nn.Linear(a, b)
            nn.init.xavier_uniform_(lin.weight)
            nn.init.uniform_(lin.bias, -0.5, 0.5)
            mods.append(lin)
            if i < len(sizes) - 2:
                mods.append(act())
        return nn.Sequential(*mods)

    torch.manual_seed({"readahead": 1, "nfs_rsize": 2, "heimdall": 3}[name])
    if name == "readahead":
        return Normalized(RA_MEAN, RA_STD, mlp([5, 15, 5, 4], nn.Sigmoid)).eval()
    if name == "nfs_rsize":
        return Normalized(NFS_MEAN, NFS_STD, mlp([8, 25, 10, 5, 4], nn.Sigmoid)).eval()
    if name == "heimdall":
        rng = [hi - lo for lo, hi in zip(HD_MIN, HD_MAX)]
        return Normalized(HD_MIN, rng, mlp([11, 128, 16, 1], nn.ReLU), "sigmoid").eval()
    raise KeyError(name)


IN_FEATURES = {"readahead": 5, "nfs_rsize": 8, "heimdall": 11}


def sample_inputs(name: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` raw feature rows in the model's realistic range (float32)."""
    r = np.random.default_rng(seed)
    if name == "readahead":
        var = r.normal(512.9, 79.7, n)
        x = np.stack([np.abs(r.normal(50766.9, 47039.5, n)), var, var * (1 + 1e-4),
                      np.abs(r.normal(66.5, 163.6, n)),
                      r.choice([16, 256, 640, 960], n) / 1024.0], axis=1)
    elif name == "nfs_rsize":
        x = np.abs(r.normal(NFS_MEAN, NFS_STD, (n, 8)))
        x[:, 7] = 2.0 ** r.integers(0, 7, n)  # rsize 4K..256K in pages
    elif name == "heimdall":
        size = 2.0 ** r.integers(9, 21, (n, 1))
        q = r.integers(0, 64, (n, 4)).astype(np.float64)
        lat = r.lognormal(5.5, 1.0, (n, 3))
        tput = r.uniform(0, 4096, (n, 3))
        x = np.concatenate([size, q, lat, tput], axis=1)
    else:
        raise KeyError(name)
    return x.astype(np.float32)


def export(name: str, path: Path, *, dynamo: bool = True, batch: int = 1) -> Path:
    import torch

    model = build(name)
    x = torch.zeros(batch, IN_FEATURES[name])
    torch.onnx.export(model, (x,), str(path), dynamo=dynamo, external_data=False,
                      input_names=["features"], output_names=["output"])
    return path


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    for name in (sys.argv[1:] or IN_FEATURES):
        print(export(name, HERE / f"{name}.onnx"))
