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

from kml_common import training

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


SIZES = (5, 15, 5, 4)


def fit(x: np.ndarray, y: np.ndarray, seed: int, epochs: int = 60):
    """Trains a fresh model on (x, y); deterministic for a given seed.  The
    window size (feature 0) is constant in training (windows close at
    window_events calls), so it gets zero weights (training.fit): a
    time-closed window in deployment cannot sway the model."""
    return training.fit(x, y, seed, SIZES, epochs)


def cross_validate(x: np.ndarray, y: np.ndarray, seed: int, k: int = 10, epochs: int = 60):
    return training.cross_validate(x, y, seed, SIZES, k, epochs)


predict, export = training.predict, training.export
