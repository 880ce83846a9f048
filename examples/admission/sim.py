"""A closed-loop discrete-event simulator of two replicas, and the read
routing policies compared in Heimdall §6.1.

Each replica is ``cfg.units`` identical servers behind one FIFO queue (an
M/G/c queue whose service times come from the trace's device state at the
moment an I/O starts).  I/Os are dispatched in time order, so an I/O's
start, service and completion times are known when it is dispatched; its
completion is still delivered to the policy as an event at that time, so a
policy only ever knows what has completed before it decides.  Rerouting
changes the load on both replicas, and the load changes every later
latency: the loop is closed.

A read's latency is the time from its arrival to its completion on the
replica that served it (the first of two copies for hedging): queueing plus
service.  Writes go to both replicas and are not reported.

Policies (``route`` picks the replica of each read; ``write`` sees each
copy of a write as it is sent, ``dispatched`` and ``completed`` every I/O a
replica receives and finishes):

  baseline   every read to its primary
  random     each read to a replica chosen uniformly at random (Heimdall
             §6.1: "sending I/O to a randomly chosen device")
  hedging    every read to its primary; if it has not completed after the
             client's p98 baseline read latency, a copy goes to the other
             replica and the first response wins; the slower copy still
             runs (Heimdall's hedging replayer does not cancel it)
  c3         C3's replica ranking (Suresh et al., NSDI'15, §4.1), see C3
  heimdall   the learned model behind the kmlc admission hook (AdmissionHook;
             the writes to a replica go through that replica's hook)
  linnos     a LinnOS-like model (31 -> 256 -> 2) behind the same hook, shown
             the reads only (as Heimdall's artifact feeds LinnOS)
  linnos_block  the LinnOS-like model with LinnOS's own block-layer view
  oracle     declines exactly the reads that arrive during a GC episode on
             their primary (knows the device state; a ceiling, not a policy)
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

FIRST, WRITE, HEDGE = 0, 1, 2       # what a completion event is


@dataclass
class Result:
    policy: str
    latency_ns: np.ndarray      # per read, in arrival order
    client: np.ndarray          # per read
    rerouted: np.ndarray        # per read: first copy sent to the non-primary replica
    hedged: np.ndarray          # per read: a second copy was sent
    counters: dict


class Policy:
    name = "baseline"
    hedge_ns = None             # per client: send a copy after this long, or None

    def route(self, c: int, i: int, t: int):
        """(replica, token) for read ``i`` of client ``c`` arriving at ``t``;
        the token comes back with its completion."""
        return c, None

    def write(self, d: int, i: int, t: int):
        """Token for the copy of write ``i`` sent to replica ``d`` at ``t``;
        it comes back with the copy's completion."""
        return None

    def dispatched(self, d: int, i: int, t: int) -> None:
        """Replica ``d`` received I/O ``i`` (a read, a hedged copy or one of a
        write's two copies) at ``t``."""

    def completed(self, d, i, kind, t_arrival, svc, done, token, queue) -> None:
        """I/O ``i`` finished on replica ``d`` at ``done`` after ``svc`` ns of
        service; ``queue``: I/Os still outstanding on ``d``."""

    def counters(self) -> dict:
        return {}


def simulate(tr, policy: Policy) -> Result:
    """Replay trace ``tr`` (traces.Trace) with ``policy`` routing its reads."""
    T, C, W = tr.t, tr.client, tr.write
    units = tr.cfg.units
    free = [[0] * units, [0] * units]       # heaps of the servers' free times
    outstanding = [0, 0]
    heap: list = []                          # (time, seq, event...)
    seq = 0
    nreads = len(T) - sum(W)
    lat = [0] * nreads
    client = [0] * nreads
    rer = bytearray(nreads)
    hed = bytearray(nreads)
    hedge = policy.hedge_ns
    service, dispatched, completed = tr.service, policy.dispatched, policy.completed

    def dispatch(d, i, t):
        f = free[d]
        s = heapq.heappop(f)
        start = t if t > s else s
        svc = service(d, i, start)
        heapq.heappush(f, start + svc)
        outstanding[d] += 1
        dispatched(d, i, t)
        return svc, start + svc

    def handle(ev):
        nonlocal seq
        if ev[2] == HEDGE:                   # the hedging timer of read r fired
            _, _, _, r, i, t0, d, first_done = ev
            svc, done = dispatch(d, i, ev[0])
            seq += 1
            heapq.heappush(heap, (done, seq, -1, d, i, HEDGE, ev[0], svc, None))
            hed[r] = 1
            lat[r] = min(first_done, done) - t0
            return
        done, _, _, d, i, kind, t0, svc, token = ev
        outstanding[d] -= 1
        completed(d, i, kind, t0, svc, done, token, outstanding[d])

    r = 0
    for i in range(len(T)):
        t = T[i]
        while heap and heap[0][0] <= t:
            handle(heapq.heappop(heap))
        if W[i]:
            for d in (0, 1):
                token = policy.write(d, i, t)
                svc, done = dispatch(d, i, t)
                seq += 1
                heapq.heappush(heap, (done, seq, -1, d, i, WRITE, t, svc, token))
            continue
        c = C[i]
        d, token = policy.route(c, i, t)
        svc, done = dispatch(d, i, t)
        seq += 1
        heapq.heappush(heap, (done, seq, -1, d, i, FIRST, t, svc, token))
        lat[r], client[r], rer[r] = done - t, c, d != c
        if hedge is not None and done - t > hedge[c]:
            seq += 1
            heapq.heappush(heap, (t + hedge[c], seq, HEDGE, r, i, t, 1 - d, done))
        r += 1
    while heap:
        handle(heapq.heappop(heap))
    return Result(policy.name, np.array(lat, np.int64), np.array(client, np.int8),
                  np.frombuffer(bytes(rer), np.uint8).astype(bool),
                  np.frombuffer(bytes(hed), np.uint8).astype(bool), policy.counters())


# ---- the policies ---------------------------------------------------------------------

class Random(Policy):
    name = "random"

    def __init__(self, seed: int, nreads: int):
        self.pick = (np.random.default_rng([seed, 0x7a]).random(nreads) < 0.5).tolist()
        self.r = 0

    def route(self, c, i, t):
        other = self.pick[self.r]
        self.r += 1
        return (1 - c if other else c), None


class Oracle(Policy):
    """Not a real policy: declines exactly the reads that arrive while their
    primary collects garbage (it reads the trace's device state).  The
    ceiling for an admission policy that knows its primary perfectly and
    nothing about the replica."""
    name = "oracle"

    def __init__(self, tr):
        self.tr = tr

    def route(self, c, i, t):
        return (1 - c if self.tr.gc_episode(c, t) >= 0 else c), None


class Hedging(Policy):
    name = "hedging"

    def __init__(self, after_ns):
        self.hedge_ns = list(after_ns)


class C3(Policy):
    """C3's replica ranking (Suresh et al., NSDI'15 §4.1), per client:

        psi_s = R_s - 1/mu_s + q_s^3 / mu_s,   q_s = 1 + os_s * w + Q_s

    R_s, 1/mu_s and Q_s are EWMAs (weight 0.9 on the newest sample, as in
    the C3 authors' simulator) of the response time, the service time and
    the replica's queue length, fed back with every response; os_s is the
    client's own outstanding reads on s, w = 2 the number of clients.  A
    replica with no feedback yet ranks first (score 0); ties go to the
    primary.  Not modelled: C3's cubic rate control and backpressure, which
    throttle a client's sending rate to each server; here every read is
    sent at once, as an open-loop trace replay does."""
    name = "c3"

    def __init__(self, clients: int = 2, alpha: float = 0.9, exponent: int = 3):
        self.w, self.alpha, self.b = clients, alpha, exponent
        self.os = [[0, 0], [0, 0]]
        self.fb = [[None, None], [None, None]]  # [R, service, queue] per client, replica

    def score(self, c: int, s: int) -> float:
        fb = self.fb[c][s]
        if fb is None:
            return 0.0
        R, svc, q = fb
        return R - svc + (1 + self.os[c][s] * self.w + q) ** self.b * svc

    def route(self, c, i, t):
        d = c if self.score(c, c) <= self.score(c, 1 - c) else 1 - c
        self.os[c][d] += 1
        return d, c

    def completed(self, d, i, kind, t_arrival, svc, done, token, queue):
        if kind != FIRST:
            return
        self.os[token][d] -= 1
        new = (done - t_arrival, svc, queue)
        old = self.fb[token][d]
        a = self.alpha
        self.fb[token][d] = new if old is None else tuple(a * x + (1 - a) * y
                                                          for x, y in zip(new, old))


def linnos_digits(pend_hist, pend, lat_hist) -> list:
    """LinnOS's 31 inputs: 4 past and the current pending-page counts, 3
    decimal digits each (capped at 999), then 4 past latencies in us, 4
    digits each (capped at 9999); oldest first, as Heimdall's artifact
    (traceParser.py, linnos_algo.c) lays them out."""
    out = []
    for v in (*pend_hist, pend):
        v = min(v, 999)
        out += [v // 100, v // 10 % 10, v % 10]
    for v in lat_hist:
        v = min(v, 9999)
        out += [v // 1000, v // 100 % 10, v // 10 % 10, v % 10]
    return out


def pages(size: int) -> int:
    return (size + 4095) // 4096


class HeimdallView:
    """Heimdall's 11 features as the admission hook computes them: the
    module's own C through ``kmlc.features.AdmissionStream``.  Its history
    takes every completion the hook records, reads and writes alike; with
    ``sees_writes=False``, the reads' only (writes still count in the queue
    length): the module with ``history_writes=0``."""

    def __init__(self, frac, sees_writes: bool = True):
        from kmlc.features import AdmissionStream

        self.stream = AdmissionStream(frac=frac)
        self.sees_writes = sees_writes

    def read(self, size, inflight):
        return self.stream.read(size, inflight)

    def admitted(self, size):
        return None

    def complete(self, token, qlen, latency_ns, nbytes):
        self.stream.complete(qlen, latency_ns, nbytes)


class LinnOSView:
    """LinnOS's features over the reads this target sends to its primary,
    as Heimdall's artifact feeds its LinnOS re-implementation
    (linnos_algo.c, linnos/io_replayer.c: pending pages grow when a read is
    admitted; the history takes each admitted read's pending pages at issue
    and latency when it completes; writes are not shown to it, so the hook
    does not pass them on: ``sees_writes``).  ``record`` keeps every row."""
    sees_writes = False

    def __init__(self, record: bool = False):
        self.pend = 0
        self.hist = [(0, 0)] * 4            # (pages pending at issue, latency us), oldest first
        self.rows = [] if record else None

    def read(self, size, inflight):
        row = linnos_digits([q for q, _ in self.hist], self.pend + pages(size),
                            [lt for _, lt in self.hist])
        if self.rows is not None:
            self.rows.append(row)
        return row

    def admitted(self, size):
        self.pend += pages(size)
        return self.pend

    def complete(self, token, qlen, latency_ns, nbytes):
        self.pend -= pages(nbytes)
        self.hist = self.hist[1:] + [(token, latency_ns // 1000)]


READ_DONE, WRITE_DONE = 1, 2            # the kinds of the hook's completion events


class AdmissionHook:
    """One kmlc admission target (runtime-kernel/kml_admit.c) over
    (primary, replica), its read balancing step for step, with the model's features from
    ``view`` and its decision from ``decide`` (1 decline, 0 admit):

    * map() of a read (``map``): features from the reads and writes in
      flight on the primary *through this target* (``inflight``);
      ``declined`` counts the model's declines, and every
      ``probe_every``-th decline goes to the primary anyway;
    * map() of a write (``write``): to the primary, counted in
      ``inflight``: the target's ``replicated_elsewhere`` setting
      (docs/hooks.md), Heimdall's, where the storage system writes each
      replica through the target whose primary it is;
    * a read or write sent to the primary records its queue length at
      submit (``inflight`` before it is counted) and, at end_io(), its
      latency (from map() to completion: queueing included) and bytes into
      the view's history (a view that does not ``sees_writes``, LinnOS's
      or Heimdall's with the module's ``history_writes=0``, is given the
      reads only); reads sent to the replica are not recorded.

    With the HeimdallView and ``twin.decide`` this is exactly what the
    module does (the tests replay ``events`` through ``twin.replay``:
    rows (0, size, inflight, 0) per read, (1 or 2, qlen, latency ns, bytes)
    per completion of a read or a write that entered the history, as the
    module traces them).  With ``trace``,
    ``log`` also keeps every I/O sent to the primary in submission order,
    [1 read or 2 write, bytes, latency ns], for the labels.

    With ``guard`` (a ``twin.guard_session()``: the module's kml_guard.h,
    one for all mirrors, as in the module; this mirror is its ``key``),
    each decision of the model passes the guards with the primary as the
    default, as in the module (docs/hooks.md, "Guards"); ``envelope``
    ([lo, hi] of the encoded features, or None) flags the features outside
    it; a read decided on an A/B arm reports its latency, on whichever
    replica served it (``cost``)."""

    def __init__(self, view, decide, probe_every: int = 64, trace: bool = False,
                 guard=None, envelope=None, key: int = 0):
        self.view, self.decide, self.probe_every = view, decide, probe_every
        self.guard, self.key = guard, key
        self.envelope = None if envelope is None else [np.asarray(e) for e in envelope]
        self.inflight = 0
        self.reads = self.declined = self.probes = self.to_replica = self.writes = 0
        self.events = [] if trace else None
        self.decisions = [] if trace else None     # the model's, per read
        self.log = [] if trace else None

    def _submit(self, kind: int, size: int, vtoken):
        qlen = self.inflight
        self.inflight += 1
        idx = None
        if self.log is not None:
            idx = len(self.log)
            self.log.append([kind, size, None])
        return kind, qlen, vtoken, idx

    def map(self, size: int, t: int = 0):
        """A read at time t: (to the replica?, token for end_io or None,
        its A/B arm)"""
        f = self.view.read(size, self.inflight)
        d = int(self.decide(f))
        if self.events is not None:
            self.events.append((0, size, self.inflight, 0))
            self.decisions.append(d)
        self.reads += 1
        arm = 2                               # KML_GUARD_ARM_NONE
        if self.guard is not None:
            lo_hi = self.envelope
            out = lo_hi is not None and bool(np.any(f < lo_hi[0]) or np.any(f > lo_hi[1]))
            d, _, arm = self.guard.decide(d, 0, key=self.key, outside=out, now=t)
        self.declined += d
        use = d > 0
        if use and self.probe_every and self.declined % self.probe_every == 0:
            self.probes += 1
            use = False
        self.to_replica += use
        if use:
            return True, None, arm
        return False, self._submit(READ_DONE, size, self.view.admitted(size)), arm

    def cost(self, arm: int, latency_ns: int) -> None:
        """A read decided on an A/B arm completed (end_io, on either leg)."""
        if self.guard is not None and arm != 2:
            self.guard.cost(arm, latency_ns)

    def write(self, size: int):
        """A write, sent to the primary: the token for end_io."""
        self.writes += 1
        return self._submit(WRITE_DONE, size,
                            self.view.admitted(size) if self.view.sees_writes else None)

    def end_io(self, token, latency_ns: int, nbytes: int) -> None:
        kind, qlen, vtoken, idx = token
        self.inflight -= 1
        entered = kind == READ_DONE or self.view.sees_writes
        if entered:
            self.view.complete(vtoken, qlen, latency_ns, nbytes)
        if self.events is not None:
            if entered:            # the module traces what entered the history
                self.events.append((kind, qlen, latency_ns, nbytes))
            self.log[idx][2] = latency_ns


class Admission(Policy):
    """An admission model behind the kmlc hook: one AdmissionHook per
    replica, its primary; client c's reads go through hook c.  Each copy of
    a write goes through the hook of the replica it is written to: the
    storage system writes each replica through the target whose primary it
    is, so each hook sees every write on its primary, as Heimdall's history
    does.  ``view()`` makes each hook's feature state; ``decide(features)
    -> 0/1``."""

    def __init__(self, name, size, view, decide, probe_every: int = 64, trace: bool = False,
                 guard=None, envelope=None):
        self.name, self.size = name, size
        # one guard for the module, each mirror a key of it (kml_admit.c)
        g = guard(nkeys=2) if guard else None
        self.hooks = [AdmissionHook(view(), decide, probe_every, trace, g, envelope, key)
                      for key in (0, 1)]

    def route(self, c, i, t):
        to_replica, token, arm = self.hooks[c].map(self.size[i], t)
        return (1 - c if to_replica else c), (c, arm, token)

    def write(self, d, i, t):
        return self.hooks[d].write(self.size[i])

    def completed(self, d, i, kind, t_arrival, svc, done, token, queue):
        # a read this hook sent to its primary, or a write through it
        if kind == FIRST:
            c, arm, token = token
            self.hooks[c].cost(arm, done - t_arrival)
        if kind in (FIRST, WRITE) and token is not None:
            self.hooks[d].end_io(token, done - t_arrival, self.size[i])

    def counters(self) -> dict:
        out = {k: sum(getattr(h, k) for h in self.hooks)
               for k in ("reads", "declined", "probes", "to_replica", "writes")}
        if self.hooks[0].guard is not None:
            g = self.hooks[0].guard.counters     # the module's one guard
            for k in ("demotions", "promotions", "periods", "envelope_trips", "control",
                      "demoted", "probe"):
                out[f"guard_{k}"] = g[k]
        return out


def heimdall(size, decide, frac, probe_every: int = 64, trace: bool = False,
             history_writes: bool = True, guard=None, envelope=None) -> Admission:
    """The learned policy: Heimdall's features and the compiled model
    (``twin.decide``), or ``lambda f: 0`` to record training data.
    ``history_writes=False``: see HeimdallView.  ``guard``: a function
    making the module's guard (``twin.guard_session``, called with
    ``nkeys``: one key per mirror), ``envelope``: the
    compiled envelope (see AdmissionHook)."""
    return Admission("heimdall", size, lambda: HeimdallView(frac, history_writes), decide,
                     probe_every, trace, guard, envelope)


def linnos(size, model=None, probe_every: int = 64, record: bool = False) -> Admission:
    """The LinnOS-like model behind the same hook: same view, same probes.
    ``model(row) -> bool`` (slow); None admits everything."""
    return Admission("linnos", size, lambda: LinnOSView(record),
                     (lambda f: 0) if model is None else model, probe_every)


class LinnOSBlock(Policy):
    """LinnOS-like admission with the view LinnOS has in the kernel's block
    layer (Hao et al., OSDI'20): per replica, every I/O on it.  Pending
    pages count every read and write outstanding on the replica (this read
    included); the history holds the last 4 reads completed on the replica,
    whoever sent them.  A slow prediction sends the read to the other
    replica, which admits it; no probes (the replica's other I/Os keep the
    history current).  ``model(row) -> bool``; ``record=True`` keeps every
    read's row on its primary for training."""
    name = "linnos_block"

    def __init__(self, size, model=None, record: bool = False):
        self.pages = [pages(s) for s in size]
        self.model = model
        self.pend = [0, 0]
        self.hist = [[(0, 0)] * 4, [(0, 0)] * 4]
        self.rows = [] if record else None
        self.declined = 0

    def route(self, c, i, t):
        p = self.pages[i]
        h = self.hist[c]
        row = linnos_digits([q for q, _ in h], self.pend[c] + p, [lt for _, lt in h])
        if self.rows is not None:
            self.rows.append(row)
        d = c
        if self.model is not None and self.model(row):
            d = 1 - c
            self.declined += 1
        return d, self.pend[d] + p

    def dispatched(self, d, i, t):
        self.pend[d] += self.pages[i]

    def completed(self, d, i, kind, t_arrival, svc, done, token, queue):
        self.pend[d] -= self.pages[i]
        if kind == FIRST:
            h = self.hist[d]
            h.pop(0)
            h.append((token, (done - t_arrival) // 1000))

    def counters(self) -> dict:
        return {"declined": self.declined}
