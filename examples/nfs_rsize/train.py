"""Training data and the KML NFS rsize model.

Training rows are the hook's windows on the simulator's tracepoints
(experiment.ExploreHook): KML's eight features, as kmlc.features computes
them with the float model's encoding, labelled with the workload that
produced them: the four db_bench workloads KML trained on, over several
network presets (KML trained under several network conditions); mixgraph
stays unseen.  The model is the paper's, 8 -> 25 -> 10 -> 5 -> 4 with
sigmoids and z-score normalization inside (kml_common.training).
"""
from __future__ import annotations

import numpy as np

from kml_common import training
from readahead.experiment import measured_ops
from readahead.workloads import CLASSES, WORKLOADS, Db

from .experiment import ExploreHook, run

SIZES = (8, 25, 10, 5, 4)
FEATURES = ("events/s", "read->done (us)", "gap between reads (us)", "gap between dones (us)",
            "|offset delta| (4 KiB)", "|page delta| (pages)", "pages per reclaim scan",
            "rsize (4 KiB)")


def explore_trace(workload: str, net: str, seed: int, db: Db, windows: int,
                  trace: list | None = None) -> np.ndarray:
    """``windows`` encoded feature rows (the hook's float encoding, int32)
    of one workload under the explore policy, after the warm-up of an
    evaluation run (measured_ops)."""
    hook = ExploreHook(np.random.default_rng([seed, WORKLOADS.index(workload), len(net)]))
    run(workload, net, "explore", db, seed=seed, warm=measured_ops(workload, db)[0],
        measure=None, hook=hook,
        trace=trace, until=lambda: len(hook.rows) >= windows)
    return np.array(hook.rows[:windows], dtype=np.int32).reshape(-1, 8)


def _job(args) -> np.ndarray:
    return explore_trace(*args)


def collect(db: Db, nets, seed: int, per_class: int, pmap=map):
    """``per_class`` windows of each training workload, split evenly over
    ``nets``, decoded to float32; returns (X, y)."""
    from kmlc import features

    frac = np.exp2(features.nfs_float_frac().astype(np.float64))
    jobs = [(w, net, seed, db, per_class // len(nets)) for w in CLASSES for net in nets]
    rows = list(pmap(_job, jobs))
    x = np.concatenate(rows) / frac
    y = np.concatenate([np.full(len(r), CLASSES.index(j[0])) for j, r in zip(jobs, rows)])
    return x.astype(np.float32), y


def fit(x, y, seed, epochs=60):
    return training.fit(x, y, seed, SIZES, epochs)


def cross_validate(x, y, seed, k=10, epochs=60):
    return training.cross_validate(x, y, seed, SIZES, k, epochs)


predict, export = training.predict, training.export
