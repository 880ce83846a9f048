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

``unpack`` refuses, with one line naming the problem, anything but such a
blob for this structure: a wrong length (every truncation), a CRC mismatch
(every single-byte corruption), another format, numerics or structure, a
payload of another size, layer records that do not match the program's
dense layers and accumulator widths, or a bound beyond the accumulator.
Re-proving the bounds from the new weights themselves is the loader's job
in C (not yet written), which must not trust these records.
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from .errors import KmlcError
from .schedule import Buffer, Program

MAGIC = b"KMLW"
FORMAT = 1
HEADER = struct.Struct("<4sHBB32sII")
RECORD = struct.Struct("<IB3xQ")
# kernel parameters the C shows only in comments: a new set may change them
COMMENT_ONLY = ("acc_bound", "wide_bound")
ACC_LIMIT = {"i32": 2**31 - 1, "i64": 2**62}


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


def _layers(prog: Program) -> list[tuple[int, int, int]]:
    """(kernel index, accumulator bits, proven bound) per dense layer."""
    return [(i, 64 if k.params["acc"] == "i64" else 32, int(k.params["acc_bound"]))
            for i, k in enumerate(prog.kernels) if k.kind == "qdense"]


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


def unpack(prog: Program, data: bytes, what: str = "weights blob") -> tuple[int, bytes]:
    """(version, struct image) of a blob for ``prog``'s structure, or a
    one-line KmlcError naming what is wrong."""
    return check(data, fixed=prog.numerics == "fixed", shash=structure_hash(prog),
                 weight_bytes=prog.weight_bytes, layers=[r[:2] for r in _layers(prog)],
                 names=[k.fn for k in prog.kernels], what=what)


def check(data: bytes, *, fixed: bool, shash: bytes, weight_bytes: int,
          layers: list[tuple[int, int]] | None = None, names: list[str] | None = None,
          what: str = "weights blob") -> tuple[int, bytes]:
    """``unpack`` against what a compiled model says of itself (the twin's
    library): its numerics, structure hash and weight-set size, and, where
    known, its dense layers' (kernel index, accumulator bits).  Without
    ``layers`` the records are checked against the header and their own
    widths only (the structure hash covers the widths)."""
    if len(data) < HEADER.size + 4:
        raise KmlcError(f"{what}: {len(data)} bytes, too short for a kmlc weight set")
    n_rec = len(layers) if layers is not None else data[7]
    want = HEADER.size + RECORD.size * n_rec + weight_bytes + 4
    if len(data) != want:
        raise KmlcError(f"{what}: {len(data)} bytes; a weight set of this model has {want} "
                        "(truncated, or for another model)")
    (crc,) = struct.unpack("<I", data[-4:])
    if crc32c(data[:-4]) != crc:
        raise KmlcError(f"{what}: checksum mismatch (corrupted)")
    magic, fmt, fx, n, got_hash, version, payload = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise KmlcError(f"{what}: not a kmlc weight set (magic {magic!r})")
    if fmt != FORMAT:
        raise KmlcError(f"{what}: format {fmt}; this kmlc reads format {FORMAT}")
    if fx != int(fixed):
        raise KmlcError(f"{what}: {'fixed' if fx else 'float'} weights for a "
                        f"{'fixed' if fixed else 'float'} model")
    if got_hash != shash:
        raise KmlcError(f"{what}: built for another model structure (graph, shapes or "
                        "formats differ)")
    if payload != weight_bytes or n != n_rec:
        raise KmlcError(f"{what}: header sizes do not match the model")
    for j in range(n_rec):
        ki, kbits, bound = RECORD.unpack_from(data, HEADER.size + j * RECORD.size)
        if layers is not None and (ki, kbits) != tuple(layers[j]):
            i, bits = layers[j]
            raise KmlcError(f"{what}: layer record {j} is for kernel {ki} with {kbits}-bit "
                            f"sums; the model's is kernel {i} with {bits}-bit sums")
        if f"i{kbits}" not in ACC_LIMIT:
            raise KmlcError(f"{what}: layer record {j} has {kbits}-bit sums")
        if bound > ACC_LIMIT[f"i{kbits}"]:
            layer = names[ki] if names and ki < len(names) else f"record {j}"
            raise KmlcError(f"{what}: layer {layer}: proven |acc| <= {bound} does not fit "
                            f"its {kbits}-bit accumulator")
    start = HEADER.size + RECORD.size * n_rec
    return version, data[start:start + payload]
