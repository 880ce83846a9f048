"""Training data, the KML readahead model, 10-fold cross-validation, export.

Training rows are the hook's windows on the simulator's readahead calls
(experiment.ExploreHook): KML's five features, as kmlc.features computes
them with the float model's encoding, labelled with the workload that
produced them, half read with pread() and half through mmap.  As in the
KML paper, training uses the four db_bench workloads on the NVMe device
only; mixgraph and the SATA device stay unseen.

The class table (the readahead each class gets) is chosen as KML chose
its: each training workload runs on the training device under every
candidate readahead, and its class gets the one with the best throughput
(``sweep``, ``choose_table``).

The model is the paper's: 5 -> 15 -> 5 -> 4 with sigmoids, cross-entropy,
SGD with momentum, z-score normalization (the training set's means and
standard deviations) as the model's first operation, so the exported ONNX
takes raw features.
"""
from __future__ import annotations

import numpy as np

from kml_common import training

from .experiment import DEFAULT_RA, EXPLORE_RA, ExploreHook, measured_ops, run
from .workloads import CLASSES, Db

FEATURES = ("transactions", "variance/range", "variance/range (n-1)", "mean |delta page|",
            "readahead (sectors/1024)")


ACCESS = ("pread", "mmap")
# Candidate readahead sizes, pages (KML tried 20 sizes from 8 to 1024).
CANDIDATES = (2, 4, 8, 16, 32, 64, 128, 256)


def explore_rows(workload: str, label: int, seed: int, db: Db, windows: int,
                 device: str = "nvme", access: str = "pread",
                 values=EXPLORE_RA) -> np.ndarray:
    """About ``windows`` encoded feature rows of one workload, from one
    explore run (the hook's float encoding, int32); ``values``: the
    readahead sizes the explore policy gives files."""
    hook = ExploreHook(np.random.default_rng([seed, label, ACCESS.index(access)]),
                       values=values)
    run(workload, device, "explore", db, seed=seed * 100 + label, warm=0,
        measure=_ops_for(workload, db, windows, access), hook=hook, access=access)
    return np.array(hook.rows, dtype=np.int32).reshape(-1, 5)


def collect(db: Db, seeds: tuple[int, ...], per_class: int, pmap=map, values=EXPLORE_RA):
    """``per_class`` windows of each training workload (fewer if the runs
    give fewer), decoded to float32, from explore runs with the given
    seeds, both access modes, files given readahead sizes from ``values``
    (those of the class table and the default, so the current-readahead
    feature takes the values it takes once the model is in charge);
    returns (X, y).  ``pmap``: a map function (e.g. a pool's)."""
    from kmlc import features

    frac = np.exp2(features.ra_float_frac().astype(np.float64))
    each = -(-per_class // (len(seeds) * len(ACCESS)))
    jobs = [(w, label, seed, db, each, "nvme", access, tuple(values))
            for label, w in enumerate(CLASSES) for seed in seeds for access in ACCESS]
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


def _ops_for(workload: str, db: Db, windows: int, access: str = "pread") -> int:
    """Operations that give roughly ``windows`` windows of 64 calls under the
    explore policy (readseq makes a call per 2..120 pages; readreverse one
    per block with pread, one per fault through mmap, where read-around
    brings ra_pages / 2 pages below each; the others about one per
    operation or two)."""
    per_op = {"readseq": 0.014, "readreverse": 1.0 if access == "pread" else 0.036
              }.get(workload, 0.5)
    ops = int(windows * 64 / per_op * 1.2)
    if workload == "readseq":   # whole passes over the database
        blocks = db.files * db.blocks_per_file
        ops = max(1, -(-ops // blocks)) * blocks
    return ops


def sweep(db: Db, seed: int, pmap=map, device: str = "nvme") -> dict:
    """Each training workload, read both ways, under each candidate fixed
    readahead on the training device: {workload: {access: {pages: MB/s}}}.
    Random workloads measure one cache's worth of operations after the
    warm-up; sequential ones one pass."""
    jobs = [(w, access, ra, db, seed, device) for w in CLASSES for access in ACCESS
            for ra in CANDIDATES]
    out: dict = {}
    for (w, access, ra, *_), mbs in zip(jobs, pmap(_sweep_job, jobs)):
        out.setdefault(w, {}).setdefault(access, {})[ra] = mbs
    return out


def _sweep_job(args) -> float:
    w, access, ra, db, seed, device = args
    warm, measure = measured_ops(w, db)
    if warm:
        measure = db.cache_pages
    return run(w, device, f"fixed-{ra}", db, seed=seed * 100 + 50, warm=warm, measure=measure,
               access=access)["throughput_mb_s"]


def choose_table(swept: dict) -> list[int]:
    """Per class, the candidate with the best throughput relative to the
    kernel's default (DEFAULT_RA), averaged over the access modes; the
    smaller readahead on a tie."""
    table = []
    for w in CLASSES:
        per = swept[w]
        score = {ra: sum(per[a][ra] / per[a][DEFAULT_RA] for a in per) / len(per)
                 for ra in CANDIDATES}
        table.append(max(CANDIDATES, key=lambda ra: (round(score[ra], 6), -ra)))
    return table


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
