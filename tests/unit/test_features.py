"""runtime-kernel/kml_features.h: the hooks' integer feature extractors,
against exact rational arithmetic in Python."""
import ctypes
import subprocess
from fractions import Fraction

import numpy as np
import pytest

from kmlc.runtime_kernel import DIR as RUNTIME

HARNESS = r"""
#include "kml_features.h"
s32 q_div(u64 n, u64 d, unsigned int f) { return kml_q_div(n, d, f); }
s32 q_int(u64 v, unsigned int f) { return kml_q_int(v, f); }
void admit(const u64 *done, long ndone, u64 size, u32 qlen, const u8 *frac, s32 *out)
{
	struct kml_admit_state s = { { 0 } };
	long i;

	for (i = 0; i < ndone; i++)
		kml_admit_complete(&s, (u32)done[3 * i], done[3 * i + 1], done[3 * i + 2]);
	kml_admit_features(&s, size, qlen, frac, out);
}
/* One mount's events {t, kind, a, rsize} and reclaim scans (kind 3). */
long nfs(const s64 *ev, long n, u64 window_ns, const u8 *frac, s32 *out, long *closed)
{
	struct kml_nfs_window w = { 0 };
	struct kml_nfs_reclaim r = { 0, 0 };
	long i, windows = 0;

	for (i = 0; i < n; i++, ev += 4) {
		if (ev[1] == KML_NFS_RECLAIM)
			kml_nfs_reclaimed(&r, (u64)ev[2]);
		else if (kml_nfs_step(&w, &r, (unsigned int)ev[1], (u64)ev[0], (u64)ev[2],
				      (u32)ev[3], window_ns, frac, out + 8 * windows))
			closed[windows++] = i;
	}
	return windows;
}
u32 nfs_clamp(u32 want, u32 negotiated) { return kml_nfs_clamp(want, negotiated); }
void nfs_decide(const u32 *want, long n, u32 k, u32 negotiated, u32 *out)
{
	struct kml_nfs_votes v = { { 0 } };
	long i;

	for (i = 0; i < n; i++)
		out[i] = kml_nfs_decide(&v, want[i], k, negotiated);
}
"""

S32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("feat")
    (d / "h.c").write_text(HARNESS)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-fsanitize=undefined",
                    "-fsanitize-undefined-trap-on-error", f"-I{RUNTIME}", "-o", d / "h.so",
                    d / "h.c"], check=True)
    lib = ctypes.CDLL(str(d / "h.so"))
    lib.q_div.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    lib.q_int.argtypes = [ctypes.c_uint64, ctypes.c_uint]
    lib.nfs.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_uint64, ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.c_void_p]
    lib.nfs.restype = ctypes.c_long
    lib.nfs_clamp.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
    lib.nfs_clamp.restype = ctypes.c_uint32
    lib.nfs_decide.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_uint32, ctypes.c_uint32,
                               ctypes.c_void_p]
    return lib


def exact_q(num, den, frac):
    v = Fraction(num, den or 1) * 2**frac
    r = int(v) + (1 if v - int(v) >= Fraction(1, 2) else 0)
    return min(r, S32_MAX)


def test_q_div_is_exact_rounding(lib):
    rng = np.random.default_rng(0)
    cases = [(0, 0, 5), (1, 0, 0), (2**64 - 1, 1, 0), (2**64 - 1, 2**64 - 1, 30), (1, 3, 30),
             (5, 2, 0), (2**63, 3, 7), (7, 2**64 - 1, 30)]
    for _ in range(20000):
        cases.append((int(rng.integers(0, 2**63)) >> int(rng.integers(0, 63)),
                      max(1, int(rng.integers(0, 2**63)) >> int(rng.integers(0, 63))),
                      int(rng.integers(0, 31))))
    for n, d, f in cases:
        assert lib.q_div(n, d, f) == exact_q(n, d, f), (n, d, f)


def test_q_int_saturates(lib):
    assert lib.q_int(3, 4) == 48
    assert lib.q_int(2**31, 0) == S32_MAX
    assert lib.q_int(2**20, 11) == S32_MAX and lib.q_int(2**19, 11) == 2**30


def test_admission_features_match_definition(lib):
    rng = np.random.default_rng(1)
    frac = np.array([0, 10, 10, 10, 10, 8, 8, 8, 12, 12, 12], dtype=np.uint8)
    for n_done in (0, 1, 2, 3, 7):
        done = np.stack([rng.integers(0, 64, n_done), rng.integers(0, 5_000_000, n_done),
                         rng.integers(512, 2**20, n_done)], axis=1).astype(np.uint64)
        size, qlen = 65536, 9
        out = np.zeros(11, dtype=np.int32)
        lib.admit(done.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(n_done),
                  ctypes.c_uint64(size), ctypes.c_uint32(qlen),
                  frac.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p))
        last = done[::-1][:3].tolist() + [[0, 0, 0]] * 3
        want = [exact_q(size, 1, 0), exact_q(qlen, 1, 10)]
        want += [exact_q(int(q), 1, 10) for q, _, _ in last[:3]]
        lat = [max(1, int(ns) // 1000) if i < n_done else 0 for i, (_, ns, _) in
               enumerate(last[:3])]
        want += [exact_q(v, 1, 8) for v in lat]
        want += [exact_q(int(b), v, 12) if v else 0 for (_, _, b), v in zip(last[:3], lat)]
        assert out.tolist() == want, n_done


# ---- kmlc.features: the same C as a library, against an exact Python model ----------

def exact_ra_features(pages, ra_pages, frac):
    """KML's readahead features of one window, in exact rationals (brief §2,
    docs/hooks.md): offsets relative to the first, clamped to +-2^20."""
    d = [max(-2**20, min(2**20, p - pages[0])) for p in pages]
    n, rng = len(d), max(d) - min(d)
    var_n2 = n * sum(x * x for x in d) - sum(d) ** 2
    diffs = sum(abs(a - b) for a, b in zip(d[1:], d[:-1]))
    return [exact_q(n, 1, frac[0]),
            exact_q(var_n2, n * n * rng, frac[1]) if rng else 0,
            exact_q(var_n2, n * (n - 1) * rng, frac[2]) if rng else 0,
            exact_q(diffs, n - 1, frac[3]),
            exact_q(ra_pages * 8, 1024, frac[4])]


def test_readahead_extractor_matches_exact_windows():
    from kmlc import features

    rng = np.random.default_rng(3)
    n = 5000
    t = np.cumsum(rng.integers(0, 40_000_000, n))          # up to 40 ms apart
    files = rng.integers(0, 7, n)
    pages = np.where(files % 2 == 0, np.arange(n) * 4, rng.integers(0, 2**23, n))
    ra = rng.choice([2, 32, 80, 120], n)
    ev = np.stack([t, files, pages, ra], 1)
    frac = features.ra_float_frac()
    assert frac.tolist() == [0, 4, 4, 4, 16]
    got = features.readahead(ev, window_events=16, window_ms=250)
    # the oracle: per file, a window closes at 16 events or once 250 ms old
    want, closed, open_ = [], [], {}
    for i, (ti, fi, pi, ri) in enumerate(ev.tolist()):
        w = open_.setdefault(fi, [ti, []])
        if not w[1]:
            w[0] = ti
        w[1].append(pi)
        if len(w[1]) >= 2 and (len(w[1]) >= 16 or ti - w[0] >= 250_000_000):
            want.append(exact_ra_features(w[1], ri, frac.tolist()))
            closed.append(i)
            w[1] = []
    assert len(want) > 300
    assert got.raw.tolist() == want
    assert got.closed_by.tolist() == closed
    assert np.allclose(got.values, np.array(want) / 2.0 ** frac)


def test_admission_extractor_is_the_modules(tmp_path):
    """kmlc.features.admission equals the admission twin's replay (the
    module's own feature code) with the model's fraction bits."""
    from conftest import EXAMPLES, seed_models
    from kmlc import features
    from kmlc.api import compile as kcompile, load
    from kmlc.errors import KmlcError

    out = tmp_path / "adm"
    kcompile(EXAMPLES / "heimdall.onnx", out, numerics="fixed", hooks=["admission"],
             targets=["kernel", "user"],
             calibration=seed_models.sample_inputs("heimdall", 500, seed=1))
    rng = np.random.default_rng(4)
    kinds = rng.integers(0, 3, 3000)          # reads, read and write completions
    slow = (np.arange(3000) // 500) % 2 == 1  # alternating fast and slow periods
    lat_ns = rng.lognormal(np.where(slow, 8.5, 5.5), 0.5) * 1000
    ev = np.stack([kinds, np.where(kinds == 0, 2 ** rng.integers(12, 18, 3000),
                                   rng.poisson(np.where(slow, 12, 4))),
                   np.where(kinds == 0, rng.poisson(np.where(slow, 12, 4)), lat_ns),
                   np.where(kinds == 0, 0, 2 ** rng.integers(12, 18, 3000))],
                  1).astype(np.int64)
    twin = load(out)
    feats, decisions = twin.replay(ev)
    assert twin.hook_frac.tolist() == twin.fixed["frac_bits"]
    got = features.admission(ev, frac=twin.hook_frac)
    assert len(feats) == (kinds == 0).sum()
    assert np.array_equal(got.raw, feats)
    assert np.array_equal(twin.decide(got.raw), decisions)
    assert 0 < decisions.sum() < len(decisions)  # both decisions occur
    # a write's completion enters the history exactly as a read's does
    as_reads = ev.copy()
    as_reads[kinds == 2, 0] = 1
    assert np.array_equal(twin.replay(as_reads)[0], feats)
    with pytest.raises(KmlcError, match="returned -22"):   # -EINVAL: no such kind
        twin.replay(np.array([[3, 0, 0, 0]]))


def test_admission_history_takes_writes():
    """Hand-computed: the queue length and the last three completions count
    reads and writes alike (Heimdall's features, docs/hooks.md)."""
    from kmlc import features

    ev = [(1, 0, 2_500, 4096),        # a read done: 2 us (floored from 2.5), 4096 B
          (0, 16384, 1, 0),           # a read offered with 1 I/O in flight
          (2, 3, 999, 65536),         # a write done: 999 ns -> 1 us, 65536 B, 3 ahead
          (2, 1, 10_000_000, 1 << 20),  # a write done: 10 ms, 1 MiB
          (0, 8192, 4, 0)]            # a read offered with 4 I/Os in flight
    got = features.admission(np.array(ev, np.int64))
    assert got.frac.tolist() == [0] * 8 + [8] * 3
    # size, qlen, past qlen x3, latency us x3, throughput B/us x3 (x256: 8 fraction bits)
    assert got.raw.tolist() == [
        [16384, 1, 0, 0, 0, 2, 0, 0, 2048 * 256, 0, 0],
        [8192, 4, 1, 3, 0, 10_000, 1, 2, round((1 << 20) / 10_000 * 256), 65536 * 256,
         2048 * 256]]
    s = features.AdmissionStream()
    s.complete(0, 2_500, 4096)
    assert s.read(16384, 1).tolist() == got.raw[0].tolist()


def test_extractors_reject_bad_events():
    from kmlc import features
    from kmlc.errors import KmlcError

    with pytest.raises(KmlcError, match="rows of 4"):
        features.readahead(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(KmlcError, match="time order"):
        features.readahead(np.array([[5, 0, 0, 0], [4, 0, 1, 0]]))
    with pytest.raises(KmlcError, match="kind 0"):
        features.admission(np.array([[3, 0, 0, 0]]))
    with pytest.raises(KmlcError, match="integers"):
        features.admission(np.zeros((1, 4)))


def test_streams_equal_batch_extraction():
    """One event at a time (for closed-loop simulators) gives exactly the
    batch extraction's features."""
    from kmlc import features

    rng = np.random.default_rng(5)
    n = 3000
    ev = np.stack([np.cumsum(rng.integers(0, 5_000_000, n)), rng.integers(0, 5, n),
                   rng.integers(0, 2**21, n), rng.choice([2, 32, 80], n)], 1)
    s = features.ReadaheadStream(window_events=8, window_ms=100)
    got = [(i, f) for i, e in enumerate(ev.tolist()) if (f := s.add(*e)) is not None]
    want = features.readahead(ev, window_events=8, window_ms=100)
    assert [i for i, _ in got] == want.closed_by.tolist()
    assert np.array_equal(np.array([f for _, f in got]), want.raw)

    kinds = rng.integers(0, 3, n)             # reads, read and write completions
    aev = np.stack([kinds, rng.integers(1, 2**20, n), rng.integers(0, 10**8, n),
                    rng.integers(512, 2**20, n)], 1)
    a = features.AdmissionStream()
    rows = [a.read(e[1], e[2]) if e[0] == 0 else a.complete(e[1] % 64, e[2], e[3])
            for e in aev.tolist()]
    aev[kinds != 0, 1] %= 64
    assert np.array_equal(np.array([r for r in rows if r is not None]),
                          features.admission(aev).raw)


@pytest.mark.parametrize("numerics", ["fixed", "float"])
def test_readahead_decisions_are_the_modules(tmp_path, numerics):
    """Features from kmlc.features with the hook's fraction bits, decided by
    twin.decide(), equal the hook's own replay (window flags included): a
    simulator sees what the module would do."""
    from conftest import readahead_policy
    from kmlc import features
    from kmlc.api import compile as kcompile, load

    m, cal = readahead_policy()
    kcompile(m, tmp_path / "ra", name="rap", numerics=numerics, targets=["kernel", "user"],
             calibration=cal if numerics == "fixed" else None, hooks=["readahead"])
    twin = load(tmp_path / "ra")
    rng = np.random.default_rng(6)
    n = 4000
    files = rng.integers(0, 4, n)
    pages = np.where(files < 2, np.arange(n) * 8, rng.integers(0, 2**20, n))
    ev = np.stack([np.arange(n) * 1000, files, pages, rng.choice([2, 32, 80], n)], 1)
    w = features.readahead(ev, window_events=16, frac=twin.hook_frac)
    classes = twin.decide(w.raw)
    flags = np.zeros(n, dtype=np.int64)
    flags[w.closed_by] = 2
    trace = np.stack([files, pages, ev[:, 3], flags], 1)
    rf, rc = twin.replay(trace[: n // 2 + 3])  # leaves windows open at its end
    rf, rc = twin.replay(trace)                # which must not leak into this replay
    assert np.array_equal(rf, w.raw) and np.array_equal(rc, classes)
    assert set(classes.tolist()) == {0, 2}  # random files -> 0, sequential -> 2


# ---- NFS rsize (docs/hooks.md): the definition, in exact arithmetic ----------------

U64_MAX = 2**64 - 1


def exact_nfs_windows(ev, window_ns, frac):
    """The NFS hook's windows and features for rows {t, kind, mount, a,
    rsize}, from their definition: per mount, a window closes at the first
    event window_ns or more after its first event (without that event);
    reclaim scans (kind 3) are system-wide; sums saturate at 2^64 - 1."""
    scans = reclaimed = 0
    open_, out, closed = {}, [], []
    for i, (t, kind, mount, a, rsize) in enumerate(ev):
        if kind == 3:
            scans, reclaimed = scans + 1, min(reclaimed + a, U64_MAX)
            continue
        w = open_.get(mount)
        if w is not None and t - w["t0"] >= window_ns:
            out.append(exact_nfs_features(w, scans, reclaimed, t, rsize, frac))
            closed.append(i)
            w = None
        if w is None:
            w = open_[mount] = {"t0": t, "scans": scans, "reclaimed": reclaimed,
                                0: [], 1: [], 2: []}
        w[kind].append((t, a % 2**64))
    return out, closed


def exact_nfs_features(w, scans, reclaimed, t, rsize, frac):
    reads, dones, pages = w[0], w[1], w[2]
    lat = [a for _, a in dones if a != U64_MAX]

    def mean_step(xs, unit, f):  # mean |difference| of successive values, in units
        if len(xs) < 2:
            return 0
        total = min(sum(abs(x - y) for x, y in zip(xs[1:], xs[:-1])), U64_MAX)
        return exact_q(total, (len(xs) - 1) * unit, f)

    ds = scans - w["scans"]
    n = len(reads) + len(dones) + len(pages) + ds
    return [exact_q(min(n * 10**9, U64_MAX), t - w["t0"], frac[0]),
            exact_q(min(sum(lat), U64_MAX), len(lat) * 1000, frac[1]) if lat else 0,
            mean_step([t for t, _ in reads], 1000, frac[2]),
            mean_step([t for t, _ in dones], 1000, frac[3]),
            mean_step([a for _, a in reads], 4096, frac[4]),
            mean_step([a for _, a in pages], 1, frac[5]),
            exact_q(reclaimed - w["reclaimed"], ds, frac[6]) if ds else 0,
            exact_q(rsize, 4096, frac[7])]


def nfs_stream(rng, n, mounts=3):
    """Rows {t, kind, mount, a, rsize}: sequential readers on even mounts,
    random ones on odd mounts, dones with latencies (some unknown), page
    adds, and system-wide reclaim scans."""
    t = np.cumsum(rng.integers(0, 3_000_000, n))
    kind = rng.choice([0, 1, 2, 3], n, p=[0.3, 0.3, 0.35, 0.05])
    mount = rng.integers(0, mounts, n)
    seq = mount % 2 == 0
    offset = np.where(seq, np.arange(n) * 65536, rng.integers(0, 2**36, n))
    latency = np.where(rng.random(n) < 0.1, -1, rng.integers(1000, 50_000_000, n))
    page = np.where(seq, np.arange(n), rng.integers(0, 2**24, n))
    a = np.choose(kind, [offset, latency, page, rng.integers(0, 512, n)])
    rsize = rng.choice([4096, 65536, 262144, 1048576], n)
    return np.stack([t, kind, mount, a, rsize], 1).astype(np.int64)


def test_nfs_features_match_definition(lib):
    """kml_features.h's NFS windows, under UBSan, and kmlc.features.nfs
    both equal the exact definition, extreme values included."""
    from kmlc import features

    rng = np.random.default_rng(7)
    ev = nfs_stream(rng, 6000)
    frac = [4, 9, 5, 5, 8, 8, 8, 8]
    want, closed = exact_nfs_windows(ev.tolist(), 40_000_000, frac)
    assert len(want) > 200
    got = features.nfs(ev, window_ms=40, frac=frac)
    assert got.raw.tolist() == want
    assert got.closed_by.tolist() == closed
    # one mount, through the UBSan harness, with offsets and gaps near 2^63
    one = ev[ev[:, 2] == 0]
    one[::7, 3] = 2**63 - 1 - one[::7, 3]
    one[:, 0] += 2**62
    rows = np.ascontiguousarray(one[:, [0, 1, 3, 4]])
    out = np.zeros((len(rows), 8), dtype=np.int32)
    idx = np.zeros(len(rows), dtype=np.int64)
    m = lib.nfs(rows.ctypes.data, len(rows), 40_000_000, np.array(frac, np.uint8).ctypes.data,
                out.ctypes.data, idx.ctypes.data)
    want1, closed1 = exact_nfs_windows(one.tolist(), 40_000_000, frac)
    assert out[:m].tolist() == want1 and idx[:m].tolist() == closed1
    assert (out[:m, 4] == S32_MAX).any()  # saturated, not wrapped


def test_nfs_window_edge_cases():
    from kmlc import features

    f = [0] * 8
    # a lone event never closes; the first event 1 s later closes its window
    ev = [[0, 0, 1, 4096, 4096], [999_999_999, 2, 1, 7, 4096], [10**9, 0, 1, 0, 8192]]
    w = features.nfs(np.array(ev), frac=f)
    assert w.closed_by.tolist() == [2]
    # 2 events in 1 s; one read, one page add: no means; rsize of the closing event
    assert w.raw.tolist() == [[2, 0, 0, 0, 0, 0, 0, 2]]
    # reclaim scans count for every mount, and only between open and close
    ev = [[0, 3, 0, 100, 0], [1, 0, 1, 0, 4096], [2, 3, 9, 30, 0], [3, 3, 9, 10, 0],
          [4, 0, 2, 0, 4096], [10, 0, 1, 0, 4096], [11, 0, 2, 0, 4096]]
    w = features.nfs(np.array(ev), window_ms=5e-6, frac=f)
    assert w.closed_by.tolist() == [5, 6]
    assert w.raw[:, 6].tolist() == [20, 0]          # (30 + 10) / 2, then none after t=4
    assert w.raw[:, 0].tolist() == [exact_q(3 * 10**9, 9, 0), exact_q(10**9, 7, 0)]


def test_nfs_extractor_rejects_bad_events():
    from kmlc import features
    from kmlc.errors import KmlcError

    with pytest.raises(KmlcError, match="rows of 5"):
        features.nfs(np.zeros((3, 4), dtype=np.int64))
    with pytest.raises(KmlcError, match="kind 0 \\(read\\)"):
        features.nfs(np.array([[0, 4, 0, 0, 4096]]))
    with pytest.raises(KmlcError, match="time order"):
        features.nfs(np.array([[5, 0, 0, 0, 4096], [4, 0, 0, 1, 4096]]))
    with pytest.raises(KmlcError, match="reclaim scans go to reclaim"):
        features.NfsStream().event(0, 3, 0, 1, 4096)


def clamp_oracle(want, negotiated):
    if negotiated < 4096:
        return negotiated
    fits = [2**p for p in range(12, 19) if 2**p <= min(want, negotiated)]
    return max(fits) if fits else 4096


def vote_oracle(history, k):
    last = history[-max(1, min(16, k)):]
    best, votes = None, 0
    for v in reversed(last):   # ties go to the most recent
        if last.count(v) > votes:
            best, votes = v, last.count(v)
    return best


def test_nfs_clamps(lib):
    hand = {(262144, 1 << 20): 262144, (4096, 1 << 20): 4096, (262144, 65536): 65536,
            (262144, 100000): 65536, (1000, 1 << 20): 4096, (8192, 2048): 2048,
            (1 << 20, 1 << 20): 262144, (0, 4096): 4096, (131072, 131071): 65536,
            (2**32 - 1, 2**32 - 1): 262144}
    for (want, neg), r in hand.items():
        assert lib.nfs_clamp(want, neg) == r == clamp_oracle(want, neg), (want, neg)
    rng = np.random.default_rng(8)
    for want, neg in rng.integers(0, 2**21, (3000, 2)).tolist():
        assert lib.nfs_clamp(want, neg) == clamp_oracle(want, neg)


def test_nfs_majority_vote(lib):
    rng = np.random.default_rng(9)
    for k in (0, 1, 2, 3, 5, 16, 40):
        want = rng.choice([4096, 65536, 262144], 200).astype(np.uint32)
        out = np.zeros(200, dtype=np.uint32)
        lib.nfs_decide(want.ctypes.data, 200, k, 1 << 20, out.ctypes.data)
        hist = want.tolist()
        assert out.tolist() == [vote_oracle(hist[:i + 1], k) for i in range(200)], k
    # classes asking for the same rsize vote together; a tie goes to the newest
    out = np.zeros(3, dtype=np.uint32)
    lib.nfs_decide(np.array([4096, 262144, 262144], np.uint32).ctypes.data, 3, 3, 65536,
                   out.ctypes.data)
    assert out.tolist() == [4096, 65536, 65536]
    lib.nfs_decide(np.array([4096, 262144], np.uint32).ctypes.data, 2, 4, 1 << 20,
                   out.ctypes.data)
    assert out[:2].tolist() == [4096, 262144]


def test_nfs_stream_equals_batch_extraction():
    from kmlc import features

    ev = nfs_stream(np.random.default_rng(10), 4000)
    s = features.NfsStream(window_ms=20)
    got = []
    for i, (t, kind, mount, a, rsize) in enumerate(ev.tolist()):
        if kind == 3:
            s.reclaim(a)
        elif (f := s.event(t, kind, mount, a, rsize)) is not None:
            got.append((i, f))
    want = features.nfs(ev, window_ms=20)
    assert [i for i, _ in got] == want.closed_by.tolist()
    assert np.array_equal(np.array([f for _, f in got]), want.raw)


@pytest.mark.parametrize("numerics", ["fixed", "float"])
def test_nfs_decisions_are_the_modules(tmp_path, numerics):
    """kmlc.features.nfs with the hook's fraction bits, decided by
    twin.decide() and voted and clamped by NfsRsize, equals the hook's own
    replay of the same events (decisions at the close for a fixed model,
    deferred for a float one)."""
    from conftest import nfs_policy
    from kmlc import features
    from kmlc.api import compile as kcompile, load

    m, cal = nfs_policy()
    kcompile(m, tmp_path / "nfs", name="nfsp", numerics=numerics, targets=["kernel", "user"],
             calibration=cal if numerics == "fixed" else None, hooks=["nfs-rsize"])
    twin = load(tmp_path / "nfs")
    ev = nfs_stream(np.random.default_rng(11), 5000, mounts=4)
    w = features.nfs(ev, window_ms=30, frac=twin.hook_frac)
    classes = twin.decide(w.raw)
    assert set(classes.tolist()) == {0, 2}   # random mounts -> 0, sequential -> 2
    from kmlc.hooks import owner

    fixed = numerics == "fixed"
    table = [4096, 4096, 262144, 262144]
    # a float model's work item may skip a window (a newer one closed first): every third
    decided = [j for j in range(len(classes)) if fixed or (j + 1) % 3]
    wants = [table[c] if j in decided else None for j, c in enumerate(classes)]
    rows = owner("nfs-rsize").rows_from_events(ev, w.closed_by, wants, vote=3)
    rf, rd = twin.replay(rows)
    assert np.array_equal(rf, w.raw)
    votes = {}
    want = [[classes[j], votes.setdefault(ev[w.closed_by[j], 2], features.NfsRsize(vote=3))
             .decide(table[classes[j]], 1 << 20)] for j in decided]
    assert rd.tolist() == want
