"""Readahead policies, and one simulated run of a workload under one of them.

  default   Linux's default, ra_pages 32 (128 KiB, 256 sectors) for every file
  fixed-N   ra_pages N for every file (blockdev --setra N*8)
  learned   the kmlc hook: runtime-kernel/kml_ra.c's kml_ra_miss() on each
            page_cache_sync_ra()/page_cache_async_ra() call, with the
            compiled model's own feature encoding and decision code
            (kmlc.features.ReadaheadStream + Twin.decide) and its class table
  explore   for training traces: the hook's windows, and at each window's
            close a random class's ra_pages (so the current-readahead
            feature takes every value it takes in deployment)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .sim import DEVICES, PAGE_SIZE, Cpu, File, Sim
from .workloads import APPEND, APPEND_BYTES, CLASSES, CpuCosts, Db, generate

DEFAULT_RA = 32                       # VM_READAHEAD_PAGES: 128 KiB
WINDOW_EVENTS, WINDOW_MS = 64, 1000   # the hook's module parameters, at their defaults
EXPLORE_RA = (2, 32, 80, 120)         # the values a file's ra_pages takes under KML's table


def hook_table(outdir: Path, param: str, hook: str) -> list[int]:
    """The class -> value table a model compiled with --hooks HOOK starts
    with: its per-class module parameter PARAM (ra_pages, rsize), as
    kmlc.json records it."""
    params = json.loads(Path(outdir, "kmlc.json").read_text()).get("hook_params", {})
    if param not in params:
        raise FileNotFoundError(f"{outdir}: no {param} table (compile with --hooks {hook})")
    return [int(v) for v in params[param]]


def checked_in_table() -> list[int]:
    """run.py's class table (results/results.json): class -> ra_pages."""
    here = Path(__file__).resolve().parent
    return json.loads((here / "results" / "results.json").read_text())["class_table"]["table"]


def hook_options(table: list[int]) -> tuple[str, ...]:
    """kmlc compile's options for the readahead hook with ``table``."""
    return ("--hooks", "readahead", "--hook-param", "ra_pages=" + ",".join(map(str, table)))


def class_table(outdir: Path) -> list[int]:
    """The class -> ra_pages table of a model compiled with --hooks readahead."""
    return hook_table(outdir, "ra_pages", "readahead")


class LearnedHook:
    """kml_miss() of the generated readahead hook, on the simulator.

    Per file: the class of its last window (-1 before the first) and the
    ra_pages it maps to.  On each call, a file with a class gets that
    ra_pages back; the miss goes into the file's window; a window that
    closes is classified.  A fixed-point model decides inline, so its class
    applies to this very call; a float model runs in a work item, so its
    class applies from the file's next call (the work item is taken to run
    before then).  CPU: ``hook_event_ns`` per call, ``hook_infer_ns`` per
    inference.
    """

    def __init__(self, outdir: Path, cpu: Cpu = Cpu(), record: bool = False):
        import kmlc
        from kmlc import features

        self.twin = kmlc.load(outdir)
        self.deferred = not self.twin.fixed
        self.table = class_table(outdir)
        self.stream = features.ReadaheadStream(window_events=WINDOW_EVENTS, window_ms=WINDOW_MS,
                                               frac=self.twin.hook_frac)
        self.cpu = cpu
        self.files: dict[int, list] = {}   # id -> [class, ra_pages, pending class]
        self.decisions = np.zeros(len(self.table), dtype=np.int64)
        self.windows: list | None = [] if record else None   # (features, class) per window

    def __call__(self, sim: Sim, f: File, index: int, t: int) -> int:
        s = self.files.setdefault(f.id, [-1, 0, -1])
        if s[2] >= 0:                              # the work item has run
            s[0], s[1], s[2] = s[2], self.table[s[2]], -1
        if s[0] >= 0:
            f.ra.ra_pages = s[1]                   # keep the model's choice
        sim.now += self.cpu.hook_event_ns
        seen = f.ra.ra_pages
        feats = self.stream.add(t, f.id, index, seen)
        if feats is None:
            return seen
        cls = int(self.twin.decide(feats)[0])
        sim.now += self.cpu.hook_infer_ns
        if self.windows is not None:
            self.windows.append((feats, cls))
        self.decisions[cls] += sim.measuring
        if self.deferred:
            s[2] = cls
        else:
            s[0], s[1] = cls, self.table[cls]
            f.ra.ra_pages = s[1]
        return seen


class GuardedHook(LearnedHook):
    """The same hook with the module's guards (``--guard``: kml_guard.h,
    through ``twin.guard_session()``): each window's class passes them with
    the file's own readahead as the default (-1), as kml_ra_decided() does,
    and the window a decision ran under reports its cost
    (``ReadaheadStream.last_cost``: ns per page the reader consumed) on the
    decision's A/B arm when it closes.  ``applied`` counts the decisions
    by what decided them."""

    def __init__(self, outdir: Path, cpu: Cpu = Cpu(), cfg: dict | None = None):
        super().__init__(outdir, cpu)
        self.guard = self.twin.guard_session(cfg, nkeys=KEYS)
        self.keys: dict[int, int] = {}
        self.own: dict[int, int] = {}      # id -> the file's own readahead
        self.arm: dict[int, int] = {}      # id -> the arm of the decision in force

    def __call__(self, sim: Sim, f: File, index: int, t: int) -> int:
        s = self.files.setdefault(f.id, [None, 0, None])
        own = self.own.setdefault(f.id, f.ra.ra_pages)
        if s[2] is not None:                       # the work item has run
            s[0], s[1], s[2] = s[2], own if s[2] < 0 else self.table[s[2]], None
        if s[0] is not None:
            f.ra.ra_pages = s[1]
        sim.now += self.cpu.hook_event_ns
        seen = f.ra.ra_pages
        feats = self.stream.add(t, f.id, index, seen)
        if feats is None:
            return seen
        arm = self.arm.pop(f.id, 2)
        if arm != 2:
            self.guard.cost(arm, self.stream.last_cost)
        cls = int(self.twin.decide(feats)[0])
        sim.now += self.cpu.hook_infer_ns
        self.decisions[cls] += sim.measuring
        key = self.keys.setdefault(f.id, len(self.keys) % KEYS)
        d, _, self.arm[f.id] = self.guard.decide(cls, -1, key=key, now=t)
        if self.deferred:
            s[2] = d
        else:
            s[0], s[1] = d, own if d < 0 else self.table[d]
            f.ra.ra_pages = s[1]
        return seen


KEYS = 1024                              # the hook's table: 64 sets x 16 ways


class ExploreHook:
    """The hook's windows without a model: each closed window's features
    (float encoding) are kept, then the file gets a random ra_pages from
    ``values`` with probability ``p``."""

    def __init__(self, rng: np.random.Generator, p: float = 0.5, values=EXPLORE_RA):
        from kmlc import features

        self.rng, self.p, self.values = rng, p, tuple(values)
        self.stream = features.ReadaheadStream(window_events=WINDOW_EVENTS, window_ms=WINDOW_MS)
        self.rows: list[np.ndarray] = []

    def __call__(self, sim: Sim, f: File, index: int, t: int) -> int:
        seen = f.ra.ra_pages
        feats = self.stream.add(t, f.id, index, seen)
        if feats is not None:
            self.rows.append(feats)
            if self.rng.random() < self.p:
                f.ra.ra_pages = int(self.rng.choice(self.values))
        return seen


def measured_ops(workload: str, db: Db, quick: bool = False) -> tuple[int, int]:
    """(warm-up, measured) operation counts.  Sequential workloads run one
    pass over the database from a cold cache; the others warm the cache
    (twice its size in operations) before measuring."""
    blocks = db.files * db.blocks_per_file
    if workload in ("readseq", "readreverse"):
        return 0, blocks
    return 2 * db.cache_pages, (2 if quick else 3) * db.cache_pages


def replay(sim, db: Db, ra_pages: int, ops, warm: int, until=None, access: str = "pread") -> None:
    """Runs db_bench operations (rows {kind, file, block, cpu ns}) on a
    page-cache simulator (``Sim`` or the NFS client's), over the database's
    files and its write-ahead log, each with ``ra_pages`` of readahead;
    measuring starts at operation ``warm``.  ``until()``, checked every 64
    operations, ends the run early when true.  ``access``: the database
    files are read with "pread" or through "mmap" (RocksDB's
    use_mmap_reads; ``Sim`` only)."""
    files = [File(i, db.file_pages * PAGE_SIZE, ra_pages) for i in range(db.files)]
    files.append(File(db.files, 0, ra_pages))             # the write-ahead log
    bb = db.block_bytes
    read = {"pread": sim.read, "mmap": getattr(sim, "mmap_read", None)}[access]
    append, think = sim.append, sim.think
    for n, (kind, fid, block, cpu_ns) in enumerate(ops):
        if n == warm:
            sim.start_measuring()
        if kind == APPEND:
            append(files[fid], APPEND_BYTES)
        else:
            read(files[fid], block * bb, bb)
        think(cpu_ns)
        sim.stats.ops += 1
        if until is not None and not n & 63 and until():
            break


def run(workload: str, device: str, policy: str, db: Db, *, seed: int, warm: int,
        measure: int, outdir: Path | None = None, trace: list | None = None,
        hook=None, cpu: Cpu = Cpu(), app: CpuCosts = CpuCosts(), access: str = "pread") -> dict:
    """One run: the same operations (``seed``) whatever the policy.
    ``policy``: "default", "fixed-N", "learned" or "guarded" (needs
    ``outdir``, a compiled model; guarded: compiled with --guard) or
    "explore" (needs ``hook``)."""
    if policy == "default":
        ra = DEFAULT_RA
    elif policy.startswith("fixed-"):
        ra = int(policy[6:])
    elif policy == "learned":
        hook = hook or LearnedHook(outdir, cpu)
        ra = DEFAULT_RA
    elif policy == "guarded":
        hook = hook or GuardedHook(outdir, cpu)
        ra = DEFAULT_RA
    elif policy == "explore":
        ra = DEFAULT_RA
    else:
        raise ValueError(f"unknown policy {policy!r}")
    sim = Sim(DEVICES[device], db.cache_pages, cpu, hook=hook, trace=trace)
    replay(sim, db, ra, generate(workload, db, warm + measure, seed, app).tolist(), warm,
           access=access)
    out = sim.result()
    if isinstance(hook, LearnedHook):
        out["decisions"] = {c: int(v) for c, v in zip(CLASSES, hook.decisions)}
    if isinstance(hook, GuardedHook):
        out["guard"] = hook.guard.counters
    return out
