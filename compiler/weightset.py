"""A model's weight set as bytes: its structure hash and the blob format.

The generated C reads every constant of a model from one ``struct
kml_<core>_weights`` (codegen: ``Program.weight_set()`` orders its members,
larger elements first, so that none is padded).  A weight set built for the
same structure can replace the one a model was compiled with.  This module
defines what "the same structure" means and the bytes that carry a set:

``structure_hash(prog)``
    sha256 over everything the generated C depends on except the constants'
    values: numerics, ports, and each kernel's kind, function, parameters
    (proof bounds left out: the C shows them only in comments) and operands
    (names, element types, sizes, roles).  Two programs with the same hash
    render the same C apart from the constants' values and comments.

``pack(prog, version)`` / ``unpack(prog, data)``, the ``.kmlw`` format,
little-endian throughout:

    offset  bytes  field
         0      4  magic "KMLW"
         4      2  format (1)
         6      1  numerics (0 float, 1 fixed)
         7      1  L, the number of dense-layer records
         8     32  structure hash
        40      4  version (the user's number for this set)
        44      4  payload bytes (sizeof the struct)
        48  16 L   per dense layer: u32 kernel index, u8 accumulator bits,
                   3 zero bytes, u64 the proven bound on |acc|
         .      P  the struct's image: members in order at their offsets,
                   zero padding
     end-4      4  CRC32C (Castagnoli, reflected, as iSCSI and ext4 use it)
                   of every byte before it

The reader is C, one function for the module and the twin alike:
``kml_set_check()`` in runtime-kernel/kml_weights.h, bound to a model by
the descriptor its generated code defines from ``dense_layers`` (where each
dense layer's constants are, its shape, accumulator and the max|x| of its
proven paths) and ``pinned_members`` (fixed point: the members a new set
may not change).  It refuses a wrong length, a CRC mismatch, another
format, numerics or structure, and re-proves every layer's bounds from the
new weights rather than trusting the records, which must state exactly the
bound it finds.  ``kmlc.load(outdir).check_set(blob)`` runs it from Python.
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from .errors import KmlcError
from .schedule import W8_OFFSET, Buffer, Program

MAGIC = b"KMLW"
FORMAT = 1
HEADER = struct.Struct("<4sHBB32sII")
RECORD = struct.Struct("<IB3xQ")
# kernel parameters the C shows only in comments: a new set may change them
COMMENT_ONLY = ("acc_bound", "wide_bound")


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of ``data`` (initial value and final XOR 0xFFFFFFFF)."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _plain(v):
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in sorted(v.items()) if k not in COMMENT_ONLY}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    # json writes a float as its shortest round-trip repr: exact
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def _operand(b: Buffer) -> dict:
    d = {"name": b.name, "dtype": b.dtype.name, "numel": b.numel, "kind": b.kind}
    if b.kind == "const":
        d["shape"] = list(b.data.shape)
    else:
        d["offset"] = b.offset
    return d


def structure(prog: Program) -> dict:
    """What the generated C depends on, but the constants' values."""
    return {
        "numerics": prog.numerics,
        "in": prog.in_dtype.name, "out": prog.out_dtype.name,
        "ports": [[p.name, list(p.type.shape), p.type.dtype.name, _operand(p.buffer)]
                  for p in prog.inputs + prog.outputs],
        "kernels": [{"kind": k.kind, "fn": k.fn, "params": _plain(k.params),
                     "operands": {r: _operand(b) for r, b in k.operands.items()}}
                    for k in prog.kernels],
        "set": [_operand(b) for b in prog.weight_set()],
    }


def structure_hash(prog: Program) -> bytes:
    text = json.dumps(structure(prog), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


# a dense layer's members a new set may change (fixed point): every other
# member is a format of the compiled model, which kmlc pack pins
DENSE_ROLES = ("w", "w_last", "w_tail", "w_tail_last", "b", "rq", "rq_neg")


def dense_layers(prog: Program) -> list[dict]:
    """What kml_set_check() (runtime-kernel/kml_weights.h) re-proves for
    each dense layer of a fixed-point program: its node, kernel index,
    members by role, shape, tiling, weight bytes, accumulator and the
    proven max|x| of its paths (bound_ranges.py), and the bound the blob's
    record states."""
    out = []
    for i, k in enumerate(prog.kernels):
        if k.kind != "qdense":
            continue
        p, t = k.params, k.params["tiles"]
        w = k.operands.get("w", k.operands.get("w_tail"))
        out.append({
            "node": next((o for o in k.origin if o.endswith(("(Gemm)", "(MatMul)"))),
                         k.origin[0] if k.origin else k.fn),
            "kernel": i, "members": {r: k.operands[r].name for r in DENSE_ROLES
                                     if r in k.operands},
            "n": p["n"], "k": p["k"], "count": t["count"], "width": t["width"],
            "wbytes": w.dtype.size, "in_pairs": int("in_pairs" in t),
            "woff": W8_OFFSET if t.get("offset") else 0,
            "acc_bits": 64 if p["acc"] == "i64" else 32, "x_max": int(p["x_max"]),
            "x_max_wide": int(p.get("x_max_wide", 0)), "bound": int(p["acc_bound"])})
    return out


# a tree ensemble's members the C indexes with: a new set may not change them
TREE_STRUCTURE = ("feature", "next", "root", "leaf_target", "flags")


def pinned_members(prog: Program) -> list[Buffer]:
    """The members a new set may not change: in fixed point all but its
    dense layers' weights, biases and requantization words; in float the
    tree ensembles' structure (features, children, roots, leaf targets and
    node flags), whose values index arrays (thresholds, leaf values and
    base values may change)."""
    if prog.numerics == "fixed":
        free = {m for layer in dense_layers(prog) for m in layer["members"].values()}
        return [b for b in prog.weight_set() if b.name not in free]
    tree = {k.operands[r].name for k in prog.kernels if k.kind == "trees"
            for r in TREE_STRUCTURE if r in k.operands}
    return [b for b in prog.weight_set() if b.name in tree]


def blob_bytes(prog: Program) -> int:
    """The size of a ``.kmlw`` blob for ``prog``."""
    return HEADER.size + RECORD.size * len(dense_layers(prog)) + prog.weight_bytes + 4


def members_end(prog: Program) -> int:
    """Where the struct's members end (tail padding follows): a model with
    no constants has the one-byte member ``none``."""
    return sum(b.nbytes for b in prog.weight_set()) or 1


def f32_members(prog: Program) -> list[Buffer]:
    """The float members, which a float model's new set must hold finite."""
    return [b for b in prog.weight_set() if b.dtype.name == "f32"]


def _layers(prog: Program) -> list[tuple[int, int, int]]:
    """(kernel index, accumulator bits, proven bound) per dense layer."""
    return [(d["kernel"], d["acc_bits"], d["bound"]) for d in dense_layers(prog)]


def member_offsets(prog: Program) -> dict[str, int]:
    """Each member's offset in the struct: in order, unpadded (larger
    elements first, so each lies at a multiple of its alignment)."""
    out, off = {}, 0
    for b in prog.weight_set():
        assert off % b.dtype.size == 0, (b.name, off)
        out[b.name] = off
        off += b.nbytes
    return out


def image(prog: Program) -> bytes:
    """The struct's bytes: members in order (no padding between them, by
    construction), then zeros up to its size."""
    body = b"".join(np.ascontiguousarray(b.data, dtype=np.dtype(b.dtype.np).newbyteorder("<"))
                    .tobytes() for b in prog.weight_set())
    size = prog.weight_bytes
    assert len(body) <= size, (len(body), size)
    return body + bytes(size - len(body))


def pack(prog: Program, version: int) -> bytes:
    """The ``.kmlw`` blob of ``prog``'s constants, as version ``version``."""
    if not 0 <= version < 2**32:
        raise KmlcError(f"weight set version {version}: expected 0 .. 4294967295")
    layers = _layers(prog)
    body = HEADER.pack(MAGIC, FORMAT, int(prog.numerics == "fixed"), len(layers),
                       structure_hash(prog), version, prog.weight_bytes)
    body += b"".join(RECORD.pack(*r) for r in layers) + image(prog)
    return body + struct.pack("<I", crc32c(body))


def corruption_cases(prog: Program) -> list[tuple[str, int, bytes, str]]:
    """The KUnit suite's table of forged blobs (kunit_test.c.j2): (what,
    offset, bytes written there into ``pack(prog, 7)``, a word of the
    reason kml_set_check() must give), each resealed with a valid CRC, so
    that every check behind the checksum is reached: header fields, each
    dense layer's record, the tail padding, a changed format, sums that
    could overflow, a bad requantization shift, an int16 weight of -32768,
    a float weight that is not finite."""
    layers = dense_layers(prog)
    img = HEADER.size + RECORD.size * len(layers)
    off = member_offsets(prog)
    fixed = prog.numerics == "fixed"
    out = [("magic", 0, b"KMLX", "magic"), ("format", 4, b"\x02\x00", "format"),
           ("numerics", 6, bytes([0 if fixed else 1]), "weights for a"),
           ("structure hash", 8 + 31, bytes([structure_hash(prog)[31] ^ 1]), "structure"),
           ("record count", 7, bytes([len(layers) + 1]), "header sizes"),
           ("set size", 44, (prog.weight_bytes + 8).to_bytes(4, "little"), "header sizes")]
    end = members_end(prog)
    if end < prog.weight_bytes:
        out.append(("tail padding", img + end, b"\x01", "padding"))
    for j, L in enumerate(layers):
        rec, name = HEADER.size + RECORD.size * j, L["node"]
        out += [(f"{name}: record's kernel", rec, (L["kernel"] + 1).to_bytes(4, "little"),
                 "another kernel"),
                (f"{name}: record's accumulator", rec + 4, bytes([96 - L["acc_bits"]]),
                 "another kernel"),
                (f"{name}: record's padding", rec + 5, b"\x01", "another kernel"),
                (f"{name}: record's bound", rec + 8,
                 (L["bound"] - 1 if L["bound"] else 1).to_bytes(8, "little"), "record's bound")]
        m = L["members"]
        # |bias| alone beyond the accumulator's limit (2^31 - 1, or 2^62),
        # whatever the weights are (all zero too)
        big = -(2**31) if L["acc_bits"] == 32 else -(2**62)
        out += [(f"{name}: bias beyond the accumulator", img + off[m["b"]],
                 big.to_bytes(L["acc_bits"] // 8, "little", signed=True), "sums"),
                (f"{name}: requantization shift 63", img + off[m["rq"]],
                 (1 << 6 | 63).to_bytes(4, "little"), "requantization")]
        if L["wbytes"] == 2:
            w = m.get("w", m.get("w_tail"))
            out.append((f"{name}: int16 weight -32768", img + off[w], b"\x00\x80", "-32768"))
    pinned = pinned_members(prog)
    if pinned:
        b = pinned[0]
        out.append((f"format {b.name}", img + off[b.name],
                    bytes([image(prog)[off[b.name]] ^ 1]), "format"))
    if not fixed:
        f32 = f32_members(prog)
        if f32:
            out.append((f"{f32[0].name} NaN", img + off[f32[0].name],
                        bytes.fromhex("0000c07f"), "finite"))
    return out
