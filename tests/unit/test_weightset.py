"""The weight set as bytes (compiler/weightset.py): the blob's image is the
compiled struct's memory, byte for byte (read from the twin's shared
library, an independent oracle); every truncation and every single-byte
corruption is refused; the structure hash tells a retrained float model
(the same C but for its constants) from another graph."""
import ctypes

import numpy as np
import pytest

from conftest import mlp_model
from kmlc import weightset as ws
from kmlc.api import compile as kcompile
from kmlc.errors import KmlcError


def rows(n=400, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32)


def build(tmp_path, numerics, seed=1, sizes=(6, 20, 3), tag=""):
    d = tmp_path / f"{numerics}{seed}{tag}"
    res = kcompile(mlp_model(list(sizes), seed=seed), d, targets="user", numerics=numerics,
                   calibration=rows() if numerics == "fixed" else None, name="wst")
    return d, res.program


def test_crc32c_check_value():
    # the CRC-32C catalogue's check value (Castagnoli; iSCSI, ext4)
    assert ws.crc32c(b"123456789") == 0xE3069283
    assert ws.crc32c(b"") == 0


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_image_is_the_compiled_struct(tmp_path, numerics):
    d, prog = build(tmp_path, numerics)
    core = f"wst_{'fp' if numerics == 'float' else 'fx'}"
    lib = ctypes.CDLL(str(d / "user" / "libkml_wst.so"))
    sym = ctypes.c_char.in_dll(lib, f"kml_{core}_builtin")
    compiled = ctypes.string_at(ctypes.addressof(sym), prog.weight_bytes)
    version, img = ws.unpack(prog, ws.pack(prog, 7))
    assert version == 7 and img == ws.image(prog) == compiled


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_every_truncation_and_byte_corruption_is_refused(tmp_path, numerics):
    _, prog = build(tmp_path, numerics)
    blob = ws.pack(prog, 1)
    for n in range(len(blob)):
        with pytest.raises(KmlcError, match="bytes"):
            ws.unpack(prog, blob[:n])
    for i in range(len(blob)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(blob)
            bad[i] ^= flip
            with pytest.raises(KmlcError) as e:
                ws.unpack(prog, bytes(bad))
            assert "\n" not in str(e.value)


def test_structure_hash_tells_models_apart(tmp_path):
    import json

    d, a = build(tmp_path, "float", seed=1)
    assert json.loads((d / "kmlc.json").read_text())["structure_sha256"] == \
        ws.structure_hash(a).hex()
    _, b = build(tmp_path, "float", seed=2)   # retrained: other weights, same C
    _, c = build(tmp_path, "float", seed=1, sizes=(6, 21, 3), tag="w")
    assert ws.structure_hash(a) == ws.structure_hash(b) != ws.structure_hash(c)
    # b's set loads where a's was compiled, and is b's own image
    assert ws.unpack(a, ws.pack(b, 2)) == (2, ws.image(b))
    assert ws.image(a) != ws.image(b)


def test_header_fields_are_checked_behind_a_valid_checksum(tmp_path):
    """A blob whose checksum is right but whose header is not (a forged or
    mis-built one) is refused field by field."""
    _, prog = build(tmp_path, "fixed")
    blob = bytearray(ws.pack(prog, 3))

    def resealed(offset, value: bytes):
        b = bytearray(blob)
        b[offset:offset + len(value)] = value
        body = bytes(b[:-4])
        return body + ws.crc32c(body).to_bytes(4, "little")

    cases = [(0, b"KMLX", "magic"), (4, b"\x02\x00", "format 2"), (6, b"\x00", "float weights"),
             (8, bytes(32), "another model structure"), (44, b"\x00\x00\x00\x00", "header sizes")]
    rec = ws.HEADER.size
    cases += [(rec + 4, b"\x40", "64-bit sums"),
              (rec + 8, (2**31).to_bytes(8, "little"), "does not fit")]
    for offset, value, msg in cases:
        with pytest.raises(KmlcError, match=msg):
            ws.unpack(prog, resealed(offset, value))
    with pytest.raises(KmlcError, match="version"):
        ws.pack(prog, -1)
