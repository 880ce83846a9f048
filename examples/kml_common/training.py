"""KML's model recipe, shared by the examples: an MLP with sigmoids between
its layers and z-score normalization (the training set's means and
standard deviations) as its first operation, so the exported ONNX takes raw
features; cross-entropy, SGD with the paper's learning rate 0.01 and
momentum 0.99, mini-batches of 64; k-fold cross-validation.  Everything is
seeded: the same rows and seed give the same model, bit for bit (with
torch.use_deterministic_algorithms(True) and one thread)."""
from __future__ import annotations

import numpy as np


def zscore_mlp(mean, std, sizes):
    """(x - mean) / std, then Linear(sizes[0], sizes[1]), Sigmoid, ...,
    Linear(sizes[-2], sizes[-1])."""
    import torch
    from torch import nn

    class KmlMlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32))
            layers = []
            for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
                layers += [nn.Sigmoid()] if i else []
                layers.append(nn.Linear(a, b))
            self.net = nn.Sequential(*layers)

        def forward(self, x):
            return self.net((x - self.mean) / self.std)

    return KmlMlp()


def fit(x: np.ndarray, y: np.ndarray, seed: int, sizes, epochs: int = 60):
    """Trains a fresh zscore_mlp of ``sizes`` on (x, y); deterministic for a
    given seed.  A feature constant in training (std under 1e-6) gets zero
    first-layer weights, which its zero normalized input keeps at zero: a
    value it never took in training cannot sway the model."""
    import torch

    torch.manual_seed(seed)
    mean = x.mean(0).astype(np.float64)
    std = x.std(0).astype(np.float64)
    const = std < 1e-6
    std[const] = 1.0
    model = zscore_mlp(mean.tolist(), std.tolist(), sizes)
    with torch.no_grad():
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


def cross_validate(x: np.ndarray, y: np.ndarray, seed: int, sizes, k: int = 10,
                   epochs: int = 60):
    """k-fold CV (folds from a seeded permutation): per-fold accuracy and the
    summed confusion matrix (rows: true class, columns: predicted)."""
    order = np.random.default_rng(seed).permutation(len(x))
    folds = np.array_split(order, k)
    n = sizes[-1]
    accs, conf = [], np.zeros((n, n), dtype=np.int64)
    for i, test in enumerate(folds):
        train = np.concatenate([f for j, f in enumerate(folds) if j != i])
        model = fit(x[train], y[train], seed + 1 + i, sizes, epochs)
        pred = predict(model, x[test])
        accs.append(float((pred == y[test]).mean()))
        np.add.at(conf, (y[test], pred), 1)
    return accs, conf


def export(model, path) -> None:
    """ONNX, input "features" (N, inputs), output "logits" (N, classes)."""
    import torch

    torch.onnx.export(model, (torch.zeros(1, model.mean.shape[0]),), str(path), dynamo=False,
                      input_names=["features"], output_names=["logits"],
                      dynamic_axes={"features": {0: "N"}, "logits": {0: "N"}})
