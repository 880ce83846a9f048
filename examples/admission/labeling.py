"""Heimdall's period-based labeling with 3-stage noise filtering (§3.1,
§3.2, Figure 4), and LinnOS's latency-cutoff labeling.

Followed step for step from the paper and its artifact (the labeling script
of ucare-uchicago/Heimdall, "tail_v1"), on the I/Os one admission target
sent to its primary (the artifact labels every I/O of the device, reads and
writes, and keeps the reads' labels: ``train.read_labels``), in submission
order, with each I/O's latency (us) and throughput (size / latency, B/us:
the paper's only size normalization, "throughput also takes I/O size into
account"):

1. Thresholds (§3.1 line 4): the "inflection point" of the latency and of
   the throughput distribution (``tangent_ip``), and their medians.
2. Period starts (line 9, IsBusy): an I/O whose latency is not below the
   latency IP and whose throughput is not above the throughput IP, and
   whose throughput dropped by a factor >= 1.7 from the previous I/O's.
3. Periods (lines 11-15): from a start, every following I/O is slow until
   the first I/O from which the next 3 (itself included) all have
   throughput >= the median; that I/O ends the period (it is fast, and the
   artifact does not test it as a new start).
4. Noise filtering (§3.2), outliers removed from the data set:
   stage 1, in a slow period: I/Os with latency <= the median and
   throughput >= the median; stage 2, outside: I/Os with latency > the
   latency IP and throughput < the median; stage 3, after removing those:
   slow runs of at most 3 I/Os (the artifact does not test a run that
   reaches the end of the data).

The paper finds the thresholds of steps 2 and 4 with a gradient-descent
search per data set (§3.1, Figure 3d); its artifact, and this example, use
the fixed values above (drop factor 1.7, runs of 3).  ``Params`` holds
them; ablation.py searches them on the training traces.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Params(NamedTuple):
    drop: float = 1.7       # throughput drop that can start a slow period
    future: int = 3         # I/Os that must be fast to end one
    short: int = 3          # slow runs this short are noise


ARTIFACT = Params()


def tangent_ip(values) -> tuple[float, float]:
    """The inflection point of a distribution (the artifact's
    ``default_ip_finder.tangent_based``): drop values above p97 (and
    infinities), scale by the maximum, and take the x in [0, 1] (10,000
    steps) where ECDF(x) - x is largest.  Returns (threshold in the
    values' unit, truncated to an integer; its percentile)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    v = v[v <= np.percentile(v, 97)]
    top = v.max()
    s = np.sort(v / top)
    x = np.linspace(0.0, 1.0, 10000)
    ecdf = np.searchsorted(s, x, side="right") / len(s)
    k = int(np.argmax(ecdf - x))
    return float(int(x[k] * top)), float(ecdf[k] * 0.97 * 100)


def thresholds(lat, thpt) -> tuple[float, float, float, float]:
    """(latency IP, throughput IP, median latency, median throughput)."""
    return (tangent_ip(lat)[0], tangent_ip(thpt)[0], float(np.percentile(lat, 50)),
            float(np.percentile(thpt, 50)))


def period_labels(latency_us, size, limits=None,
                  params: Params = ARTIFACT) -> tuple[np.ndarray, np.ndarray]:
    """(labels, keep): 1 for an I/O in a slow period; ``keep`` is False for
    the noise the 3 stages remove.  I/Os in submission order; ``limits``
    overrides ``thresholds()``, ``params`` the artifact's constants."""
    min_drop, future, short = params
    lat = np.asarray(latency_us, dtype=np.float64)
    thpt = np.round(np.asarray(size, dtype=np.float64) / lat)
    n = len(lat)
    ip_lat, ip_thpt, med_lat, med_thpt = limits or thresholds(lat, thpt)

    prev = np.concatenate([[0.0], thpt[:-1]])
    drop = np.round(prev / (thpt + 0.1), 1)
    start = ~((thpt > ip_thpt) | (lat < ip_lat)) & (drop >= min_drop)
    # fast[k]: reads k .. k+2 all have throughput >= median (missing ones count as 0)
    ok = np.concatenate([thpt >= med_thpt, np.zeros(future - 1, bool)])
    fast = np.all([ok[j:j + n] for j in range(future)], axis=0)

    slow = np.zeros(n, bool)
    i = 0
    while i < n:
        if start[i]:
            slow[i] = True
            while i < n - 1:
                i += 1
                if fast[i]:
                    break
                slow[i] = True
        i += 1

    keep = ~np.where(slow, (lat <= med_lat) & (thpt >= med_thpt),       # stage 1
                     (lat > ip_lat) & (thpt < med_thpt))                 # stage 2
    idx = np.flatnonzero(keep)                                            # stage 3
    s = slow[idx]
    j = 0
    while j < len(s):
        if s[j]:
            run = 1
            while j < len(s) - 1:
                j += 1
                if not s[j]:
                    if run <= short:
                        keep[idx[j - run:j]] = False
                    break
                run += 1
        j += 1
    return slow.astype(np.int64), keep


def cutoff_labels(latency_us) -> tuple[np.ndarray, float]:
    """LinnOS's labels as Heimdall's artifact trains it: slow when the
    latency is at or above the cutoff at the inflection point's percentile.
    Returns (labels, cutoff in us)."""
    lat = np.asarray(latency_us, dtype=np.float64)
    _, pct = tangent_ip(lat)
    cut = np.percentile(lat, int(pct))
    return (lat >= cut).astype(np.int64), float(cut)
