"""Bit-exact Python mirror of the float32 numerics kmlc generates.

Every function here computes, in numpy float32, exactly the operations the
generated C performs, in the same order: ``runtime-kernel/kml_math.h`` for the
elementwise functions and the kernel templates for reductions (a matmul sums
``k = 0, 1, ..., K-1`` one product at a time; softmax sums along its axis in
index order).  numpy's float32 ``+ - * /`` are IEEE-754 operations rounded to
nearest even, like the C built with ``-ffp-contract=off``, so the results are
the same bits.  tests/unit/test_fmath.py holds this mirror to the C.

The IR evaluator (``kmlc.ops``) uses these functions, so constant folding
computes what the module would, and tests can check any pass bit for bit.
"""
from __future__ import annotations

import numpy as np

f32 = np.float32


def _c(s: str) -> np.float32:
    """A C float literal's value (decimal rounded once to binary32)."""
    return np.float32(s)


EXP_HI = _c("88.7228317")
EXP_LO = _c("-103.972084")
LOG2E = _c("1.44269504")
LN2_HI = _c("0.693359375")
LN2_LO = _c("-2.12194440e-4")
EXP_P = [_c(s) for s in ("1.9875691500e-4", "1.3981999507e-3", "8.3334519073e-3",
                         "4.1665795894e-2", "1.6666665459e-1", "5.0000001201e-1")]
TANH_P = [_c(s) for s in ("-5.70498872745e-3", "2.06390887954e-2", "-5.37397155531e-2",
                          "1.33314422036e-1", "-3.33332819422e-1")]
FLT_MAX = np.finfo(np.float32).max


def _pow2(n: np.ndarray) -> np.ndarray:
    return ((n + 127).astype(np.uint32) << np.uint32(23)).view(np.float32)


@np.errstate(all="ignore")
def expf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    out = np.zeros_like(x)
    nan, big = np.isnan(x), x > EXP_HI
    out[nan] = x[nan]
    out[big] = np.inf
    mid = ~nan & ~big & ~(x < EXP_LO)
    xm = x[mid]
    t = xm * LOG2E
    n = np.where(t >= f32(0), t + f32(0.5), t - f32(0.5)).astype(np.int32)  # truncates, like C
    fn = n.astype(np.float32)
    r = xm - fn * LN2_HI
    r = r - fn * LN2_LO
    z = r * r
    p = np.full_like(r, EXP_P[0])
    for c in EXP_P[1:]:
        p = p * r + c
    p = p * z + r + f32(1)
    n1 = (np.abs(n) // 2) * np.sign(n)  # C division truncates toward zero
    out[mid] = p * _pow2(n1) * _pow2(n - n1)
    return out


@np.errstate(all="ignore")
def sigmoidf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    pos = x >= f32(0)
    e = expf(np.where(pos, -x, x))
    return np.where(pos, f32(1) / (f32(1) + e), e / (f32(1) + e)).astype(np.float32)


@np.errstate(all="ignore")
def tanhf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    ax = np.where(x < f32(0), -x, x)
    small = ax < f32(0.625)
    z = x * x
    p = np.full_like(x, TANH_P[0])
    for c in TANH_P[1:]:
        p = p * z + c
    poly = p * z * x + x
    big = f32(1) - f32(2) / (expf(ax + ax) + f32(1))
    big = np.where(x < f32(0), -big, big)
    return np.where(small, poly, big).astype(np.float32)


_U = np.uint64


@np.errstate(all="ignore")
def sqrtf(x) -> np.ndarray:
    """kml_sqrtf: the integer square root of the scaled fraction, rounded by
    its remainder; IEEE sqrt on every input (NaN payloads aside)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    t = (u >> _U(23)) & _U(0xff)
    f = u & _U(0x7fffff)
    sub = t == _U(0)
    f = np.where(sub, f, f | _U(0x800000))
    t = np.where(sub, _U(23), t + _U(22))
    for _ in range(23):  # normalize subnormals (a zero just runs through)
        need = (f & _U(0x800000)) == _U(0)
        f = np.where(need, f << _U(1), f)
        t = np.where(need, t - _U(1), t)
    m = f << np.where(t & _U(1), _U(23), _U(24))
    q = np.zeros_like(m)
    r = np.zeros_like(m)
    for s in range(46, -1, -2):
        r = (r << _U(2)) | ((m >> _U(s)) & _U(3))
        q = q << _U(1)
        up = r >= _U(2) * q + _U(1)
        r = np.where(up, r - (_U(2) * q + _U(1)), r)
        q = q | up.astype(np.uint64)
    bits = (((t + _U(105)) >> _U(1)) - _U(1)) * _U(0x800000) + q + (r > q).astype(np.uint64)
    a = u & _U(0x7fffffff)
    bits = np.where(u >> _U(31) == _U(1), _U(0x7fc00000), bits)
    bits = np.where((a == _U(0)) | (u == _U(0x7f800000)), u, bits)
    bits = np.where(a > _U(0x7f800000), u | _U(0x400000), bits)
    return bits.astype(np.uint32).view(np.float32)


SQRT2 = _c("1.41421356")
LOG_P = [_c(s) for s in ("0.070376836292", "-0.11514610310", "0.11676998740",
                         "-0.12420140846", "0.14249322787", "-0.16668057665",
                         "0.20000714765", "-0.24999993993", "0.33333331174")]


@np.errstate(all="ignore")
def logf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    sub = u < np.uint32(0x800000)
    xs = np.where(sub, x * f32(33554432.0), x)
    e = np.where(sub, np.int32(-152), np.int32(-127))
    us = xs.view(np.uint32)
    e = e + (us >> np.uint32(23)).astype(np.int32)
    m = ((us & np.uint32(0x7fffff)) | np.uint32(0x3f800000)).view(np.float32)
    big = m > SQRT2
    m = np.where(big, m * f32(0.5), m)
    e = e + big.astype(np.int32)
    f = m - f32(1)
    fe = e.astype(np.float32)
    z = f * f
    y = np.full_like(f, LOG_P[0])
    for c in LOG_P[1:]:
        y = y * f + c
    y = y * f * z
    y = y + fe * LN2_LO
    y = y - f32(0.5) * z
    out = (f + y) + fe * LN2_HI
    out = np.where(x < f32(0), np.uint32(0x7fc00000).view(np.float32), out)
    out = np.where(x == f32(0), f32(-np.inf), out)
    out = np.where(x == f32(np.inf), x, out)
    return np.where(np.isnan(x), x, out).astype(np.float32)


ERF_EFX = _c("0.128379166")
ERF_PP, ERF_QQ = ([_c(s) for s in ("-0.00186261395", "-0.336030394", "0.128379166")],
                  [_c(s) for s in ("-0.00198859372", "0.0216070414", "0.312324315", "1.0")])
ERF_PA, ERF_QA = ([_c(s) for s in ("0.0867677554", "-0.209395722", "0.415109307",
                                   "0.00000365041046")],
                  [_c(s) for s in ("0.0392478965", "0.371248513", "0.495560974", "1.0")])
ERF_ERX = _c("0.842697144")
ERF_RA, ERF_SA = ([_c(s) for s in ("-0.691554189", "-1.66828310", "-0.543658376",
                                   "-0.00988156721")],
                  [_c(s) for s in ("0.553855181", "4.10799170", "4.48581553", "1.0")])
ERF_RB, ERF_SB = ([_c(s) for s in ("-1.84115684", "-0.548049808", "-0.00986496918")],
                  [_c(s) for s in ("-0.761900663", "3.04982710", "4.87132740", "1.0")])


def _horner(coef, t):
    p = np.full_like(t, coef[0])
    for c in coef[1:]:
        p = p * t + c
    return p


@np.errstate(all="ignore")
def erff(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    ix = x.view(np.uint32) & np.uint32(0x7fffffff)
    ax = ix.view(np.float32)
    tiny = x + ERF_EFX * x
    z = x * x
    small = x + x * (_horner(ERF_PP, z) / _horner(ERF_QQ, z))
    s = ax - f32(1)
    mid = ERF_ERX + _horner(ERF_PA, s) / _horner(ERF_QA, s)
    s = f32(1) / (ax * ax)
    near = ix < np.uint32(0x4036db8c)
    pq = np.where(near, _horner(ERF_RA, s) / _horner(ERF_SA, s),
                  _horner(ERF_RB, s) / _horner(ERF_SB, s))
    z = (ix & np.uint32(0xffffe000)).view(np.float32)
    r = expf(-z * z - f32(0.5625)) * expf((z - ax) * (z + ax) + pq)
    tail = f32(1) - r / ax
    r = np.where(ix < np.uint32(0x3fa00000), mid,
                 np.where(ix < np.uint32(0x40800000), tail, f32(1)))
    r = np.where(x < f32(0), -r, r)
    r = np.where(ix < np.uint32(0x3f580000),
                 np.where(ix < np.uint32(0x38800000), tiny, small), r)
    return np.where(np.isnan(x), x, r).astype(np.float32)


def reluf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return np.where(x < f32(0), f32(0), x)


@np.errstate(all="ignore")
def leaky_reluf(x, alpha) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return np.where(x < f32(0), f32(alpha) * x, x)


def clipf(x, lo, hi) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    x = np.where(x < f32(lo), f32(lo), x)
    return np.where(x > f32(hi), f32(hi), x)


def activation(x, act: str, params: dict) -> np.ndarray:
    """The activations a dense kernel can fuse, by name (see ``ACTIVATIONS``)."""
    if act == "none":
        return np.asarray(x, dtype=np.float32)
    if act == "relu":
        return reluf(x)
    if act == "leaky_relu":
        return leaky_reluf(x, params["alpha"])
    if act == "sigmoid":
        return sigmoidf(x)
    if act == "tanh":
        return tanhf(x)
    if act == "clip":
        return clipf(x, params["min"], params["max"])
    raise ValueError(f"unknown activation {act}")


ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "clip")


def matmul_seq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a[..., M, K] @ b[..., K, N] with each output summed k = 0..K-1."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    # every product rounded to float32, then added in k order (accumulate
    # is r[k] = r[k-1] + p[k], in float32): the C loop's roundings exactly
    products = a[..., :, :, None] * b[..., None, :, :]
    return np.add.accumulate(products, axis=-2, dtype=np.float32)[..., -1, :]


@np.errstate(all="ignore")
def softmaxf(x: np.ndarray, axis: int) -> np.ndarray:
    x = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    m = x[..., 0]
    for j in range(1, x.shape[-1]):
        m = np.where(x[..., j] > m, x[..., j], m)
    e = expf(x - m[..., None])
    s = e[..., 0]
    for j in range(1, x.shape[-1]):
        s = s + e[..., j]
    y = e / s[..., None]
    return np.moveaxis(y.astype(np.float32), -1, axis)


def argmax(x: np.ndarray, axis: int, last: bool) -> np.ndarray:
    """Index of the first (or last) maximum, found by a scan like the C."""
    x = np.moveaxis(np.asarray(x), axis, -1)
    best = x[..., 0]
    idx = np.zeros(best.shape, dtype=np.int64)
    for j in range(1, x.shape[-1]):
        better = (x[..., j] >= best) if last else (x[..., j] > best)
        best = np.where(better, x[..., j], best)
        idx = np.where(better, j, idx)
    return idx
