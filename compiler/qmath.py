"""Bit-exact Python mirror of ``runtime-kernel/kml_fixed.h``.

numpy int64 arithmetic doing what the C does, operation for operation; the
tables are read from ``kml_lut.h`` itself, so there is one copy of them.
tests/unit/test_qmath.py holds this mirror to the C on every LUT input and
on random requantizations.  The fixed-point reference evaluator
(``kmlc.ops``) is built on it.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from .runtime_kernel import DIR as RUNTIME

Q15_ONE = 32768
SIGMOID_IN_FRAC = 11
TANH_IN_FRAC = 12
EXP_IN_FRAC = 11
LUT_FUNCS = {"sigmoid": SIGMOID_IN_FRAC, "tanh": TANH_IN_FRAC}


@lru_cache(maxsize=None)
def table(name: str) -> np.ndarray:
    text = (RUNTIME / "kml_lut.h").read_text()
    body = re.search(rf"kml_{name}_table\[\d+\] = \{{(.*?)\}};", text, re.S).group(1)
    return np.array([int(v) for v in re.findall(r"\d+", body)], dtype=np.int64)


def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _abs_u64(v: np.ndarray) -> np.ndarray:
    """|v| as uint64, defined for every int64 (kml_abs_u64)."""
    u = v.astype(np.uint64)
    return np.where(v < 0, np.uint64(0) - u, u)


def _with_sign(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    m = m.astype(np.int64)
    return np.where(v < 0, -m, m)


def _round_off(m: np.ndarray, shift) -> np.ndarray:
    """(m + 2^(shift-1)) >> shift in uint64, or m when shift is 0."""
    shift = np.asarray(shift, dtype=np.uint64)
    half = np.where(shift > 0, np.uint64(1) << (np.maximum(shift, np.uint64(1)) - np.uint64(1)),
                    np.uint64(0))
    return (m + half) >> shift


@np.errstate(over="ignore")
def round_shift(v, shift) -> np.ndarray:
    """round(v / 2^shift), ties away from zero (kml_round_shift)."""
    v = _i64(v)
    return _with_sign(v, _round_off(_abs_u64(v), shift))


WIDE_LIMIT = 2**63 - 1


@np.errstate(over="ignore")
def floor_shift(v, shift) -> np.ndarray:
    """floor(v / 2^shift) (kml_floor_shift)."""
    return np.floor_divide(_i64(v), np.left_shift(np.int64(1), np.asarray(shift, np.int64)))


def round_q(v, shift, fn: str) -> np.ndarray:
    """kml_floor_q, kml_ceil_q, kml_round_q: the integer v / 2^shift rounds
    to down, up, or half to even."""
    v = _i64(v)
    if fn == "floor":
        return floor_shift(v, shift)
    if fn == "ceil":
        return -floor_shift(-v, shift)
    h = v + (np.int64(1) << np.int64(shift - 1))
    q = floor_shift(h, shift)
    tie = (h & ((np.int64(1) << np.int64(shift)) - 1)) == 0
    return np.where(tie & (q & 1 == 1), q - 1, q)


def requant(acc, mult, shift) -> np.ndarray:
    """round(acc * mult / 2^shift), ties away from zero: kml_requant where
    |acc| * mult < 2^63 (what the compiler proves for the int32-and-int16
    paths), and kml_requant_wide for any int64 acc (the product in 128
    bits, the result saturated to +-(2^63 - 1): the same where both apply).  ``mult`` and ``shift`` may be
    per-element arrays."""
    acc = _i64(acc)
    mult = np.asarray(mult, dtype=np.uint64)
    if float(np.abs(acc.astype(np.float64)).max(initial=0)) * float(mult.max(initial=0)) \
            < 2.0**62:
        m = _abs_u64(acc) * mult
        return _with_sign(acc, _round_off(m, shift))
    a, mu, sh = np.broadcast_arrays(acc, mult, np.asarray(shift))
    out = np.empty(a.shape, dtype=np.int64)
    for i in np.ndindex(a.shape):
        v, s = int(a[i]), int(sh[i])
        m = abs(v) * int(mu[i])
        m = min((m + (1 << (s - 1))) >> s if s else m, WIDE_LIMIT)
        out[i] = -m if v < 0 else m
    return out


def clamp(v, lo, hi) -> np.ndarray:
    return np.minimum(np.maximum(_i64(v), lo), hi)


def lut(t: np.ndarray, u) -> np.ndarray:
    u = _i64(u)
    seg, frac = u >> 5, u & 31
    t0, t1 = t[seg], t[seg + 1]
    d = np.abs(t1 - t0)
    corr = (d * frac + 16) >> 5
    return np.where(t1 >= t0, t0 + corr, t0 - corr)


def lut_index(x) -> np.ndarray:
    return np.minimum(np.abs(_i64(x)), 32767)


def sigmoid_q15(x) -> np.ndarray:
    x = _i64(x)
    y = lut(table("sigmoid"), lut_index(x))
    y = np.where(x < 0, Q15_ONE - y, y)
    return np.minimum(y, 32767)


def tanh_q15(x) -> np.ndarray:
    x = _i64(x)
    y = np.minimum(lut(table("tanh"), lut_index(x)), 32767)
    return np.where(x < 0, -y, y)


def exp_q15(d) -> np.ndarray:
    d = _i64(d)
    return lut(table("exp"), lut_index(np.minimum(d, 0)))


def tab_index(u, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """kml_tab's segment of each u in [0, 2^16): (index, log2 of its width)."""
    u = _i64(u)
    e = np.frexp(np.maximum(u, 1))[1].astype(np.int64) - 1        # exact below 2^53
    geo = (u >> (m + k)) > 0
    sh = np.where(geo, e - m, k)
    return np.where(geo, ((e - m - k) << m) + (u >> sh), u >> k), sh


def tab_starts(count: int, m: int, k: int) -> np.ndarray:
    """The u at which each of kml_tab's first ``count`` segments starts."""
    j = np.arange(count, dtype=np.int64)
    q, s = (j - (1 << m)) >> m, (j - (1 << m)) & ((1 << m) - 1)
    return np.where(j < (1 << m), j << k, ((1 << m) + s) << (k + np.maximum(q, 0)))


def tab(t: np.ndarray, x, o: int, down: bool, m: int, k: int, umax: int) -> np.ndarray:
    """kml_tab: a function of int16 ``x`` by its table ``t``."""
    t = _i64(t)
    u = np.clip(o - _i64(x) if down else _i64(x) - o, 0, umax)
    j, sh = tab_index(u, m, k)
    frac = u & ((np.int64(1) << sh) - 1)
    t0, t1 = t[j], t[j + 1]
    corr = (np.abs(t1 - t0) * frac + ((np.int64(1) << sh) >> 1)) >> sh
    return np.where(t1 >= t0, t0 + corr, t0 - corr)


def qmul(a, za: int, b, zb: int, m: int, shift: int, zp: int) -> np.ndarray:
    """kml_qmul before its saturation: round((a - za) * (b - zb) * m /
    2^shift) + zp."""
    return round_shift((_i64(a) - za) * (_i64(b) - zb) * m, shift) + zp


LUT_EVAL = {"sigmoid": sigmoid_q15, "tanh": tanh_q15}


# ---- choosing multipliers -----------------------------------------------------

def multiplier(scale: float, max_abs_acc: int, mult_bits: int = 31) -> tuple[int, int]:
    """(mult, shift) with mult / 2^shift ~= scale, mult < 2^mult_bits, and
    max_abs_acc * mult < 2^63 so that ``requant`` is exact.  The multiplier
    keeps as many bits as both limits allow; shift stays in [0, 62]."""
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale {scale:.6g} is not a positive finite number")
    headroom = 63 - max(int(max_abs_acc), 1).bit_length()
    bits = max(1, min(mult_bits, headroom))
    e = int(np.floor(np.log2(scale)))          # scale in [2^e, 2^(e+1))
    shift = bits - 1 - e                        # mult in [2^(bits-1), 2^bits)
    if shift > 62:                              # tiny scale: give up mantissa bits
        bits -= shift - 62
        shift = 62
        if bits < 1:
            return 0, 0                         # result rounds to zero anyway
    if shift < 0:
        raise ValueError(f"scale {scale} too large for requantization")
    mult = int(round(scale * 2.0 ** shift))
    if mult >= 1 << bits:                       # rounding reached the next power of 2
        mult >>= 1
        shift -= 1
    return mult, shift
