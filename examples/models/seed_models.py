"""The model shapes of kmlc's seed papers, as PyTorch modules.

  readahead   KML readahead (brief §2): 5 -> 15 -> 5 -> 4, sigmoid, z-score
              normalization with the paper's training-set means and stds
  nfs_rsize   KML NFS rsize: 8 -> 25 -> 10 -> 5 -> 4, sigmoid, z-score
  heimdall    Heimdall admission: 11 -> 128 -> 16 -> 1, ReLU, sigmoid output,
              min-max normalization; decline when the output is >= 0.5

Each is trained for a few seconds on synthetic, class-conditional feature
rows (``sample_inputs``): four workload classes for readahead and NFS
(readrandom, readrandomwriterandom, readseq, readreverse) and fast/slow
periods for Heimdall.  The data imitates the features' realistic raw ranges
and gives the models real decision boundaries; it is not a trace, so these
are test models for the compiler, not policies.  The worked examples train
policies on traces.

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

IN_FEATURES = {"readahead": 5, "nfs_rsize": 8, "heimdall": 11}
CLASSES = {"readahead": 4, "nfs_rsize": 4, "heimdall": 2}


def sample_inputs(name: str, n: int, seed: int = 0, labels: bool = False):
    """``n`` raw feature rows (float32) drawn from the synthetic classes in
    equal shares, and with ``labels=True`` their class labels."""
    r = np.random.default_rng(seed)
    y = r.integers(0, CLASSES[name], n)
    if name == "readahead":
        # transactions/s, offset variance over the range (two estimators),
        # mean |page delta|, readahead / 1024
        tx = np.choose(y, [r.normal(30000, 9000, n), r.normal(15000, 5000, n),
                           r.normal(90000, 20000, n), r.normal(60000, 15000, n)])
        var = np.choose(y, [r.normal(590, 25, n), r.normal(560, 35, n),
                            r.normal(480, 35, n), r.normal(455, 35, n)])
        delta = np.choose(y, [r.uniform(200, 800, n), r.uniform(80, 500, n),
                              r.uniform(0.5, 3, n), r.uniform(2, 9, n)])
        ra = r.choice([16, 256, 640, 960], n) / 1024.0
        x = np.stack([np.abs(tx), var, var * (1 + 1e-4), delta, ra], axis=1)
    elif name == "nfs_rsize":
        seq = y >= 2
        x = np.abs(r.normal(NFS_MEAN, NFS_STD, (n, 8))) * 0.3
        x[:, 0] += np.where(seq, 3000, 900) * r.uniform(0.5, 1.5, n)      # events
        x[:, 1] += np.where(seq, 400, 1400) * r.uniform(0.6, 1.4, n)      # latency
        x[:, 2] += np.where(y == 1, 2400, 300) * r.uniform(0.6, 1.4, n)   # read gap
        x[:, 3] += np.where(y == 3, 2400, 300) * r.uniform(0.6, 1.4, n)   # done gap
        x[:, 4] += np.where(seq, 8, 600) * r.uniform(0.5, 1.5, n)         # |read delta|
        x[:, 5] += np.where(seq, 4, 400) * r.uniform(0.5, 1.5, n)         # |page delta|
        x[:, 6] += np.where(y == 1, 40, 5) * r.uniform(0.5, 1.5, n)       # reclaimed
        x[:, 7] = 2.0 ** r.integers(0, 7, n)                              # rsize/4K
    elif name == "heimdall":
        slow = y == 1
        size = 2.0 ** r.integers(9, 21, n)
        q = r.poisson(np.where(slow, 12, 6)[:, None], (n, 4)).astype(np.float64)
        lat = r.lognormal(np.where(slow, 6.6, 5.8)[:, None], 0.8, (n, 3))
        tput = size[:, None] / np.maximum(lat, 1.0) * r.uniform(0.5, 1.5, (n, 3))
        x = np.concatenate([size[:, None], q, np.minimum(lat, 20000),
                            np.minimum(tput, 4096)], axis=1)
    else:
        raise KeyError(name)
    x = x.astype(np.float32)
    return (x, y) if labels else x


def build(name: str, train: bool = True):
    """The model, trained on synthetic rows (deterministic on one machine)."""
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
            mods.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                mods.append(act())
        return nn.Sequential(*mods)

    torch.manual_seed({"readahead": 1, "nfs_rsize": 2, "heimdall": 3}[name])
    if name == "readahead":
        model = Normalized(RA_MEAN, RA_STD, mlp([5, 15, 5, 4], nn.Sigmoid))
    elif name == "nfs_rsize":
        model = Normalized(NFS_MEAN, NFS_STD, mlp([8, 25, 10, 5, 4], nn.Sigmoid))
    elif name == "heimdall":
        rng = [hi - lo for lo, hi in zip(HD_MIN, HD_MAX)]
        model = Normalized(HD_MIN, rng, mlp([11, 128, 16, 1], nn.ReLU), "sigmoid")
    else:
        raise KeyError(name)
    if train:
        x, y = sample_inputs(name, 6000, seed=100, labels=True)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        with torch.enable_grad():
            _fit(model, opt, name, x, y)
    return model.eval()


def _fit(model, opt, name, x, y):
    from torch import nn

    for _ in range(600):
        opt.zero_grad()
        out = model(x)
        if name == "heimdall":
            loss = nn.functional.binary_cross_entropy(out[:, 0], y.float())
        else:
            loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()


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
