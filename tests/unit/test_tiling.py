"""Tiled dense kernels (passes/lower.py, docs/performance.md): the layouts
lowering chooses, and bit-identity with the reference evaluators for every
kind of block: full tiles, narrower tails, tails whose last SSE vector
overlaps the one before, tails under four outputs (scalar), paired
fixed-point outputs with an odd count, and the cases that must not pair."""
import importlib

import numpy as np
import pytest
from onnx import helper

from conftest import make_model, mlp_model
from kmlc.api import compile as kcompile, load, lower_model
from kmlc.frontends.onnx import load as load_graph
from kmlc.ops import interpret

lowering = importlib.import_module("kmlc.passes.lower")


# hidden widths that hit every block shape: < 4, 4, overlap, one tile,
# tile + scalar tail, tile + vector tail, several tiles + overlapping tail
WIDTHS = [1, 3, 4, 5, 15, 16, 17, 19, 31, 35, 50]


def rows(n_in, n=300, seed=0):
    r = np.random.default_rng(seed)
    x = r.normal(size=(n, n_in)) * r.choice([0.01, 1.0, 30.0], (n, 1))
    return x.astype(np.float32)


@pytest.mark.parametrize("h", WIDTHS)
def test_float_tiles_are_the_reference_bit_for_bit(h, tmp_path):
    m = mlp_model([6, h, 7, 3], act="Sigmoid", seed=h)
    kcompile(m, tmp_path / "o", targets="user", name="tl")
    x = rows(6)
    y = load(tmp_path / "o").run(x)
    g = load_graph(m, name="tl")
    ref = np.stack([interpret(g, r[None])[0].reshape(-1) for r in x]).astype(np.float32)
    assert np.array_equal(y.view(np.uint32), ref.view(np.uint32))


def test_float_layouts():
    p = lower_model(mlp_model([6, 40, 5, 2], act="Relu"), name="tl")
    k1, k2, k3 = [k for k in p.kernels if k.kind == "matmul"]
    # 40 outputs: two tiles of 16, then 8 in a tail; 5 outputs: one block
    assert k1.params["order"] == "tiles" and k1.operands["w"].data.shape == (2, 6, 16)
    assert k1.operands["w_tail"].data.shape == (6, 8)
    assert k2.params["order"] == "tiles" and k2.operands["w_tail"].data.shape == (40, 5)
    assert k3.params["order"] == "dot"  # 2 outputs: below one vector
    w = load_graph(mlp_model([6, 40, 5, 2], act="Relu"), name="tl")
    first = next(op for op in w.ops if op.kind in ("gemm", "dense"))
    wt = first.inputs[1].data  # ONNX Gemm, transB=1: [out, in]
    # tile t, input k, lane j holds output 16 t + j's weight for input k
    assert np.array_equal(k1.operands["w"].data[1, 4], wt[16:32, 4])


@pytest.mark.parametrize("h,bits", [(h, b) for h in (1, 2, 5, 8, 9, 15, 23) for b in "8"]
                         + [(5, "16"), (23, "16")])
def test_fixed_pairs_are_the_integer_reference(h, bits, tmp_path):
    m = mlp_model([6, h, 5, 3], act="Relu", seed=h)
    cal = rows(6, 2000, seed=1)
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal,
                   name="tl", weight_bits=bits)
    twin = load(tmp_path / "o")
    r = np.random.default_rng(2)
    raw = np.concatenate([twin.encode(rows(6, 200, seed=3)),
                          r.integers(-2**31, 2**31, (100, 6)).astype(np.int32)])
    g = res.program.quant.int_graph
    ref = np.stack([np.concatenate([o.reshape(-1) for o in interpret(g, row[None])])
                    for row in raw])
    assert np.array_equal(twin.run_raw(raw), ref.astype(np.int32))
    dense = [k for k in res.program.kernels if k.kind == "qdense"]
    paired = [k for k in dense if k.params["tiles"]["pairs"]]
    # pairs exactly where the proof puts every sum in int32 (with two
    # outputs and two inputs at least: the weights are in input pairs)
    assert paired == [k for k in dense if k.params["n"] >= 2 and k.params["k"] >= 2
                      and k.params["acc"] == "i32"]
    assert paired or bits == "16"


# weight arrays: tiles, tails, and an odd input count's last input (in pairs)
WEIGHTS = ("_w", "_w_tail", "_w_last", "_w_tail_last")


@pytest.mark.parametrize("bits", ["8", "16"])
def test_fixed_weights_are_stored_at_their_width(bits, tmp_path):
    """Every weight array holds one int8 or int16 per weight, in the
    layer's width; KML_<NAME>_WEIGHT_BYTES is what the twin's object file
    holds in static constants (nm -S, an independent count)."""
    import subprocess

    m = mlp_model([11, 128, 16, 1], act="Relu", seed=4)
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed",
                   calibration=rows(11, 2000, seed=1), name="wd", weight_bits=bits)
    dt = np.int8 if bits == "8" else np.int16
    w = [b for b in res.program.buffers("const") if b.name.endswith(WEIGHTS)]
    assert sum(b.data.size for b in w) == 11 * 128 + 128 * 16 + 16
    # int8 full tiles of offset pairs are stored as u8 w + 128 (kml_fixed.h)
    assert all(b.data.dtype in ((dt, np.uint8) if bits == "8" else (dt,)) for b in w)
    header = (tmp_path / "o" / "user" / "wd.h").read_text()
    declared = int(header.split("KML_WD_WEIGHT_BYTES ")[1].split()[0])
    obj = tmp_path / "o.o"
    subprocess.run(["gcc", "-c", "-O0", f"-I{tmp_path / 'o' / 'user'}", "-o", obj,
                    tmp_path / "o" / "user" / "wd_fx.c"], check=True)
    syms = subprocess.run(["nm", "-S", obj], capture_output=True, text=True, check=True).stdout
    sizes = {ln.split()[3]: int(ln.split()[1], 16) for ln in syms.splitlines()
             if len(ln.split()) == 4 and ln.split()[2] in "rR"}
    # the weight set is one struct: its size is the declared bytes, and
    # its members the weights at their width plus the other constants
    assert sizes["kml_wd_fx_builtin"] == declared, (sizes, declared)
    others = sum(b.nbytes for b in res.program.buffers("const") if not b.name.endswith(WEIGHTS))
    assert 0 <= declared - others - (11 * 128 + 128 * 16 + 16) * dt().itemsize < 8


def test_fixed_point_memory_targets(tmp_path):
    """The fixed-point issue's memory targets, as kmlc.json reports them
    (the sizes test_fixed_weights_are_stored_at_their_width checks with
    nm): the Heimdall shape's weights plus workspace within 5,000 B with
    the weights auto picks on the seed-21 rows and on the benchmark's own
    calibration rows (seed 31, where int8 in the first layer holds the
    decisions only with bias correction), and the benchmark's LinnOS
    shape's fixed weights at most 55% of its float weights, calibrated on
    its digit rows (benchmarks/bench_models.py)."""
    import json
    import sys

    from conftest import EXAMPLES, ROOT, seed_models

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_models

    for cal in (seed_models.sample_inputs("heimdall", 2000, seed=21),
                bench_models.spec("heimdall").rows(2000, seed=31)):
        res = kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "h", targets="user",
                       numerics="fixed", calibration=cal)
        meta = json.loads((tmp_path / "h" / "kmlc.json").read_text())
        assert set(res.program.quant.weight_bits.values()) == {8}
        assert meta["weight_bytes"] + meta["workspace_bytes"] <= 5000, meta
    lin = bench_models.spec("linnos")
    size = {}
    for numerics in ("float", "fixed"):
        kcompile(lin.onnx_model(), tmp_path / numerics, targets="user", numerics=numerics,
                 name="lin", calibration=lin.rows(2000, seed=5) if numerics == "fixed" else None)
        size[numerics] = json.loads((tmp_path / numerics / "kmlc.json").read_text())["weight_bytes"]
    assert size["fixed"] <= 0.55 * size["float"], size


def two_layers(name, arrays, n_in, outputs, act1=False):
    """x -> Gemm fc0 -> Relu (a) -> Gemm fc1 (y) [-> Relu (z)], weights and
    biases w0, b0, w1, b1 from ``arrays``; ``outputs``: (name, width)."""
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0", transB=1),
             helper.make_node("Relu", ["h"], ["a"], name="act0"),
             helper.make_node("Gemm", ["a", "w1", "b1"], ["y"], name="fc1", transB=1)]
    if act1:
        nodes.append(helper.make_node("Relu", ["y"], ["z"], name="act1"))
    return make_model(nodes, [("x", ["N", n_in])], [(o, ["N", w]) for o, w in outputs],
                      {k: np.asarray(v, np.float32) for k, v in arrays.items()}, name=name)


def every_path_is_the_integer_evaluator(twin, program, raw):
    """Each of the twin's paths on encoded rows ``raw`` gives the integer
    evaluator's outputs (all of them, in order)."""
    ref = np.stack([np.concatenate([np.asarray(o).reshape(-1) for o in
                                    interpret(program.quant.int_graph, row[None])])
                    for row in raw])
    for path in twin.paths:
        twin.set_path(path)
        got = twin.run_raw(raw)
        assert np.array_equal(got, ref.astype(got.dtype)), path


def lane_bound_model(k, r):
    """4 inputs -> K ReLU units, each the inputs' sum -> 8 outputs, whose
    channels 0 and 1 are all int8 127 and all -127."""
    w1 = r.normal(size=(8, k))
    w1[0], w1[1] = 1.0, -1.0                              # int8 codes all 127, all -127
    return two_layers("off", {"w0": np.ones((k, 4)),       # every hidden unit: sum of x
                              "b0": np.zeros(k), "w1": w1, "b1": np.zeros(8)}, 4, [("y", 8)])


@pytest.mark.parametrize("k,offset", [(256, True), (258, False)])
def test_offset_pairs_at_their_lane_bound(k, offset, tmp_path):
    """Offset pairs (kml_fixed.h, kml_w8_lane) sum x * (w + 128) in 32-bit
    lanes, which holds for any int8 weights only while 255 * K * max|x| <
    2^31: with int16 inputs, K = 256 inputs at most.  A layer of K inputs
    whose codes all reach -32768 (every ReLU before it off) or 32767 (all
    on), with a channel of weights all 127 (w + 128 = 255: the lane's
    extreme), one all -127 and mixed ones, against the integer evaluator;
    K = 258 must take the other path, and still be right.  Every path of
    the twin runs (the scalar one is where offset pairs are)."""
    r = np.random.default_rng(k)
    m = lane_bound_model(k, r)
    cal = r.normal(size=(500, 4)).astype(np.float32)
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal,
                   name="off", weight_bits="8")
    (k2,) = [q for q in res.program.kernels if q.kind == "qdense" and q.params["k"] == k]
    assert k2.params["tiles"]["offset"] is offset and k2.params["x_max"] == 32768
    assert "kml_w8_lane" in (tmp_path / "o" / "user" / "off_fx.c").read_text()  # layer 1's tiles
    twin = load(tmp_path / "o")
    x = np.concatenate([np.full((1, 4), -1e4), np.full((1, 4), 1e4), cal[:50] * 100, cal[:50]])
    # every path; the scalar one is the one under test
    every_path_is_the_integer_evaluator(twin, res.program, twin.encode(x.astype(np.float32)))
    assert twin.paths[0] == "scalar"


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_offset_pairs_loads_stay_inside_the_weight_set(cc, tmp_path, monkeypatch):
    """kml_w8_lane's 8-byte loads run up to 3 bytes past an offset-pairs
    tile array (bytes the mask drops).  Here the last layer's tiles end
    the weight set, so a 3-byte pad must follow them: ASan, whose redzone
    starts right after the compiled set (a global), watches every load on
    every path.  Without the pad the model must not build: its
    static_assert holds every such array 3 bytes inside sizeof the set,
    which is what the module allocates for a hot-swapped set."""
    import subprocess

    import kernel_c
    from kmlc.errors import KmlcError

    r = np.random.default_rng(3)
    m = lane_bound_model(256, r)
    cal = r.normal(size=(500, 4)).astype(np.float32)
    args = dict(targets="user", numerics="fixed", calibration=cal, name="ovr", weight_bits="8")
    res = kcompile(m, tmp_path / "o", **args)
    ws = res.program.weight_set()
    (k2,) = [q for q in res.program.kernels if q.kind == "qdense" and q.params["k"] == 256]
    assert k2.params["tiles"]["offset"] and ws[-2] is k2.operands["w"]
    assert ws[-1] is k2.operands["w_pad"] and ws[-1].numel == 3
    d, twin = tmp_path / "o", load(tmp_path / "o")
    (tmp_path / "drv.c").write_text(kernel_c.infer_driver("ovr", path_arg=True))
    exe = tmp_path / "drv"
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-fno-omit-frame-pointer", f"-I{d / 'user'}", "-o", exe, tmp_path / "drv.c",
                    d / "user" / "ovr.c", d / "user" / "ovr_fx.c"], check=True)
    x = twin.encode(np.concatenate([r.normal(size=(200, 4)) * s for s in (1, 100, 1e5)])
                    .astype(np.float32))
    x.tofile(tmp_path / "in.bin")
    base = twin.run_raw(x)
    for i, p in enumerate(twin.paths):
        run = subprocess.run([exe, tmp_path / "in.bin", tmp_path / "out.bin", str(i)],
                             capture_output=True, text=True)
        assert run.returncode == 0 and "ERROR" not in run.stderr, run.stderr[-2000:]
        assert np.array_equal(np.fromfile(tmp_path / "out.bin", np.int32).reshape(base.shape),
                              base), p
    monkeypatch.setattr(lowering._Lowering, "overread_pad", lambda self, prog: None)
    with pytest.raises(KmlcError, match="kml_w8_lane loads stay inside the set"):
        kcompile(m, tmp_path / "nopad", **args)


def test_offset_pairs_with_int64_sums_on_every_path(tmp_path):
    """An int8 layer whose bias puts its sums in int64 (a bias of 10^4
    against weights of 0.01) while 255 * K * max|x| < 2^31 still holds:
    offset pairs, with the SIMD paths' sums starting at -128 * sum(x) in
    64-bit lanes.  Every path against the integer evaluator."""
    r = np.random.default_rng(0)
    m = two_layers("wo", {"w0": r.normal(size=(16, 4)), "b0": np.zeros(16),
                          "w1": r.normal(size=(16, 16)) * 0.01, "b1": r.normal(size=16) * 1e4},
                   4, [("z", 16)], act1=True)
    cal = r.normal(size=(500, 4)).astype(np.float32)
    res = kcompile(m, tmp_path, targets="user", numerics="fixed", calibration=cal, name="wo",
                   weight_bits="8")
    (k2,) = [k for k in res.program.kernels if k.fn.startswith("k2_")]
    assert k2.params["acc"] == "i64" and k2.params["tiles"]["offset"] and k2.params["tiles"]["simd"]
    twin = load(tmp_path)
    assert len(twin.paths) > 1
    every_path_is_the_integer_evaluator(
        twin, res.program, twin.encode(np.concatenate([cal, cal * 100]).astype(np.float32)))


def test_narrow_layer_over_an_activation_that_is_also_an_output(tmp_path):
    """A hidden ReLU's int16 codes that are also a graph output live in
    out[] as s32 (lower.carrier); a layer narrower than a tile that reads
    them must not take the SIMD paths' int16 pair loads (kml_xpairs*,
    which read s16): the fuzzer's seed 20261208, cases 105 and 111, built
    such a model and its twin warned of an incompatible pointer.  It
    compiles without a warning and every path is the integer evaluator."""
    r = np.random.default_rng(7)
    m = two_layers("nar", {"w0": r.normal(size=(16, 6)), "b0": r.normal(size=16) * 0.1,
                           "w1": r.normal(size=(3, 16)), "b1": r.normal(size=3) * 0.1},
                   6, [("a", 16), ("y", 3)])
    cal = r.normal(size=(500, 6)).astype(np.float32)
    res = kcompile(m, tmp_path, targets="user", numerics="fixed", calibration=cal, name="nar",
                   weight_bits="8")
    (k2,) = [k for k in res.program.kernels if k.fn.startswith("k2_")]
    assert k2.operands["x"].dtype.name == "i32" and not k2.params["tiles"]["narrow"]
    twin = load(tmp_path)
    every_path_is_the_integer_evaluator(
        twin, res.program, twin.encode(np.concatenate([cal, cal * 50]).astype(np.float32)))
