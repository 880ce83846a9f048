"""Synthetic traces for two replicated SSDs with period-based slowdowns.

Two clients each replay their own I/O stream; client c's reads go to its
primary, replica c, unless a policy reroutes them to the other replica;
writes go to both replicas (they keep the replicas in sync).  This is the
setup of Heimdall's §6.1 evaluation (a 2-way replicated store, one trace per
device, a declined read goes to the other device), with the writes
replicated, as a replicated store does.

Each replica is modelled on the Samsung 970 PRO 1 TB, the device of
Heimdall §6.1.  What makes a read slow, and why it comes in periods:

* Garbage collection.  Every ``gc_mib`` MiB written to a device (+-50% per
  episode) it collects garbage for ``gc_ms`` ms.  During an episode a read
  finds its die busy with a probability drawn per episode (``gc_hit``) and
  then waits for the die's current erase or copy, uniform in
  [0, t_erase].  Consecutive reads are hit: the period-based slowdowns of
  Heimdall §3.1 ("SSD internal management ... affects consecutive I/Os in a
  period").
* Write bursts.  Writes are acknowledged from the device's DRAM, but their
  data is then programmed to NAND: a read finds its die programming with
  probability rho = (bytes written in the last 5 ms / 5 ms) / nand_mbps and
  then waits uniform in [0, t_prog].  A client's write burst (about one per
  second, 20-100 ms of large writes) thus slows every read on both devices
  for its duration, and brings the next GC episode closer.
* Rare isolated slow reads (read retry, ECC: Heimdall §3.2's "outliers
  within the fast period").

Device, from the 970 PRO 1 TB datasheet: 3,500 / 2,700 MB/s sequential
read / write; 15K IOPS random 4 KiB reads at QD1 (67 us) and 55K IOPS
random writes at QD1 (18 us); 500K IOPS random reads at QD32.  Its 1 TB is
256 Gbit dies of 2-bit MLC V-NAND, 32 of them: 32 units that serve one I/O
each, which with a 70 us read gives 457K IOPS at saturation.  NAND timings
(program 600 us, erase 3.5 ms) are representative MLC datasheet values, not
those of a specific part.  The GC frequency and episode lengths are
assumptions: tens of ms per episode (collecting a block copies its valid
pages and erases it, milliseconds each, and an episode collects several
blocks), one per 128 MiB written.  On the evaluation seeds (0-49) that is
0.5-3.5 episodes per second and device at 84-470 MB/s of writes, and a
device collects garbage 1-19% of the time, median 7% (results.json, per
seed); Heimdall §2 speaks of slowness "1-10% of the time".  The workload: Poisson reads, 1-10K
read IOPS per client (log-uniform: light/heavy pairs as in Heimdall §6.1,
whose 3-minute traces hold 100K-10M I/Os), 15-50% writes, one write burst
per second on average; request sizes from 4 KiB to 1 MiB with a long tail,
resembling public block traces (MSR Cambridge, Alibaba), not fitted to them.

Everything a policy cannot change is drawn here, before the simulation:
arrival times, sizes, each I/O's base service time and random draws on each
device, the GC episodes and the write interference (both depend only on the
writes, which no policy reroutes).  Every policy therefore sees exactly the
same devices (common random numbers); only the routing differs.

A device whose garbage collection changes part-way through (loop.py):
``generate(seed, cfg, shift=(at_s, after))`` draws the same trace as
``generate(seed, cfg)`` (same workload, same per-I/O draws) except that,
from ``at_s`` seconds on, each replica's GC episodes follow ``after``'s
``gc_mib``, ``gc_ms`` and ``gc_hit`` (the amount still to be written
before the next episode is rescaled to ``after.gc_mib`` at the switch);
every other parameter stays ``cfg``'s.

Times are integer nanoseconds.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

KIB = 1024
MS = 1_000_000          # ns
US = 1_000

SIZES = np.array([4, 8, 16, 32, 64, 128, 256, 512, 1024]) * KIB
SIZE_P = np.array([0.40, 0.15, 0.12, 0.10, 0.12, 0.07, 0.025, 0.01, 0.005])
BURST_SIZES = np.array([64, 128, 256]) * KIB


@dataclass(frozen=True)
class Config:
    duration_s: float = 2.0
    # device (970 PRO 1 TB; see the module docstring)
    units: int = 32
    read_us: float = 70.0              # median base read time
    read_sigma: float = 0.2            # lognormal spread of the base read time
    read_mbps: float = 3500.0
    write_us: float = 18.0
    write_mbps: float = 2700.0
    nand_mbps: float = 2700.0          # programs keep up with sustained writes
    t_prog_us: float = 600.0
    t_erase_us: float = 3500.0
    gc_mib: float = 128.0
    gc_ms: tuple = (15.0, 80.0)
    gc_hit: tuple = (0.3, 0.8)
    retry_p: float = 0.002
    retry_us: tuple = (300.0, 2000.0)
    # workload, per client
    read_iops: tuple = (1000.0, 10000.0)   # log-uniform
    write_frac: tuple = (0.15, 0.5)
    bursts_per_s: float = 1.0
    burst_ms: tuple = (20.0, 100.0)
    burst_iops: tuple = (2000.0, 6000.0)


@dataclass
class Device:
    """One replica's time-varying state, fixed before the simulation."""
    gc_start: list          # ns, sorted
    gc_end: list
    gc_hit: list            # probability that a read waits during each episode
    rho: list               # per 1 ms bin: probability that a read waits for a program
    normal: list            # per I/O: service time in the normal state, ns
    u: list                 # per I/O: 4 uniforms (GC hit, GC wait, program hit, program wait)


@dataclass
class Trace:
    seed: int
    cfg: Config
    t: list                 # arrival, ns, sorted
    client: list            # 0 or 1: whose stream (its primary replica)
    write: list             # bool
    size: list              # bytes
    dev: list = field(default_factory=list)   # two Devices
    read_iops: tuple = ()
    write_frac: tuple = ()
    shift: tuple = ()       # (at_s, Config) when the GC pattern changes (generate)

    @property
    def n(self) -> int:
        return len(self.t)

    def gc_episode(self, d: int, t: int) -> int:
        """The GC episode replica ``d`` is in at ``t``, or -1."""
        dev = self.dev[d]
        k = bisect_right(dev.gc_start, t) - 1
        return k if k >= 0 and t < dev.gc_end[k] else -1

    def service(self, d: int, i: int, start: int) -> int:
        """Service time (ns) of I/O ``i`` on replica ``d`` when it starts
        at ``start``: its normal time plus, for a read, the wait for a die
        busy with GC or with programming written data."""
        dev = self.dev[d]
        s = dev.normal[i]
        if self.write[i]:
            return s
        u = dev.u[i]
        k = self.gc_episode(d, start)
        if k >= 0 and u[0] < dev.gc_hit[k]:
            s += int(u[1] * self.cfg.t_erase_us * US)
        b = start // MS
        if b < len(dev.rho) and u[2] < dev.rho[b]:
            s += int(u[3] * self.cfg.t_prog_us * US)
        return s


def _client_stream(rng, cfg: Config, iops: float, wfrac: float):
    T = cfg.duration_s
    n_r = rng.poisson(iops * T)
    n_w = rng.poisson(iops * wfrac / (1 - wfrac) * T)
    t = [rng.uniform(0, T, n_r), rng.uniform(0, T, n_w)]
    w = [np.zeros(n_r, bool), np.ones(n_w, bool)]
    size = [rng.choice(SIZES, n_r, p=SIZE_P), rng.choice(SIZES, n_w, p=SIZE_P)]
    for _ in range(rng.poisson(cfg.bursts_per_s * T)):
        t0 = rng.uniform(0, T)
        length = rng.uniform(*cfg.burst_ms) / 1e3
        nb = rng.poisson(rng.uniform(*cfg.burst_iops) * length)
        t.append(np.minimum(t0 + rng.uniform(0, length, nb), T))
        w.append(np.ones(nb, bool))
        size.append(rng.choice(BURST_SIZES, nb))
    return np.concatenate(t), np.concatenate(w), np.concatenate(size)


def _device(rng, cfg: Config, t, write, size, shift=()) -> Device:
    n = len(t)
    wt, ws = t[write], size[write]
    # GC episodes: one per gc_mib (+-50%) written, never overlapping; with
    # ``shift`` (at_s, Config), that Config's GC parameters from at_s on
    g, at = cfg, (int(shift[0] * 1e9) if shift else None)
    starts, ends, hits = [], [], []
    cum, need, busy_until = 0, rng.uniform(0.5, 1.5) * cfg.gc_mib * 2**20, -1
    for ti, si in zip(wt.tolist(), ws.tolist()):
        if at is not None and g is cfg and ti >= at:
            g = shift[1]
            need *= g.gc_mib / cfg.gc_mib
        cum += si
        if cum >= need and ti >= busy_until:
            starts.append(ti)
            busy_until = ti + int(rng.uniform(*g.gc_ms) * MS)
            ends.append(busy_until)
            hits.append(rng.uniform(*g.gc_hit))
            cum, need = 0, rng.uniform(0.5, 1.5) * g.gc_mib * 2**20
    # write interference: bytes written in the 5 ms before each 1 ms bin
    nbins = int(cfg.duration_s * 1e3) + 2
    per_ms = np.bincount(wt // MS, weights=ws, minlength=nbins)[:nbins]
    last5 = np.convolve(per_ms, np.ones(5))[:nbins]
    recent = np.concatenate([[0.0], last5[:-1]])           # bins k-5 .. k-1
    rho = np.minimum(0.9, recent / 5e-3 / (cfg.nand_mbps * 1e6))
    # normal service times and the per-I/O draws
    base = rng.lognormal(np.log(cfg.read_us), cfg.read_sigma, n)
    retry = np.where(rng.random(n) < cfg.retry_p, rng.uniform(*cfg.retry_us, n), 0.0)
    read_ns = (base + size / cfg.read_mbps + retry) * US       # MB/s == B/us
    write_ns = (cfg.write_us + size / cfg.write_mbps) * US
    normal = np.rint(np.where(write, write_ns, read_ns)).astype(np.int64)
    return Device(starts, ends, hits, rho.tolist(), normal.tolist(),
                  rng.random((n, 4)).tolist())


def generate(seed: int, cfg: Config = Config(), shift: tuple = ()) -> Trace:
    """The trace for ``seed``: both clients' streams merged in time order and
    both replicas' states.  ``shift`` (at_s, Config): the replicas' GC
    pattern changes at at_s (the module docstring); otherwise the same trace."""
    rng = np.random.default_rng([seed, 0x4ad])
    iops = tuple(float(np.exp(rng.uniform(*np.log(cfg.read_iops)))) for _ in range(2))
    wfrac = tuple(float(rng.uniform(*cfg.write_frac)) for _ in range(2))
    parts = [_client_stream(rng, cfg, iops[c], wfrac[c]) for c in (0, 1)]
    t = np.concatenate([np.rint(p[0] * 1e9).astype(np.int64) for p in parts])
    client = np.concatenate([np.full(len(p[0]), c) for c, p in enumerate(parts)])
    write = np.concatenate([p[1] for p in parts])
    size = np.concatenate([p[2] for p in parts]).astype(np.int64)
    order = np.lexsort((client, t))         # time order; ties: client 0 first
    t, client, write, size = t[order], client[order], write[order], size[order]
    devs = [_device(np.random.default_rng([seed, 0x4ad, d]), cfg, t, write, size, shift)
            for d in (0, 1)]
    return Trace(seed, cfg, t.tolist(), client.tolist(), write.tolist(), size.tolist(), devs,
                 iops, wfrac, tuple(shift))
