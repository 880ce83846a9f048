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

    out = tmp_path / "adm"
    kcompile(EXAMPLES / "heimdall.onnx", out, numerics="fixed", hooks=["admission"],
             targets=["kernel", "user"],
             calibration=seed_models.sample_inputs("heimdall", 500, seed=1))
    rng = np.random.default_rng(4)
    kinds = rng.integers(0, 2, 3000)
    slow = (np.arange(3000) // 500) % 2 == 1  # alternating fast and slow periods
    lat_ns = rng.lognormal(np.where(slow, 8.5, 5.5), 0.5) * 1000
    ev = np.stack([kinds, np.where(kinds == 0, 2 ** rng.integers(12, 18, 3000),
                                   rng.poisson(np.where(slow, 12, 4))),
                   np.where(kinds == 0, rng.poisson(np.where(slow, 12, 4)), lat_ns),
                   np.where(kinds == 0, 0, 2 ** rng.integers(12, 18, 3000))],
                  1).astype(np.int64)
    twin = load(out)
    feats, decisions = twin.admit_replay(ev)
    assert twin.hook_frac.tolist() == twin.fixed["frac_bits"]
    got = features.admission(ev, frac=twin.hook_frac)
    assert len(feats) == (kinds == 0).sum()
    assert np.array_equal(got.raw, feats)
    assert np.array_equal(twin.decide(got.raw), decisions)
    assert 0 < decisions.sum() < len(decisions)  # both decisions occur


def test_extractors_reject_bad_events():
    from kmlc import features
    from kmlc.errors import KmlcError

    with pytest.raises(KmlcError, match="rows of 4"):
        features.readahead(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(KmlcError, match="time order"):
        features.readahead(np.array([[5, 0, 0, 0], [4, 0, 1, 0]]))
    with pytest.raises(KmlcError, match="kind 0"):
        features.admission(np.array([[2, 0, 0, 0]]))
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

    kinds = rng.integers(0, 2, n)
    aev = np.stack([kinds, rng.integers(1, 2**20, n), rng.integers(0, 10**8, n),
                    rng.integers(512, 2**20, n)], 1)
    a = features.AdmissionStream()
    rows = [a.read(e[1], e[2]) if e[0] == 0 else a.complete(e[1] % 64, e[2], e[3])
            for e in aev.tolist()]
    aev[kinds == 1, 1] %= 64
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
    rf, rc = twin.ra_replay(trace[: n // 2 + 3])  # leaves windows open at its end
    rf, rc = twin.ra_replay(trace)                # which must not leak into this replay
    assert np.array_equal(rf, w.raw) and np.array_equal(rc, classes)
    assert set(classes.tolist()) == {0, 2}  # random files -> 0, sequential -> 2
