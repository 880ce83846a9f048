"""The weight set as bytes (compiler/weightset.py) and its reader, the
model's own C (kml_set_check in runtime-kernel/kml_weights.h, run here
through the twin, as the module runs it): the blob's image is the compiled
struct's memory, byte for byte (read from the twin's shared library, an
independent oracle); every truncation and every single-byte corruption is
refused; a blob with a valid checksum whose header, records or values break
what the kernels rely on is refused field by field; the structure hash
tells a retrained float model (the same C but for its constants) from
another graph."""
import ctypes

import numpy as np
import pytest

from conftest import make_model, mlp_model
from kmlc import weightset as ws
from kmlc.api import compile as kcompile, load
from kmlc.errors import KmlcError


def rows(n=400, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32)


def build(tmp_path, numerics, seed=1, sizes=(6, 20, 3), tag=""):
    d = tmp_path / f"{numerics}{seed}{tag}"
    res = kcompile(mlp_model(list(sizes), seed=seed), d, targets="user", numerics=numerics,
                   calibration=rows() if numerics == "fixed" else None, name="wst")
    return d, res.program


def unpack(d, blob):
    """(version, image) as the model's C reads ``blob``."""
    twin = load(d)
    buf, version = twin.check_set(bytes(blob))
    return version, buf.view(np.uint8)[:twin.weight_bytes].tobytes()


def reseal(blob, offset, value: bytes):
    b = bytearray(blob)
    b[offset:offset + len(value)] = value
    body = bytes(b[:-4])
    return body + ws.crc32c(body).to_bytes(4, "little")


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
    version, img = unpack(d, ws.pack(prog, 7))
    assert version == 7 and img == ws.image(prog) == compiled


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_every_truncation_and_byte_corruption_is_refused(tmp_path, numerics):
    d, prog = build(tmp_path, numerics)
    twin = load(d)
    blob = ws.pack(prog, 1)
    assert len(blob) == ws.blob_bytes(prog)
    for n in range(len(blob)):
        with pytest.raises(KmlcError, match="length"):
            twin.check_set(blob[:n])
    with pytest.raises(KmlcError, match="length"):
        twin.check_set(blob + b"\0")
    for i in range(len(blob)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(blob)
            bad[i] ^= flip
            with pytest.raises(KmlcError, match="checksum") as e:
                twin.check_set(bytes(bad))
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
    assert unpack(d, ws.pack(b, 2)) == (2, ws.image(b))
    assert ws.image(a) != ws.image(b)


def test_header_fields_are_checked_behind_a_valid_checksum(tmp_path):
    """A blob whose checksum is right but whose header or records are not (a
    forged or mis-built one) is refused field by field."""
    d, prog = build(tmp_path, "fixed")
    twin = load(d)
    blob = ws.pack(prog, 3)
    rec = ws.HEADER.size
    cases = [(0, b"KMLX", "magic"), (4, b"\x02\x00", "format"), (6, b"\x00", "float weights"),
             (8, bytes(32), "another model structure"), (44, b"\x00\x00\x00\x00", "header sizes"),
             (rec, b"\x07", "another kernel"), (rec + 4, b"\x40", "another kernel"),
             (rec + 5, b"\x01", "another kernel"),
             (rec + 8, (2**31).to_bytes(8, "little"), "record's bound"),
             (rec + 8, (ws.dense_layers(prog)[0]["bound"] - 1).to_bytes(8, "little"),
              "record's bound"),
             (len(blob) - 4 - 1, b"\x01", None)]
    pad = prog.weight_bytes - sum(b.nbytes for b in prog.weight_set())
    for offset, value, msg in cases:
        if msg is None:          # the struct's last byte: tail padding, if it has any
            msg = "tail padding" if pad else None
            if msg is None:
                continue
        with pytest.raises(KmlcError, match=msg):
            twin.check_set(reseal(blob, offset, value))
    assert twin.check_set(blob)[1] == 3
    with pytest.raises(KmlcError, match="version"):
        ws.pack(prog, -1)


def test_values_are_reproven_behind_a_valid_checksum(tmp_path):
    """The C re-proves each dense layer's bounds from the new values: a bias
    or weights whose sums could overflow the accumulator, a requantization
    word whose product with the bound reaches 2^63 or whose shift is 63,
    an int16 weight of -32768, a changed input encoding (a format), and in
    float a weight that is not finite: each refused, even with a record
    that states the new bound."""
    d, prog = build(tmp_path, "fixed", sizes=(6, 20, 20, 3))
    twin = load(d)
    blob = ws.pack(prog, 1)
    img = ws.HEADER.size + ws.RECORD.size * len(ws.dense_layers(prog))
    off = ws.member_offsets(prog)
    layers = ws.dense_layers(prog)
    L = layers[1]
    bias, rq = L["members"]["b"], L["members"]["rq"]
    btype = 4 if L["acc_bits"] == 32 else 8
    big = (2**31 - 1 if btype == 4 else 2**62).to_bytes(btype, "little", signed=True)
    refused = {
        "overflow the 32-bit" if btype == 4 else "reach 2^62": reseal(blob, img + off[bias], big),
        "requantization": reseal(blob, img + off[rq], (1 << 6 | 63).to_bytes(4, "little")),
    }
    # in int32 sums no multiplier (< 2^26) can reach 2^63: the largest passes
    assert twin.check_set(reseal(blob, img + off[rq], ((2**26 - 1) << 6 | 20)
                                 .to_bytes(4, "little")))[1] == 1
    pinned = ws.pinned_members(prog)
    assert pinned, "a fixed-point model has formats (its input encoding)"
    refused["format"] = reseal(blob, img + off[pinned[0].name],
                               bytes([ws.image(prog)[off[pinned[0].name]] ^ 1]))
    for msg, bad in refused.items():
        with pytest.raises(KmlcError, match=msg) as e:
            twin.check_set(bad)
        assert "layer" in str(e.value) or msg == "format"
    # the int16 -32768 weight: a 16-bit layer
    d16 = tmp_path / "w16"
    p16 = kcompile(mlp_model([6, 20, 3], seed=1), d16, targets="user", numerics="fixed",
                   calibration=rows(), name="wst", weight_bits="16").program
    L16 = ws.dense_layers(p16)[0]
    assert L16["wbytes"] == 2
    b16 = ws.pack(p16, 1)
    at = ws.HEADER.size + ws.RECORD.size * len(ws.dense_layers(p16)) + \
        ws.member_offsets(p16)[L16["members"].get("w", L16["members"].get("w_tail"))]
    with pytest.raises(KmlcError, match="-32768"):
        load(d16).check_set(reseal(b16, at, (-32768).to_bytes(2, "little", signed=True)))
    # int64 sums: a bias of 2^40 steps fits, but not times the largest multiplier
    assert L16["acc_bits"] == 64, L16
    base = ws.HEADER.size + ws.RECORD.size * len(ws.dense_layers(p16))
    o16 = ws.member_offsets(p16)
    w = next(op for op in p16.graph.ops if op.kind == "qdense").inputs[1].data
    bound = int((2**40 + np.abs(w.astype(np.int64)).sum(axis=1) * L16["x_max"]).max())
    n = L16["n"]
    bad = bytearray(reseal(b16, base + o16[L16["members"]["b"]],
                           np.full(n, 2**40, "<i8").tobytes()))
    bad[ws.HEADER.size + 8:ws.HEADER.size + 16] = bound.to_bytes(8, "little")
    for rqw, msg in ((((2**26 - 1) << 6 | 40), "requantization multiplier"), ((1 << 6 | 40), None)):
        b = reseal(bytes(bad), base + o16[L16["members"]["rq"]], np.full(n, rqw, "<u4").tobytes())
        if msg:
            with pytest.raises(KmlcError, match=msg):
                load(d16).check_set(b)
        else:
            assert load(d16).check_set(b)[1] == 1
    # float: a NaN weight
    df, pf = build(tmp_path, "float")
    bf = ws.pack(pf, 1)
    at = ws.HEADER.size + ws.member_offsets(pf)[pf.weight_set()[0].name]
    with pytest.raises(KmlcError, match="not finite"):
        load(df).check_set(reseal(bf, at, np.float32(np.nan).tobytes()))


@pytest.mark.parametrize("kind", ["float", "fixed", "no constants", "zero layer"])
def test_kunit_forgery_table_is_refused_by_the_twin(tmp_path, kind):
    """The KUnit suite's forgeries (weightset.corruption_cases), each refused
    by the same C for its own reason, here through the twin: a model with
    no constants too, whose set is the one-byte member "none" (no tail
    padding to forge), and a fixed model whose last layer's weights and
    bias are all zero (its record's bound 0, forged up, not down: the
    table could not be made for it)."""
    from onnx import TensorProto, helper

    if kind == "zero layer":
        rng = np.random.default_rng(3)
        m = make_model([helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], transB=1),
                        helper.make_node("Sigmoid", ["h"], ["a"]),
                        helper.make_node("Gemm", ["a", "w1", "b1"], ["y"], transB=1)],
                       [("x", [1, 3])], [("y", [1, 2])],
                       {"w0": rng.normal(size=(4, 3)).astype(np.float32),
                        "b0": np.zeros(4, np.float32), "w1": np.zeros((2, 4), np.float32),
                        "b1": np.zeros(2, np.float32)})
        d = tmp_path / "zero"
        prog = kcompile(m, d, targets="user", name="wst", numerics="fixed",
                        calibration=rng.normal(size=(64, 3)).astype(np.float32)).program
        assert min(L["bound"] for L in ws.dense_layers(prog)) == 0
    elif kind == "no constants":
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "noc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        d = tmp_path / "noc"
        prog = kcompile(m, d, targets="user", name="wst").program
        assert prog.weight_set() == [] and ws.members_end(prog) == prog.weight_bytes == 1
    else:
        d, prog = build(tmp_path, kind)
    twin = load(d)
    blob = ws.pack(prog, 7)
    assert twin.check_set(blob)[1] == 7
    cases = ws.corruption_cases(prog)
    assert len(cases) >= 6
    for what, offset, data, why in cases:
        with pytest.raises(KmlcError, match=why):
            twin.check_set(reseal(blob, offset, data))


def test_offset_tiles_are_reproven_as_the_weights_they_hold(tmp_path):
    """Full tiles of offset pairs hold the byte w + 128 (kml_fixed.h,
    kml_w8_lane): the C that re-proves a new set must read them as w.  A
    set whose tile bytes are all 0 holds w = -128 everywhere in the tiles:
    its record must state the bound those weights give (sum |w| * max|x|
    + |b|, computed here from the layer's arrays, the tail's as they are),
    and one that states the bound of the bytes read as they are (0) or as
    int8 (also 0) is refused."""
    d, prog = build(tmp_path, "fixed", sizes=(6, 20, 20, 3))
    layers = ws.dense_layers(prog)
    j, L = next((j, L) for j, L in enumerate(layers) if L["woff"])
    assert L["woff"] == 128 and L["k"] % 2 == 0
    k = prog.kernels[L["kernel"]].operands
    assert k["w"].dtype.name == "u8"
    # the compiled tile bytes are the layer's int8 weights plus 128
    assert k["w"].data.min() >= 0 and k["w"].data.max() <= 255

    def bound(tile_wsum):
        tail = np.abs(k["w_tail"].data.astype(np.int64)).sum(axis=(0, 2)) if "w_tail" in k \
            else np.zeros(0, np.int64)
        wsum = np.concatenate([np.full(L["count"] * L["width"], tile_wsum, np.int64), tail])
        return int((wsum * L["x_max"] + np.abs(k["b"].data.astype(np.int64))).max())

    blob = ws.pack(prog, 3)
    img = ws.HEADER.size + ws.RECORD.size * len(layers)
    at = img + ws.member_offsets(prog)[k["w"].name]
    zeros = reseal(blob, at, bytes(k["w"].nbytes))
    rec = ws.HEADER.size + ws.RECORD.size * j + 8
    right = bound(128 * L["k"])
    assert right < 2**31 - 1 and right != L["bound"]
    twin = load(d)
    buf, version = twin.check_set(reseal(zeros, rec, right.to_bytes(8, "little")))
    assert version == 3
    for wrong in (bound(0), L["bound"]):
        with pytest.raises(KmlcError, match="record's bound"):
            twin.check_set(reseal(zeros, rec, wrong.to_bytes(8, "little")))
