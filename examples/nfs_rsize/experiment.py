"""rsize policies, and one simulated run of a workload under one of them.

  default    no hook: the rsize the mount negotiated, 1 MiB (a Linux nfsd on a
             server with 4 GiB of RAM or more offers 1 MiB,
             nfsd_get_default_max_blksize(), and the client takes it)
  fixed-N    mount -o rsize=N (N in KiB): rsize and io_pages N from the start
  learned    the kmlc hook: runtime-kernel/kml_nfs.c's kml_event() on every
             tracepoint, with the compiled model's own feature encoding and
             decision code (kmlc.features.NfsStream + Twin.decide), its
             class -> rsize table, and kml_nfs_decide()'s vote and clamps
             (kmlc.features.NfsRsize), on a mount negotiated at 1 MiB
  explore    for training traces: the hook's windows, and at each window's
             close, half of the time, an rsize from EXPLORE_RSIZE (so the
             current-rsize feature takes every value it takes in deployment)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from readahead.experiment import hook_table, replay
from readahead.sim import Cpu
from readahead.workloads import CLASSES, CpuCosts, Db, generate

from .nfs import DONE, NETS, RECLAIM, NfsSim, RpcCosts

NEGOTIATED = 1 << 20
WINDOW_MS = 100                   # the hook's window_ms for this example (KML: 1000; see README)
EXPLORE_RSIZE = (4096, 262144, NEGOTIATED)   # the values rsize takes under the hook
# A tracepoint probe and the hook's window update under its spinlock: cheaper
# than the readahead example's ftrace probe (0.5 us).
CPU = Cpu(hook_event_ns=250)


def ra_419(rsize: int) -> int:
    """Linux 4.19 (KML's kernel), nfs_fs_mount_common(): s_bdi->ra_pages =
    server->rpages * NFS_MAX_READAHEAD (RPC_DEF_SLOT_TABLE - 1 = 15), set
    when the file system is mounted."""
    return 15 * (rsize >> 12)


def rsize_table(outdir: Path) -> list[int]:
    """The class -> rsize table of a model compiled with --hooks nfs-rsize."""
    return hook_table(outdir, "rsize", "nfs-rsize")


class LearnedHook:
    """kml_event() of the generated nfs-rsize hook, on the simulator.

    The mount's negotiated rsize is the one it has when the hook first sees
    it.  Each event goes into the mount's window (kml_nfs_step, with the
    rsize the mount has then); a window that closes is classified, and the
    class's rsize, voted over the last ``vote`` predictions and clamped
    (kml_nfs_decide), becomes the mount's.  A fixed-point model decides in
    the probe, so the new rsize is set at the closing event; a float model
    decides in a work item, taken to run before the mount's next event, which
    sets it.  CPU: ``cpu.hook_event_ns`` per event in the reading task's
    context (READ sent, page added), ``cpu.hook_infer_ns`` per inline
    inference in that context; replies and reclaim run elsewhere.
    """

    def __init__(self, outdir: Path, *, vote: int = 1, cpu: Cpu = CPU, record: bool = False):
        import kmlc
        from kmlc import features

        self.twin = kmlc.load(outdir)
        self.deferred = not self.twin.fixed
        self.table = rsize_table(outdir)
        self.stream = features.NfsStream(window_ms=WINDOW_MS, frac=self.twin.hook_frac)
        self.votes = features.NfsRsize(vote=vote)
        self.cpu = cpu
        self.orig = self.pending = None
        self.chosen = 0                                    # m->rsize: 0 before a decision
        self.decisions = np.zeros(len(self.table), dtype=np.int64)
        self.windows: list | None = [] if record else None   # (features, class, rsize)

    def _decide(self, sim, f: np.ndarray) -> None:
        cls = int(self.twin.decide(f)[0])
        self.chosen = self.votes.decide(self.table[cls], self.orig)
        self.decisions[cls] += sim.measuring
        if self.windows is not None:
            self.windows.append((f, cls, self.chosen))

    def __call__(self, sim: NfsSim, t: int, kind: int, a: int) -> None:
        if kind == RECLAIM:
            self.stream.reclaim(a)
            return
        app = kind != DONE
        if app:
            sim.now += self.cpu.hook_event_ns
        if self.orig is None:
            self.orig = sim.rsize
        if self.pending is not None:                       # the work item has run
            self._decide(sim, self.pending)
            self.pending = None
        cur = sim.rsize
        f = self.stream.event(t, kind, 0, a, cur)
        if f is not None:
            if self.deferred:
                self.pending = f
            else:
                self._decide(sim, f)
                if app:
                    sim.now += self.cpu.hook_infer_ns
        if self.chosen and self.chosen != cur:
            sim.rsize = self.chosen


class ExploreHook:
    """The hook's windows without a model: each window that closes while
    measuring keeps its features (float encoding); at every close, the
    mount gets a random rsize from EXPLORE_RSIZE with probability ``p``."""

    def __init__(self, rng: np.random.Generator, p: float = 0.5):
        from kmlc import features

        self.rng, self.p = rng, p
        self.stream = features.NfsStream(window_ms=WINDOW_MS)
        self.rows: list[np.ndarray] = []

    def __call__(self, sim: NfsSim, t: int, kind: int, a: int) -> None:
        if kind == RECLAIM:
            self.stream.reclaim(a)
            return
        f = self.stream.event(t, kind, 0, a, sim.rsize)
        if f is not None:
            if sim.measuring:
                self.rows.append(f)
            if self.rng.random() < self.p:
                sim.rsize = int(self.rng.choice(EXPLORE_RSIZE))


def policy_rsize(policy: str) -> int:
    if policy in ("default", "learned", "explore"):
        return NEGOTIATED
    if policy.startswith("fixed-") and policy.endswith("k") and policy[6:-1].isdigit():
        return int(policy[6:-1]) * 1024
    raise ValueError(f"unknown policy {policy!r}")


def operations(workload: str, db: Db, n: int | None, seed: int, app: CpuCosts):
    """The workload's operations: ``n`` of them, or (None) without end, in
    chunks of one pass over the database (chunk k seeded with [seed, k])."""
    if n is not None:
        yield from generate(workload, db, n, seed, app).tolist()
        return
    k = 0
    while True:
        yield from generate(workload, db, db.files * db.blocks_per_file, [seed, k], app).tolist()
        k += 1


def run(workload: str, net: str, policy: str, db: Db, *, seed: int, warm: int,
        measure: int | None,
        outdir: Path | None = None, vote: int = 1, hook=None, trace: list | None = None,
        until=None, ra_pages: int = 32, costs: RpcCosts = RpcCosts(),
        app: CpuCosts = CpuCosts()) -> dict:
    """One run: the same operations (``seed``) whatever the policy.
    ``policy``: "default", "fixed-<KiB>k", "learned" (needs ``outdir``, a
    compiled model; ``vote``) or "explore" (needs ``hook``).  ``until()``,
    checked every 64 operations, ends the run early when true (and is
    needed with ``measure`` None: operations without end).  ``ra_pages``:
    the files' readahead (the bdi's: 32 in Linux 6.1; Linux 4.19 gave NFS
    mounts 15 x rpages: ra_419())."""
    rsize = policy_rsize(policy)
    if measure is None and until is None:
        raise ValueError("a run without a measured length needs until()")
    if policy == "learned":
        hook = hook or LearnedHook(outdir, vote=vote)
    sim = NfsSim(NETS[net], db.cache_pages, rsize, CPU, costs, hook=hook, trace=trace)
    ops = operations(workload, db, None if measure is None else warm + measure, seed, app)
    replay(sim, db, ra_pages, ops, warm, until)
    out = sim.result()
    sim.drain()
    if isinstance(hook, LearnedHook):
        out["decisions"] = {c: int(v) for c, v in zip(CLASSES, hook.decisions)}
    return out
