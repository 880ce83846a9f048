"""Training data, the KML readahead model, 10-fold cross-validation, export.

Training rows are the hook's windows on the simulator's readahead calls
(experiment.ExploreHook): KML's five features, as kmlc.features computes
them with the float model's encoding, labelled with the workload that
produced them.  As in the KML paper, training uses the four db_bench
workloads on the NVMe device only; mixgraph and the SATA device stay unseen.

The model is the paper's: 5 -> 15 -> 5 -> 4 with sigmoids, cross-entropy,
SGD with momentum, z-score normalization (the training set's means and
standard deviations) as the model's first operation, so the exported ONNX
takes raw features.
"""
from __future__ import annotations

import numpy as np

from .experiment import ExploreHook, run
from .workloads import CLASSES, Db

FEATURES = ("transactions", "variance/range", "variance/range (n-1)", "mean |delta page|",
            "readahead (sectors/1024)")


def explore_rows(workload: str, label: int, seed: int, db: Db, windows: int,
                 device: str = "nvme") -> np.ndarray:
    """About ``windows`` encoded feature rows of one workload, from one
    explore run (the hook's float encoding, int32)."""
    hook = ExploreHook(np.random.default_rng([seed, label]))
    run(workload, device, "explore", db, seed=seed * 100 + label, warm=0,
        measure=_ops_for(workload, db, windows), hook=hook)
    return np.array(hook.rows, dtype=np.int32).reshape(-1, 5)


def collect(db: Db, seeds: tuple[int, ...], per_class: int, pmap=map):
    """``per_class`` windows of each training workload (fewer if the runs
    give fewer), decoded to float32, from explore runs with the given
    seeds; returns (X, y).  ``pmap``: a map function (e.g. a pool's)."""
    from kmlc import features

    frac = np.exp2(features.ra_float_frac().astype(np.float64))
    jobs = [(w, label, seed, db, -(-per_class // len(seeds)))
            for label, w in enumerate(CLASSES) for seed in seeds]
    rows = list(pmap(_explore_job, jobs))
    xs, ys = [], []
    for label in range(len(CLASSES)):
        x = np.concatenate([r for (_, lab, *_), r in zip(jobs, rows) if lab == label]) / frac
        rng = np.random.default_rng([seeds[0], label, 7])
        take = np.sort(rng.permutation(len(x))[:per_class])     # balance the classes
        xs.append(x[take])
        ys.append(np.full(len(take), label))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def _explore_job(args) -> np.ndarray:
    return explore_rows(*args)


def _ops_for(workload: str, db: Db, windows: int) -> int:
    """Operations that give roughly ``windows`` windows of 64 calls under the
    explore policy (readseq makes a call per 2..120 pages; the others about
    one per operation or two)."""
    per_op = {"readseq": 0.014, "readreverse": 1.0}.get(workload, 0.6)
    ops = int(windows * 64 / per_op * 1.2)
    if workload == "readseq":   # whole passes over the database
        blocks = db.files * db.blocks_per_file
        ops = max(1, -(-ops // blocks)) * blocks
    return ops


def build_model(mean, std):
    import torch
    from torch import nn

    class Readahead(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32))
            self.net = nn.Sequential(nn.Linear(5, 15), nn.Sigmoid(), nn.Linear(15, 5),
                                     nn.Sigmoid(), nn.Linear(5, 4))

        def forward(self, x):
            return self.net((x - self.mean) / self.std)

    return Readahead()


def fit(x: np.ndarray, y: np.ndarray, seed: int, epochs: int = 60):
    """Trains a fresh model on (x, y); deterministic for a given seed."""
    import torch

    torch.manual_seed(seed)
    mean = x.mean(0).astype(np.float64)
    std = x.std(0).astype(np.float64)
    const = std < 1e-6
    std[const] = 1.0                     # a constant feature (see below) normalizes to 0
    model = build_model(mean.tolist(), std.tolist())
    with torch.no_grad():
        # A feature constant in training (the window size: windows close at
        # window_events calls) gets zero weights, which its zero input keeps
        # at zero: a time-closed window in deployment cannot sway the model.
        model.net[0].weight[:, torch.from_numpy(const)] = 0.0
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.99)   # the paper's
    gen = torch.Generator().manual_seed(seed)
    lossf = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            lossf(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def predict(model, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).argmax(1).numpy()


def cross_validate(x: np.ndarray, y: np.ndarray, seed: int, k: int = 10, epochs: int = 60):
    """k-fold CV (folds from a seeded permutation): per-fold accuracy and the
    summed confusion matrix (rows: true class, columns: predicted)."""
    order = np.random.default_rng(seed).permutation(len(x))
    folds = np.array_split(order, k)
    accs, conf = [], np.zeros((4, 4), dtype=np.int64)
    for i, test in enumerate(folds):
        train = np.concatenate([f for j, f in enumerate(folds) if j != i])
        model = fit(x[train], y[train], seed + 1 + i, epochs)
        pred = predict(model, x[test])
        accs.append(float((pred == y[test]).mean()))
        np.add.at(conf, (y[test], pred), 1)
    return accs, conf


def export(model, path) -> None:
    import torch

    torch.onnx.export(model, (torch.zeros(1, 5),), str(path), dynamo=False,
                      input_names=["features"], output_names=["logits"],
                      dynamic_axes={"features": {0: "N"}, "logits": {0: "N"}})
