"""Training data, labels and models for the admission example.

Data: the baseline policy (every read to its primary) on the training
traces; each admission target's reads and completions (of reads and
writes), exactly as the hook records them (``sim.AdmissionHook`` with an
always-admit decision), go through ``kmlc.features.admission``: the
module's own feature C, so the model trains on the features the module
computes (integers; throughput in B/us to 1/256).  The labels: Heimdall's
period-based labeling with 3-stage noise filtering (labeling.py) over
every I/O the target sent to its primary, writes included, in submission
order, of which the reads' labels are kept (``read_labels``), as
Heimdall's artifact labels its replayed traces.

Split (Heimdall §6: 50:50 train/test): per target, the first half of its
reads in time trains, the second half tests; no shuffling across the
split.  (Heimdall's artifact splits at random; a time split is the honest
one for a policy that will run on the future.)  Noise-filtered reads are
left out of training; test metrics are given on every test read and on
the filtered ones (as the paper reports them).

Models (PyTorch, seeded, one thread, deterministic):
  heimdall  11 -> 128 ReLU -> 16 ReLU -> 1 sigmoid (§3.5, Figure 9f), min-max
            normalization inside the model (from the training rows),
            binary cross-entropy, Adam (the artifact: lr 1e-4, 20 epochs,
            Keras's batch 32; here lr 1e-3, batch 256, 12 epochs, to fit
            the example's time budget)
  linnos    31 -> 256 ReLU -> 2 linear on LinnOS's digit features
            (sim.linnos_digits), labels from a latency cutoff at the inflection
            point, categorical hinge loss with false admits (slow predicted
            fast) weighted 5x, Adam lr 1e-3, batch 128, 8 epochs: the
            artifact's LinnOS training (pred1_old.py)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import labeling, sim, traces


@dataclass
class Data:
    x: np.ndarray           # features (float64)
    y: np.ndarray           # labels
    keep: np.ndarray        # not noise (Heimdall's filtering; all True for LinnOS)
    train: np.ndarray       # in the first half of its stream
    events: list = None     # Heimdall: per stream, the hook's events (kmlc.features rows)
    halves: list = None     # per stream, its rows' ``train``
    gc: np.ndarray = None   # Heimdall: the read arrived during its primary's GC (ground truth)
    logs: list = None       # Heimdall: per stream, the hook's log (``read_labels``)


def read_labels(log, label_on: str = "all", limits=None,
                params: labeling.Params = labeling.ARTIFACT) -> tuple[np.ndarray, np.ndarray]:
    """Heimdall's period labels for the reads in a hook's ``log`` (every I/O
    it sent to its primary, in submission order: [1 read or 2 write, bytes,
    latency ns]), as (labels, keep) per read.  ``label_on="all"``: the
    labeling runs over every I/O the device served, writes included, and
    the reads' labels are kept, as Heimdall's artifact does (tail_v1.py
    labels every I/O of the device's replayed trace, sorted by submission;
    feat_v6.py then marks writes non-rejectable and keeps the reads).
    ``"reads"``: over the reads alone (for comparison).  ``limits`` and
    ``params``: see ``labeling.period_labels``."""
    log = np.array(log, dtype=np.int64).reshape(-1, 3)
    if label_on == "reads":
        log = log[log[:, 0] == 1]
    elif label_on != "all":
        raise ValueError(label_on)
    lat_us = np.maximum(1, log[:, 2] // 1000)           # as the hook floors it
    y, keep = labeling.period_labels(lat_us, log[:, 1], limits, params)
    r = log[:, 0] == 1
    return y[r], keep[r]


def label_stats(y, keep, gc) -> dict:
    """How period labels relate to the device state (``gc``: the read
    arrived during its primary's GC), in reads."""
    return {"reads": int(len(y)), "slow": int(y.sum()), "kept": int(keep.sum()),
            "gc_reads": int(gc.sum()), "slow_in_gc": int(y[gc].sum()),
            "slow_outside_gc": int(y[~gc].sum())}


def collect(seeds, cfg, history_writes: bool = True) -> tuple[Data, Data, Data, dict]:
    """Training data from the baseline on ``seeds``: Heimdall's (the hook's
    events and features with the module's ``history_writes``, the
    artifact's labels over every I/O), and LinnOS's over the hook's view
    and over the block layer's."""
    from kmlc import features

    H, L, B = ([] for _ in range(3))
    stats = {"linnos_slow": 0, "linnos_cutoff_us": [], "linnos_slow_in_gc": 0,
             "linnos_slow_outside_gc": 0}
    for seed in seeds:
        tr = traces.generate(seed, cfg)
        rec = sim.heimdall(tr.size, lambda f: 0, features.ADMIT_FRAC, trace=True,
                           history_writes=history_writes)
        lin = sim.linnos(tr.size, record=True)
        blk = sim.LinnOSBlock(tr.size, record=True)
        res = [sim.simulate(tr, p) for p in (rec, lin, blk)]
        for r in res[1:]:                       # all three are the baseline
            assert np.array_equal(r.latency_ns, res[0].latency_ns)
        res = res[0]
        rtime = np.array(tr.t)[~np.array(tr.write)]
        brows = np.array(blk.rows, dtype=np.float64)
        for c in (0, 1):
            m = res.client == c
            lat_us = np.maximum(1, res.latency_ns[m] // 1000)   # as the hook floors it
            ev = np.array(rec.hooks[c].events, np.int64)
            f = features.admission(ev).values
            assert len(f) == m.sum()
            y, keep = read_labels(rec.hooks[c].log)
            assert len(y) == m.sum()
            half = np.arange(len(y)) < len(y) // 2
            # the device state, which no real system sees (for the diagnostics)
            gc = np.array([tr.gc_episode(c, t) >= 0 for t in rtime[m].tolist()])
            H.append((f, y, keep, half, ev, gc, rec.hooks[c].log))
            _, cut = labeling.cutoff_labels(lat_us[half])        # from the training half
            yl = (lat_us >= cut).astype(np.int64)
            L.append((np.array(lin.hooks[c].view.rows, np.float64), yl, half))
            B.append((brows[m], yl, half))
            # how LinnOS's labels relate to the device state
            stats["linnos_slow"] += int(yl.sum())
            stats["linnos_cutoff_us"].append(cut)
            stats["linnos_slow_in_gc"] += int(yl[gc].sum())
            stats["linnos_slow_outside_gc"] += int(yl[~gc].sum())
    cat = np.concatenate
    heim = Data(cat([h[0] for h in H]), cat([h[1] for h in H]), cat([h[2] for h in H]),
                cat([h[3] for h in H]), [h[4] for h in H], [h[3] for h in H],
                cat([h[5] for h in H]), [h[6] for h in H])

    def lin_data(parts):
        y = cat([p[1] for p in parts])
        return Data(cat([p[0] for p in parts]), y, np.ones(len(y), bool),
                    cat([p[2] for p in parts]))
    return heim, lin_data(L), lin_data(B), {**label_stats(heim.y, heim.keep, heim.gc), **stats}


def evenly_spaced(x, n: int) -> np.ndarray:
    """At most ``n`` rows of ``x``, evenly spaced (first and last
    included): the calibration and verification rows."""
    return x[np.linspace(0, len(x) - 1, min(n, len(x))).astype(int)]


def calibration_rows(x, n: int = 4000) -> np.ndarray:
    """The fixed-point calibration: ``n`` evenly spaced rows of ``x`` and,
    per feature, a row where it is lowest and one where it is highest, so
    that the module's input range covers all of ``x`` (kmlc clamps inputs
    to the calibration range)."""
    ext = np.unique(np.concatenate([x.argmin(0), x.argmax(0)]))
    return np.concatenate([evenly_spaced(x, n), x[ext]]).astype(np.float32)


def _torch():
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return torch


def heimdall_module(lo, hi):
    torch = _torch()
    from torch import nn

    class Heimdall(nn.Module):
        """11 -> 128 -> 16 -> 1; min-max normalization is part of the model."""

        def __init__(self):
            super().__init__()
            span = np.where(hi > lo, hi - lo, 1.0)
            self.register_buffer("lo", torch.tensor(lo, dtype=torch.float32))
            self.register_buffer("span", torch.tensor(span, dtype=torch.float32))
            self.net = nn.Sequential(nn.Linear(11, 128), nn.ReLU(), nn.Linear(128, 16),
                                     nn.ReLU(), nn.Linear(16, 1))

        def forward(self, x):
            return torch.sigmoid(self.net((x - self.lo) / self.span))

    return Heimdall()


def linnos_module():
    _torch()
    from torch import nn

    return nn.Sequential(nn.Linear(31, 256), nn.ReLU(), nn.Linear(256, 2))


def _batches(torch, n, batch, gen):
    perm = torch.randperm(n, generator=gen)
    return [perm[i:i + batch] for i in range(0, n, batch)]


def train_heimdall(d: Data, *, epochs: int, seed: int = 1):
    torch = _torch()
    sel = d.train & d.keep
    x = d.x[sel].astype(np.float32)
    torch.manual_seed(seed)
    model = heimdall_module(x.min(0), x.max(0))     # initialized after seeding
    X, Y = torch.from_numpy(x), torch.from_numpy(d.y[sel].astype(np.float32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for b in _batches(torch, len(X), 256, gen):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy(model(X[b])[:, 0], Y[b])
            loss.backward()
            opt.step()
    return model.eval()


def train_lgbm(d: Data, *, seed: int = 1):
    """A LightGBM policy on the same rows and labels as Heimdall's network:
    200 trees of depth 4 (16 leaves), the noise-filtered training rows."""
    import lightgbm as lgb

    sel = d.train & d.keep
    clf = lgb.LGBMClassifier(n_estimators=200, max_depth=4, num_leaves=16, learning_rate=0.05,
                             random_state=seed, n_jobs=1, verbose=-1)
    return clf.fit(d.x[sel].astype(np.float32), d.y[sel])


def export_lgbm(clf, path) -> None:
    """The LightGBM policy as ONNX (onnxmltools, as kmlc's frontend converts
    it), its decision a bool output: decline when the label is slow."""
    import onnx
    from onnx import TensorProto, helper

    from kmlc.frontends import sklearn as sk

    m, _ = sk.convert(clf, np.zeros((1, 11), np.float32))
    g = m.graph
    g.node.append(helper.make_node("Cast", [g.output[0].name], ["decline"], name="decide",
                                   to=TensorProto.BOOL))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("decline", TensorProto.BOOL, [None]))
    onnx.save(m, path)


def train_linnos(d: Data, *, epochs: int = 8, seed: int = 2):
    torch = _torch()
    torch.manual_seed(seed)
    model = linnos_module()
    X = torch.from_numpy(d.x[d.train].astype(np.float32))
    Y = torch.from_numpy(d.y[d.train])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for b in _batches(torch, len(X), 128, gen):
            opt.zero_grad()
            out, y = model(X[b]), Y[b]
            onehot = torch.nn.functional.one_hot(y, 2).float()
            pos = (onehot * out).sum(1)
            neg = ((1 - onehot) * out).max(1).values       # Keras categorical hinge
            hinge = torch.clamp(neg - pos + 1, min=0)
            # LinnOS's custom loss: a slow I/O predicted fast costs 5x
            w = torch.where((y == 1) & (out.argmax(1) == 0), 5.0, 1.0)
            (hinge * w).mean().backward()
            opt.step()
    return model.eval()


def predict(model, x) -> np.ndarray:
    torch = _torch()
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(x, np.float32))).numpy()


def export(model, n_in: int, path) -> None:
    """ONNX with the TorchScript exporter (the dynamo exporter takes
    seconds per model); kmlc reads both."""
    import warnings

    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, n_in),), str(path), dynamo=False,
                          input_names=["features"], output_names=["output"])


def roc_auc(y, score) -> float:
    """Area under the ROC curve: the probability that a random slow read
    scores above a random fast one (ties count half), by ranks."""
    y, score = np.asarray(y), np.asarray(score, np.float64)
    npos, nneg = int(y.sum()), int((1 - y).sum())
    if npos == 0 or nneg == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):                 # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(s))
    r[order] = ranks
    return float((r[y == 1].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def metrics(y, score, decision) -> dict:
    y, dec = np.asarray(y), np.asarray(decision).astype(bool)
    pos, neg = y == 1, y == 0
    return {"rows": int(len(y)), "slow": round(float(pos.mean()), 4),
            "accuracy": round(float((dec == pos).mean()), 4),
            "roc_auc": round(roc_auc(y, score), 4),
            "fpr": round(float(dec[neg].mean()), 4) if neg.any() else None,
            "fnr": round(float((~dec[pos]).mean()), 4) if pos.any() else None}
