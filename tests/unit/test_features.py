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
