"""Lowering: graph IR to a schedule of kernel calls over buffers.

Guarantees:
  * every op becomes exactly one kernel call, except ``reshape``, which
    becomes a view: its result shares its operand's buffer;
  * every graph output is written by the kernel that produces it, directly
    into the caller's ``out`` array; a ``copy`` kernel is added only when an
    output is a graph input, a constant, or the same buffer as an earlier
    output;
  * all loop parameters (extents, strides, loop order) are final, so codegen
    only prints them: extent-1 dims are dropped, and neighbouring dims that
    are contiguous in every operand are merged into one loop;
  * no kernel writes a buffer it also reads, so templates may accumulate in
    their output;
  * every C identifier is unique within the model and prefixed by its role
    (``k<i>_`` kernel functions and the constants kernel i introduces, such as
    ``k2_w`` and ``k2_bias``; ``t_`` workspace buffers), so none can collide
    with C keywords, kernel macros or template locals.
"""
from __future__ import annotations

import numpy as np

from ..errors import KmlcError
from ..ir import BOOL, DTYPES, F32, I8, I16, I32, I64, U8, U32, DType, Graph, Value, c_identifier, \
    fresh_namer
from ..ops import ELEMENTWISE, MATH, MOVES
from ..schedule import SIMD_ISAS, W8_OFFSET, W8_OVERREAD, Buffer, Kernel, Port, Program
from ..weightset import member_offsets, members_end

C_RESERVED = {
    # C keywords
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch",
    "typedef", "union", "unsigned", "void", "volatile", "while",
    # names the templates use for parameters and locals
    "in", "out", "workspace", "ws", "ret", "a", "b", "c", "x", "y", "i", "j", "k", "o", "q",
    "acc", "m", "s", "best", "v", "e", "n", "t", "xk", "ak", "w", "w_tail", "r", "xx", "x0",
    "x1", "sat", "d", "idx", *(f"i{g}" for g in range(8)), *(f"r{g}" for g in range(8)),
    *(f"{p}{i}" for p in "psv" for i in range(16)), *(f"a{i}" for i in range(256)),
}


def contiguous_strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def broadcast_strides(shape, out_shape) -> list[int]:
    """Element strides that read ``shape`` broadcast to ``out_shape``."""
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    cs = contiguous_strides(s)
    return [0 if s[d] == 1 else cs[d] for d in range(len(out_shape))]


def coalesce(extents, *strides) -> list[tuple[int, tuple[int, ...]]]:
    """Loop dims as (extent, per-operand strides), extent-1 dims dropped and
    dims merged where every operand walks them as one contiguous run."""
    dims = [(e, tuple(s[d] for s in strides)) for d, e in enumerate(extents) if e != 1]
    merged: list[tuple[int, tuple[int, ...]]] = []
    for e, st in dims:
        if merged:
            pe, pst = merged[-1]
            if all(p == c * e for p, c in zip(pst, st)):
                merged[-1] = (pe * e, st)
                continue
        merged.append((e, st))
    return merged


# Dense layers by constant weights walk their outputs in tiles: a tile's
# accumulators stay in registers for the whole sum over k, and its weights
# are stored tile by tile, input-major inside the tile, so the kernel
# streams them in order.  Float tiles are 16 outputs (four SSE vectors of
# four lanes, the most x86-64's 16 SSE registers hold with room to spare);
# each lane is one output's sum, taken in index order, so the bits are the
# scalar loop's.
F32_TILE = 16
F32_LANES = 4

# Fixed point: the kernel's integer code is scalar (no SSE), so each output
# of a tile is one accumulator in a general-purpose register; four leave
# room for the pointers and counters among x86-64's 16 without spilling.
# Integer sums are exact in any order (the overflow proof bounds every
# partial sum), so tiling cannot change a bit.  Weights are stored at their
# width (int8 or int16), tile by tile.
QDENSE_TILE = 4
# Paired outputs: where the proof puts every sum in int32 (an s32
# accumulator), two outputs share one 64-bit accumulator, lo + hi * 2^32
# modulo 2^64, and one 64 x 64 -> 64-bit multiply by the weights packed at
# run time (kml_pack2: w[k][2j] + w[k][2j+1] * 2^32) adds both products;
# kml_unpack2 in kml_fixed.h takes the sums apart exactly.  Half the
# multiplies, no extra bytes.  Four pairs (eight outputs) per tile.
#
# The same layers have SIMD paths (kml_simd.h): pmaddwd multiplies eight
# int16 pairs and adds each two adjacent products, so the weights of a
# paired layer are stored in input pairs, [tile][k / 2][output][k % 2]
# (a zero weight after an odd K's last input), which one vector load feeds
# to pmaddwd against (x[2k'], x[2k' + 1]) broadcast, and which the scalar
# path reads as well: one copy of the weights for every path.  The sums
# are exact modulo 2^32 in any order, hence exact (the proof bounds them
# by 2^31), so every path computes the same integers.
PAIR_TILE = 8
# Layers, or the outputs after a layer's tiles, narrower than a tile: R < 8
# outputs stored [k / 2][R][2], pair after pair.  On the SIMD paths one
# vector of 2 * lanes weights spans lanes / R input pairs or more: lane l of
# the j-th vector of a step holds dword d = lanes * j + l of the step's
# weights, output d % R of pair d // R, and takes that pair's inputs, put in
# place by one shuffle of the step's P input pairs, loaded at once
# (kml_simd.h, KML_PICK).  A step is lcm(R, lanes) dwords: P pairs, V
# vectors.  Each lane sums one output over some of its pairs, exactly as
# the tiles do; the generated code adds each output's lanes, and the pairs
# after the last whole step on the scalar code.
SIMD_LANES = {"sse2": 4, "avx2": 8}


def narrow_plan(r: int, k: int) -> dict:
    """The SIMD paths' steps over R outputs of K inputs in pairs: per path,
    pairs and vectors per step, whole steps, and each vector's shuffle
    (the step's input pair of each lane); {} when a path would have no
    whole step."""
    plan = {}
    for isa, lanes in SIMD_LANES.items():
        step = np.lcm(r, lanes)
        pairs, vectors, steps = step // r, step // lanes, (k // 2) // (step // r)
        if not steps:
            return {}
        plan[isa] = {"pairs": int(pairs), "vectors": int(vectors), "steps": int(steps),
                     "picks": [[(lanes * j + lane) // r for lane in range(lanes)]
                               for j in range(vectors)]}
    return plan


# Elementwise ops as C: {a}, {b}, {c} stand for the operands' elements.
# Helpers are kml_elem.h's (integers, both translation units) and
# kml_math.h's (floats); ops.py's evaluators compute the same results.
_CMP_C = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
_SUFFIX = {F32: "f", I16: "_s32", I32: "_s32", I64: "_s64"}
ELEMENTWISE_DOC = {"compare": "a comparison, 1 or 0", "where": "a ? b : c",
                   "sqrt": "correctly rounded", "exp": "docs/numerics.md", "log": "docs/numerics.md",
                   "erf": "docs/numerics.md",
                   "round": "round half to even", "cast": "a conversion (docs/numerics.md)",
                   "qlin": "fixed point, docs/numerics.md: int16 saturation counted"}


def elementwise_expr(op, out: DType) -> str:
    """The C expression of elementwise ``op`` whose result is stored into
    an array of ``out`` (the op's own type, or the output carrier)."""
    k = op.kind
    d = op.inputs[0].type.dtype
    if k in ("add", "sub", "mul", "div"):
        return "{a} %s {b}" % {"add": "+", "sub": "-", "mul": "*", "div": "/"}[k]
    if k == "compare":
        return "{a} %s {b}" % _CMP_C[op.attrs["cmp"]]
    if k == "where":
        return "{a} ? {b} : {c}"
    if k in ("not", "and", "or"):
        return {"not": "!{a}", "and": "{a} && {b}", "or": "{a} || {b}"}[k]
    if k in ("floor", "ceil", "round") or k in MATH and k != "reciprocal":
        return f"kml_{k}f({{a}})"
    if k == "reciprocal":
        return "1.0f / {a}"
    if k in ("max", "min"):
        return f"kml_{k}{_SUFFIX[d]}({{a}}, {{b}})"
    if k == "abs":
        return f"kml_abs{_SUFFIX[d]}({{a}})"
    if k == "neg":
        return "-{a}" if d == F32 else f"kml_neg{_SUFFIX[d]}({{a}})"
    if k == "cast":
        to = DTYPES[op.attrs["to"]]
        if to == BOOL:
            return "{a} != 0" if d != F32 else "{a} != 0.0f"
        if d == F32:
            return f"kml_f32_to{_SUFFIX[to]}({{a}})"
        return f"({to.ctype}){{a}}"
    raise AssertionError(k)


def qlin_expr(a: dict) -> str:
    """A qlin's C expression (kmlc.ops: qlin): kml_fixed.h's kml_qlin, a
    constant table as the multiplier (table "mult") or the offset; a
    product's kml_qmul."""
    if a.get("prod"):
        return (f"kml_qmul({{a}}, {a['za']}, {{b}}, {a['zb']}, {a['ma']}, {a['shift']}, {a['zp']}, "
                "&sat)")
    t = a.get("table")
    terms = ("{a}", a["za"], a["ma"], 0, 0, 0) if "zb" not in a and t is None else \
        ("{a}", a["za"], "{b}", 0, 0, 0) if t == "mult" else \
        ("{a}", a["za"], a["ma"], "{b}", 0, 1) if t == "offset" else \
        ("{a}", a["za"], a["ma"], "{b}", a["zb"], a["mb"])
    return "kml_qlin(" + ", ".join(map(str, terms)) + f", {a['shift']}, {a['zp']}, &sat)"


def carrier(v: Value) -> DType:
    """The element type of ``in``/``out`` that holds graph value ``v``:
    its own, but int16 (a fixed-point activation) travels as s32."""
    return I32 if v.type.dtype == I16 else v.type.dtype


def io_types(g: Graph, numerics: str) -> tuple[DType, DType]:
    """The element types of the entry point's ``in`` and ``out`` arrays.
    All inputs share one type.  Outputs do too, but class indices and
    bools, small exact integers, may join float (or fixed-point) outputs,
    written as their values."""
    kinds = {carrier(v) for v in g.inputs}
    if len(kinds) > 1:
        names = ", ".join(f"'{g.source_name(v)}' ({v.type.dtype})" for v in g.inputs)
        raise KmlcError(f"inputs {names} differ in element type; a kmlc model takes all its "
                        "inputs in one array of one type (Cast them to one type in the model)")
    outs = {carrier(v) for v in g.outputs}
    if len(outs) == 1:
        return kinds.pop(), outs.pop()
    producers = g.producers()

    def small(v):       # exact in float and in s32: an ArgMax index, a bool, an integer
        # constant within 2^24, or a selection between such (a class label table)
        while v in producers and producers[v].kind == "reshape":
            v = producers[v].inputs[0]
        if v.type.dtype == BOOL:
            return True
        if v.is_const:
            return v.data.dtype.kind in "iu" and bool(np.all(np.abs(v.data) <= 1 << 24))
        op = producers.get(v)
        return op is not None and (op.kind == "argmax" or (
            op.kind == "where" and small(op.inputs[1]) and small(op.inputs[2])))
    base = F32 if numerics == "float" else I32
    big = [v for v in g.outputs if carrier(v) != base and not small(v)]
    if big:
        names = ", ".join(f"'{g.source_name(v)}' ({v.type.dtype})" for v in g.outputs)
        raise KmlcError(f"outputs {names} mix element types; a kmlc model writes all its "
                        "outputs to one array, which may hold class indices, class labels "
                        f"and bools beside {base} values but not other integers (Cast them "
                        "to one type)")
    return kinds.pop(), base


def rq_words(mult, shift) -> list[int]:
    """Per channel, the requantization word mult << 6 | shift that
    kml_rq_mult and kml_rq_shift take apart (mult < 2^26, shift < 64)."""
    assert all(0 <= m < 2**26 and 0 <= s < 64 for m, s in zip(mult, shift))
    return [(int(m) << 6) | int(s) for m, s in zip(mult, shift)]


class _Lowering:
    def __init__(self, g: Graph, numerics: str):
        self.g = g
        self.numerics = numerics
        self.io_in, self.io_out = io_types(g, numerics)  # element types of in[] and out[]
        self.cname = fresh_namer(taken=C_RESERVED)
        self.buf: dict[Value, Buffer] = {}
        self.consts: dict[tuple, Buffer] = {}
        self.kernels: list[Kernel] = []

    def const(self, v: Value, role: str, shape=None, dtype=None) -> Buffer:
        """``v``'s data as a static array, in C declaration ``shape``, named
        after the kernel about to use it (``k3_w``); the comment above its
        definition names the IR value it holds."""
        shape = tuple(shape or (v.type.numel,))
        dtype = dtype or v.type.dtype
        key = (v, shape, dtype)
        if key not in self.consts:
            data = np.ascontiguousarray(v.data, dtype=dtype.np).reshape(shape)
            self.consts[key] = Buffer(self.cname(f"k{len(self.kernels)}_{role}"), dtype,
                                      data.size, "const", data, value=v.name)
        return self.consts[key]

    def array(self, role: str, values, dtype) -> Buffer:
        """A static array of per-channel parameters made by lowering itself."""
        data = np.ascontiguousarray(values, dtype=dtype.np).reshape(-1)
        return Buffer(self.cname(f"k{len(self.kernels)}_{role}"), dtype, data.size, "const",
                      data, value=f"{role} of kernel k{len(self.kernels)}")

    def tiles(self, wkn: np.ndarray, dtype, width: int, value: str, unit: str = "outputs",
              merge: bool = True, last_in_tail: bool = False,
              in_pairs: bool = False) -> tuple[dict, dict]:
        """Input-major weights ``wkn`` [K, N] cut into tiles of ``width``
        outputs: operands ``w`` [T][K][width] for the T full tiles and
        ``w_tail`` [K][R] for the R = N % width outputs left (either may be
        absent), and the tiling parameters.  ``in_pairs``: inputs in pairs
        instead, ``w`` [T][K2][width][2] and ``w_tail`` [K2][R][2] with
        K2 = floor(K / 2), [.][k2][n][j] holding input 2 * k2 + j's weight;
        for an odd K, the last input's weights in ``w_last`` [T][width] and
        ``w_tail_last`` [R]."""
        k, n = wkn.shape
        t, r = divmod(n, width)
        if t == 0 or (t == 1 and merge):  # below 2 * width: one block, one pass over x
            t, r = 0, n
        if last_in_tail and not r:  # the last column needs the tail's own code
            t, r = t - 1, width
        params = {"count": t, "width": width, "tail": r, "tail_start": t * width}
        rows, inputs, row = k, f"{k} inputs", "input k's weights"
        last = None
        if in_pairs:
            rows = k // 2
            if k % 2:   # an odd K's last input: a row of its own (no padding)
                last, wkn = wkn[k - 1], wkn[:k - 1]
            # [K2][2][N] -> [K2][N][2]
            wkn = wkn.reshape(rows, 2, n).transpose(0, 2, 1)
            inputs = f"{rows} input pairs"
            row = "inputs 2k and 2k + 1's weights ([n][j]: output n, input 2k + j)"
            params["in_pairs"] = rows
        else:
            wkn = wkn.reshape(k, n, 1)
        out = {}
        idx = len(self.kernels)
        squeeze = (lambda a: a) if in_pairs else (lambda a: a[..., 0])
        if t:
            data = np.ascontiguousarray(
                squeeze(wkn[:, :t * width].reshape(rows, t, width, -1).transpose(1, 0, 2, 3)),
                dtype=dtype.np)
            out["w"] = Buffer(self.cname(f"k{idx}_w"), dtype, data.size, "const", data,
                              value=value, layout=f"{t} tiles x {inputs} x {width} {unit}: "
                              f"[t][k] holds {row} for tile t")
            if last is not None:
                data = np.ascontiguousarray(last[:t * width].reshape(t, width), dtype=dtype.np)
                out["w_last"] = Buffer(self.cname(f"k{idx}_w_last"), dtype, data.size, "const",
                                       data, value=value, layout=f"{t} tiles x {width} {unit}: "
                                       f"input {k - 1}'s weights (the odd one out)")
        if r:
            data = np.ascontiguousarray(squeeze(wkn[:, t * width:]), dtype=dtype.np)
            what = f"{unit} {t * width} to {n - 1}" if t else f"{n} {unit}"
            tail = "_tail" if t else ""
            out["w_tail"] = Buffer(self.cname(f"k{idx}_w{tail}"), dtype, data.size, "const",
                                   data, value=value,
                                   layout=f"{inputs} x {what}: row k holds {row}")
            if last is not None:
                data = np.ascontiguousarray(last[t * width:], dtype=dtype.np)
                out["w_tail_last"] = Buffer(self.cname(f"k{idx}_w{tail}_last"), dtype, data.size,
                                            "const", data, value=value)
        return out, params

    def operand(self, v: Value, role: str) -> Buffer:
        if v.is_const:
            return self.const(v, role)
        return self.buf[v]

    def result(self, v: Value, outputs: dict[Value, Buffer]) -> Buffer:
        # C names in lower case (kernel style; ONNX names are often CamelCase)
        b = outputs.get(v) or Buffer(self.cname(f"t_{v.name}".lower()), v.type.dtype,
                                     v.type.numel, "temp", value=v.name)
        self.buf[v] = b
        return b

    def kernel(self, kind, op, operands, **params) -> None:
        main = next((o for o in op.origin if o.endswith(("(Gemm)", "(MatMul)"))),
                    op.origin[0] if op.origin else op.kind)
        tag = c_identifier(main, "op").lower()[:32]
        fn = self.cname(f"k{len(self.kernels)}_{tag}".rstrip("_"))
        self.kernels.append(Kernel(kind, fn, operands, params, op.origin))

    # -- per op kind ------------------------------------------------------------

    def matmul(self, op, y):
        kind = op.kind
        x, w = op.inputs[:2]
        c = op.inputs[2] if len(op.inputs) == 3 else None
        p = dict(batch=[], alpha=None, beta=None, act="none", act_params={})
        tiled = False
        if kind == "dense":
            k, n = w.type.shape
            m = x.type.numel // k
            tiled = w.is_const and m == 1 and n >= F32_LANES
            ops = {"a": self.operand(x, "a")}
            if tiled:
                bufs, tiling = self.tiles(np.asarray(w.data, np.float32), F32, F32_TILE, w.name)
                ops.update(bufs)
            else:
                ops["b"] = self.const(w, "w", (k, n)) if w.is_const else self.buf[w]
            p.update(a=(k, 1), b=(n, 1), c=None, act=op.attrs["act"],
                     act_params=op.attrs.get("act_params", {}), alpha=op.attrs.get("alpha"))
            if c is not None:
                ops["c"] = self.operand(c, "bias")
                p["c"] = (0, 1) if c.type.shape == (n,) else (n, 1)
        elif kind == "gemm":
            m, n = op.output.type.shape
            ta, tb = op.attrs["transA"], op.attrs["transB"]
            k = x.type.shape[0] if ta else x.type.shape[1]
            ops = {"a": self.operand(x, "a"), "b": self.operand(w, "w")}
            p.update(a=(1, m) if ta else (k, 1), b=(1, k) if tb else (n, 1), c=None,
                     alpha=op.attrs["alpha"] if op.attrs["alpha"] != 1.0 else None)
            if c is not None:
                ops["c"] = self.operand(c, "c")
                p["c"] = tuple(broadcast_strides(c.type.shape, (m, n)))
                p["beta"] = op.attrs["beta"] if op.attrs["beta"] != 1.0 else None
        else:  # matmul, numpy semantics
            sa, sb = x.type.shape, w.type.shape
            a2 = (1,) + sa if len(sa) == 1 else sa
            b2 = sb + (1,) if len(sb) == 1 else sb
            m, k, n = a2[-2], a2[-1], b2[-1]
            batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
            sa_b = broadcast_strides(a2[:-2], batch)
            sb_b = broadcast_strides(b2[:-2], batch)
            sy_b = contiguous_strides(batch)
            p["batch"] = coalesce(batch, [s * m * k for s in sa_b], [s * k * n for s in sb_b],
                                  [s * m * n for s in sy_b])
            ops = {"a": self.operand(x, "a"), "b": self.operand(w, "w")}
            p.update(a=(k, 1), b=(n, 1), c=None)
        order = "kn" if p["b"][1] == 1 and n >= 4 else "dot"
        if tiled:
            order = "tiles"
            p["tiles"] = dict(tiling, lanes=F32_LANES)
        ops["y"] = y
        self.kernel("matmul", op, ops, m=m, n=n, k=k, order=order, **p)

    def qdense(self, op, y):
        x, w, b = op.inputs
        a = op.attrs
        n, k = w.type.shape
        # Tiles of outputs: x[k] is loaded once per tile, the tile's
        # accumulators stay in registers, its weights are adjacent.
        wkn = np.asarray(w.data, np.int64).T
        pairs = a["acc"] == "i32" and n >= 2 and k >= 2
        # Weights in input pairs, tiles of 8 from 8 outputs up: the SIMD paths
        # take the full tiles, summing in int32 lanes (paired layers) or, where
        # the proof needs int64, each pmaddwd's int32 pair sums (exact: the
        # weights are within +-32767, so |w0 x0 + w1 x1| < 2^31) in int64 lanes
        in_pairs = k >= 2 and (pairs or n >= PAIR_TILE)
        assert np.abs(wkn).max(initial=0) <= 32767, "weights beyond int16's symmetric range"
        wtiles, tiling = self.tiles(wkn, w.type.dtype, PAIR_TILE if in_pairs else QDENSE_TILE,
                                    w.name, merge=not in_pairs, in_pairs=in_pairs)
        tiling["pairs"] = pairs
        # the scalar path's full tiles of int8 weights: offset pairs
        # (kml_fixed.h, kml_w8_lane), where every lane's sum of x * (w + 128)
        # is in int32 for any int8 weights, whatever the proof says of the
        # layer's own sums (the bias joins them in s64)
        tiling["offset"] = (w.type.dtype == I8 and in_pairs and tiling["count"] > 0
                            and tiling["width"] == PAIR_TILE
                            and 255 * 2 * (k // 2) * int(a["x_max"]) < 2**31)
        if tiling["offset"]:    # stored as u8 w + 128, which every path reads
            tw = wtiles["w"]
            tw.dtype, tw.data = U8, (tw.data.astype(np.int16) + W8_OFFSET).astype(np.uint8)
        # the SIMD paths' share: full tiles, and outputs narrower than a tile
        # of a paired layer of int8 weights (int16 ones put the sums in
        # int64) over int16 activations, in whole steps of input pairs; the
        # activations as the C holds them: one that is also a graph output
        # lives in out[], as s32 (carrier)
        tiling["narrow"] = (narrow_plan(tiling["tail"], k) if pairs and tiling["tail"]
                            and w.type.dtype == I8 and self.operand(x, "x").dtype == I16
                            else {})
        tiling["simd"] = in_pairs and (tiling["count"] > 0 or bool(tiling["narrow"]))
        # ... which requantize in vectors too, on the paths listed, for a
        # plain clamp into int16: int32 sums on both (kml_requant8_avx2),
        # int64 sums on AVX2 only (kml_requant4_s64_avx2: SSE2 has neither
        # 64-bit compares nor per-lane 64-bit shifts, and its scalar
        # epilogue measured faster); otherwise the scalar epilogue follows
        vector = tiling["simd"] and tiling["count"] > 0 and a["mode"] == "clamp" \
            and "mult_neg" not in a and y.dtype == I16
        tiling["simd_epilogue"] = (SIMD_ISAS if pairs else ("avx2",)) if vector else ()
        ops = {"x": self.operand(x, "x"), **wtiles, "b": self.const(b, "bias"),
               "rq": self.array("rq", rq_words(a["mult"], a["shift"]), U32)}
        if "mult_neg" in a:
            ops["rq_neg"] = self.array("rq_neg", rq_words(a["mult_neg"], a["shift_neg"]), U32)
        ops["y"] = y
        params = {key: a[key] for key in ("mode", "fn", "zp", "lo", "hi", "acc", "acc_bound",
                                          "flip", "wide_bound", "x_max", "x_max_wide") if key in a}
        if a["mode"] == "clamp" and "mult_neg" not in a and a["lo"] >= a.get("zp", 0):
            # ReLU: a negative sum requantizes to at most 0, which the clamp
            # raises to lo anyway, so the sign never matters (kml_requant_relu)
            params["requant"] = "relu"
            params["relu"] = True   # the floor is the op's: below it is no saturation
        self.kernel("qdense", op, ops, n=n, k=k, tiles=tiling, counts=a["mode"] == "clamp",
                    **params)

    def trees(self, op, y):
        """A tree ensemble: its tables as weight-set members, by role."""
        a = op.attrs
        roles = ["x", "threshold", "leaf", "feature", "next", "root"] + \
            (["leaf_target"] if a["sparse"] else []) + (["flags"] if a["flags"] else []) + \
            (["base"] if a["base"] else [])
        # 2-D tables keep their shape: [node][0] true branch, [leaf][target]
        ops = {r: self.const(v, r, v.type.shape) if r in ("next", "leaf") else
               self.operand(v, r) for r, v in zip(roles, op.inputs)}
        leaf = op.inputs[2]
        n = a["branches"]
        ops["next"].layout = (f"{op.inputs[1].type.numel} nodes x 2: [i][0] follows a test "
                              f"that holds, [i][1] one that fails; nodes {n} and up are the "
                              f"leaves (leaf i - {n}), which lead back to themselves")
        if not a["sparse"]:
            ops["leaf"].layout = f"{leaf.type.shape[0]} leaves x {a['targets']} targets: a " \
                "leaf's vote for each"
        rows, features = op.inputs[0].type.shape
        self.kernel("trees", op, {**ops, "y": y}, rows=rows, features=features,
                    nodes=n, leaves=leaf.type.shape[0],
                    trees=op.inputs[5].type.numel, targets=a["targets"], depth=a["depth"],
                    mode=a["mode"], aggregate=a["aggregate"], sparse=a["sparse"],
                    flags=a["flags"], base=a["base"])

    def ewise(self, op, y, expr=None, **extra):
        """An elementwise op: one loop nest over the result, each operand
        read through its broadcast strides, one C expression per element
        (``expr``: a fixed-point op's, which counts saturations)."""
        shape = op.output.type.shape
        roles = "abc"[:len(op.inputs)]
        dims = coalesce(shape, *(broadcast_strides(v.type.shape, shape) for v in op.inputs),
                        contiguous_strides(shape))
        ops = {r: self.operand(v, r) for r, v in zip(roles, op.inputs)}
        self.kernel("ewise", op, {**ops, "y": y}, dims=dims,
                    expr=expr or elementwise_expr(op, y.dtype),
                    what=ELEMENTWISE_DOC.get(op.kind, ""), **extra)

    def move(self, op, y):
        """Transpose, slice, concat and expand: strided copies, one loop
        nest per operand, y[oy + sum i_d sy_d] = x[ox + sum i_d sx_d]
        (a slice's stride is negative where its step is)."""
        out = op.output.type.shape
        cy = contiguous_strides(out)
        a = op.attrs
        parts, ops = [], {}
        if op.kind == "concat":
            axis, at_ = a["axis"] % len(out), 0
            for j, v in enumerate(op.inputs):
                role = f"a{j}"
                ops[role] = self.operand(v, role)
                dims = coalesce(v.type.shape, contiguous_strides(v.type.shape), cy)
                parts.append({"role": role, "ox": 0, "oy": at_ * cy[axis], "dims": dims})
                at_ += v.type.shape[axis]
        else:
            x = op.inputs[0]
            cx = contiguous_strides(x.type.shape)
            ox = 0
            if op.kind == "transpose":
                sx = [cx[p] for p in a["perm"]]
            elif op.kind == "slice":
                sx = [c * st for c, st in zip(cx, a["steps"])]
                ox = sum(c * s0 for c, s0 in zip(cx, a["starts"]))
            else:   # expand
                sx = broadcast_strides(x.type.shape, out)
            ops["a0"] = self.operand(x, "a0")
            parts.append({"role": "a0", "ox": ox, "oy": 0, "dims": coalesce(out, sx, cy)})
        what = {"transpose": f"y = x transposed by {list(a.get('perm', []))}",
                "slice": "y = a slice of x" + (" (reversed where a step is negative)"
                                                if any(st < 0 for st in a.get("steps", [])) else ""),
                "concat": f"y = the operands concatenated along axis {a.get('axis')}",
                "expand": f"y = x broadcast to {list(out)}"}[op.kind]
        self.kernel("move", op, {**ops, "y": y}, parts=parts, what=what)

    def gather(self, op, y):
        x, ind = op.inputs
        outer, n, inner = self.axis_split(x.type.shape, op.attrs["axis"])
        self.kernel("gather", op, {"x": self.operand(x, "x"), "idx": self.operand(ind, "idx"),
                                   "y": y}, outer=outer, n=n, inner=inner, q=ind.type.numel,
                    fill=int(op.attrs.get("fill", 0)))

    def reduce(self, op, y):
        """A reduction: loops over the kept axes outside, the reduced ones
        inside in row-major order (the evaluator's order), strides of x."""
        x = op.inputs[0]
        shape, cx = x.type.shape, contiguous_strides(x.type.shape)
        axes = sorted(ax % len(shape) for ax in op.attrs["axes"])
        kept = [i for i in range(len(shape)) if i not in axes]
        ky = contiguous_strides([shape[i] for i in kept])
        outer = coalesce([shape[i] for i in kept], [cx[i] for i in kept], ky)
        inner = coalesce([shape[i] for i in axes], [cx[i] for i in axes])
        self.kernel("reduce", op, {"x": self.operand(x, "x"), "y": y}, outer=outer,
                    inner=inner, fn=op.attrs["fn"],
                    count=int(np.prod([shape[i] for i in axes], dtype=np.int64)))

    def axis_split(self, shape, axis):
        axis %= len(shape)
        return (int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
                int(np.prod(shape[axis + 1:], dtype=np.int64)))

    def run(self) -> Program:
        g = self.g
        producers = g.producers()

        def root(v: Value) -> Value:
            while v in producers and producers[v].kind == "reshape":
                v = producers[v].inputs[0]
            return v

        inputs, off = [], 0
        for v in g.inputs:
            b = Buffer(self.cname(v.name.lower()), self.io_in, v.type.numel, "input", offset=off,
                       value=v.name)
            self.buf[v] = b
            inputs.append(Port(g.source_name(v), v.type, b))
            off += v.type.numel

        outputs, direct, copies, off = [], {}, [], 0
        for v in g.outputs:
            r = root(v)
            b = Buffer(self.cname(f"out_{v.name}".lower()), self.io_out, v.type.numel, "output",
                       offset=off, value=v.name)
            if r in g.inputs or r.is_const or r in direct:
                copies.append((r, b))
            else:
                direct[r] = b
            outputs.append(Port(g.source_name(v), v.type, b))
            off += v.type.numel

        for op in g.ops:
            if op.kind == "reshape":
                src = op.inputs[0]
                self.buf[op.output] = self.operand(src, "x")
                continue
            y = self.result(op.output, direct)
            x = op.inputs[0]
            if op.kind in ("dense", "gemm", "matmul"):
                self.matmul(op, y)
            elif op.kind in ("add", "sub", "mul", "div") or op.kind in ELEMENTWISE \
                    or op.kind in MATH:
                self.ewise(op, y)
            elif op.kind in MOVES:
                self.move(op, y)
            elif op.kind in ("gather", "reduce"):
                getattr(self, op.kind)(op, y)
            elif op.kind in ("relu", "leaky_relu", "sigmoid", "tanh", "clip"):
                self.kernel("map", op, {"x": self.operand(x, "x"), "y": y}, n=x.type.numel,
                            act=op.kind, act_params=dict(op.attrs))
            elif op.kind in ("softmax", "argmax", "qsoftmax"):
                outer, n, inner = self.axis_split(x.type.shape, op.attrs["axis"])
                extra = {"last": op.attrs["select_last_index"]} if op.kind == "argmax" else {}
                if op.kind == "qsoftmax":
                    extra = {"mult": op.attrs["mult"], "shift": op.attrs["shift"]}
                self.kernel(op.kind, op, {"x": self.operand(x, "x"), "y": y}, outer=outer, n=n,
                            inner=inner, **extra)
            elif op.kind == "qinput":
                a = op.attrs
                self.kernel("qinput", op, {
                    "x": self.operand(x, "x"), "center": self.array("center", a["center"], I32),
                    "shift": self.array("shift", a["shift"], U8), "y": y},
                    n=x.type.numel, saturate=bool(a.get("saturate")),
                    counts=bool(a.get("saturate")))
            elif op.kind == "qdense":
                self.qdense(op, y)
            elif op.kind == "trees":
                self.trees(op, y)
            elif op.kind == "qlin":
                self.ewise(op, y, expr=qlin_expr(op.attrs), counts=True)
            elif op.kind == "qtab":
                a = op.attrs
                self.kernel("qtab", op, {"x": self.operand(x, "x"),
                                         "t": self.const(op.inputs[1], "tab"), "y": y},
                            n=x.type.numel, counts=bool(a.get("sat")), sat=a.get("sat"),
                            **{k: a[k] for k in ("fn", "o", "down", "m", "k", "umax", "err")})
            elif op.kind == "qact":
                self.kernel("qact", op, {"x": self.operand(x, "x"), "y": y}, n=x.type.numel,
                            counts=op.attrs["mode"] in ("leaky", "neg", "abs", "requant"),
                            **{k: v for k, v in op.attrs.items() if k != "scale"})
            else:
                raise KmlcError(f"node '{', '.join(op.origin)}' ({op.kind}) computes on runtime "
                                f"data; kmlc evaluates {op.kind} only at compile time, when all "
                                "its inputs are constants")

        for r, b in copies:
            src = self.const(r, "x", dtype=self.io_out) if r.is_const else self.buf[r]
            self.kernels.append(Kernel("copy", self.cname(f"k{len(self.kernels)}_copy_{b.value}"),
                                       {"x": src, "y": b}, {"n": b.numel}, ("output copy",)))
        prog = Program(g.name, self.numerics, inputs, outputs, self.kernels, in_dtype=self.io_in,
                       out_dtype=self.io_out)
        self.overread_pad(prog)
        return prog

    def overread_pad(self, prog: Program) -> None:
        """Offset pairs' loads (kml_fixed.h, kml_w8_lane) read up to
        W8_OVERREAD bytes past a tile array, which the mask then drops:
        where fewer member bytes than that follow the last such array in
        the weight set, a zero pad member closes the gap, so that every
        load stays inside the set (the model's C asserts it at build
        time).  The pad is pinned like every member no layer owns."""
        arrays = [k for k in self.kernels if k.kind == "qdense" and k.params["tiles"].get("offset")]
        if not arrays:
            return
        off = member_offsets(prog)
        k = max(arrays, key=lambda k: off[k.operands["w"].name])
        w = k.operands["w"]
        short = W8_OVERREAD - (members_end(prog) - off[w.name] - w.nbytes)
        if short > 0:
            k.operands["w_pad"] = Buffer(self.cname(f"{w.name}_pad"), U8, short,
                                         "const", np.zeros(short, np.uint8),
                                         value="bytes the offset pairs' loads may read")


def lower(g: Graph, numerics: str = "float") -> Program:
    return _Lowering(g, numerics).run()
