"""Fixed point end to end on the three seed shapes and on OFFSET, a model
whose first layer has an exact wide path (a feature calibrated far from
zero on a narrow range: every int32 input reaches beyond the int32 sums):
accuracy against the float model, bit-exactness against kmlc's integer
evaluator and across compilers, sanitizers over 100,000 hostile inputs, an
FPU-free module, and KUnit on UML and on a real x86_64 kernel (the debug
kernel: lockdep, KASAN, UBSAN), whose golden vectors take both
paths."""
import json
import re
import subprocess

import numpy as np
import pytest

import kernel_c
from conftest import EXAMPLES, SEED_MODELS, fixed_math, make_model, seed_models
from kmlc.api import compile as kcompile, load
from kmlc.ops import interpret
from kmlc.targets import kernel, kunit, user
from kmlc.verify import verify_fixed

GOLDEN = 64
HOSTILE = 100_000


# Heimdall with int16 first-layer weights, as `--weight-bits auto` picks on
# some calibrations: int64 sums on the SIMD paths (and AVX2's int64 epilogue)
WIDE = "heimdall_w16"
# products and tables of activations (conftest.fixed_math): every input
# code through kml_tab and kml_qmul under the sanitizers and in the kernels
MATH = "math"
# layers narrower than a tile on the SIMD paths (passes/lower.py,
# narrow_plan): 5 outputs after a tile and 2 outputs alone, both of an odd
# K; and an int16 layer whose 5 outputs after its tiles sum in int64
NARROW = "narrow"
NARROW_BITS = "8,16,8,8"
MODELS = list(SEED_MODELS) + ["offset", WIDE, MATH, NARROW]


def seed_of(name):
    return "heimdall" if name == WIDE else name


def offset_model():
    """2 -> 8 ReLU -> 3: feature 0 lives in [1000, 1001], feature 1 in [-5, 5]."""
    from onnx import helper

    r = np.random.default_rng(8)
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0", transB=1),
             helper.make_node("Relu", ["h"], ["a"], name="relu0"),
             helper.make_node("Gemm", ["a", "w1", "b1"], ["y"], name="fc1", transB=1)]
    inits = {"w0": r.normal(size=(8, 2)).astype(np.float32),
             "b0": np.float32(-1000 * r.normal(size=8)),
             "w1": r.normal(size=(3, 8)).astype(np.float32), "b1": np.zeros(3, np.float32)}
    return make_model(nodes, [("x", [1, 2])], [("y", [1, 3])], inits)


def narrow_model():
    """12 -> 24 ReLU -> 21 ReLU -> 13 ReLU -> 2."""
    from onnx import helper

    r = np.random.default_rng(9)
    nodes, inits, x = [], {}, "x"
    for i, (a, b) in enumerate([(12, 24), (24, 21), (21, 13), (13, 2)]):
        inits[f"w{i}"] = (r.normal(size=(b, a)) / np.sqrt(a)).astype(np.float32)
        inits[f"b{i}"] = (r.normal(size=b) * 0.3).astype(np.float32)
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"h{i}"], name=f"fc{i}",
                                      transB=1))
        x = f"h{i}"
        if i < 3:
            nodes.append(helper.make_node("Relu", [x], [f"a{i}"], name=f"relu{i}"))
            x = f"a{i}"
    return make_model(nodes, [("x", [1, 12])], [(x, [1, 2])], inits)


def offset_rows(n, seed, far=False):
    r = np.random.default_rng(seed)
    x = np.stack([1000 + r.random(n), r.uniform(-5, 5, n)], axis=1)
    if far:     # up to 50 widths beyond the calibrated range, half the rows
        x[::2, 0] += r.uniform(-50, 50, (n + 1) // 2)
    return x.astype(np.float32)


def calibration(name):
    if name == "offset":
        return offset_rows(2000, 21)
    if name == MATH:
        return np.random.default_rng(21).normal(size=(500, 4)).astype(np.float32)
    if name == NARROW:
        return np.random.default_rng(21).normal(size=(2000, 12)).astype(np.float32)
    return seed_models.sample_inputs(seed_of(name), 2000, seed=21)


def held_out(name, n=5000):
    if name == "offset":
        return offset_rows(n, 22, far=True)
    if name == MATH:
        return np.random.default_rng(22).normal(size=(n, 4)).astype(np.float32)
    if name == NARROW:    # a third of the rows 3-30x beyond calibration: saturations
        x = np.random.default_rng(22).normal(size=(n, 12)).astype(np.float32)
        x[::3] *= 3 + 27 * np.random.default_rng(23).random((len(x[::3]), 1), np.float32)
        return x
    return seed_models.sample_inputs(seed_of(name), n, seed=22)


@pytest.fixture(scope="session")
def fixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixed")
    out = {}
    for name in MODELS:
        model, golden = (offset_model(), offset_rows(GOLDEN, 23, far=True)) if name == "offset" \
            else (fixed_math(), held_out(MATH, GOLDEN) * 3) if name == MATH \
            else (narrow_model(), held_out(NARROW, GOLDEN)) if name == NARROW \
            else (EXAMPLES / f"{seed_of(name)}.onnx",
                  seed_models.sample_inputs(seed_of(name), GOLDEN, seed=23))
        res = kcompile(model, root / name, name=f"{name}_fx", numerics="fixed",
                       calibration=calibration(name), golden_data=golden, golden_count=GOLDEN,
                       weight_bits="16,8,8" if name == WIDE else NARROW_BITS if name == NARROW
                       else "auto")
        out[name] = (root / name, res.program)
    return out


def test_narrow_model_has_narrow_steps(fixed):
    """NARROW reaches what it is for: two layers narrower than a tile on the
    SIMD paths, one after a tile, both of an odd K, pairs left after the
    last whole step on a path; and int64 sums with outputs after the tiles."""
    _, prog = fixed[NARROW]
    ks = [k for k in prog.kernels if k.kind == "qdense"]
    assert [(k.params["acc"], k.params["tiles"]["count"], k.params["tiles"]["tail"],
             bool(k.params["tiles"]["narrow"]), k.params["k"]) for k in ks] == \
        [("i32", 3, 0, False, 12), ("i64", 2, 5, False, 24), ("i32", 1, 5, True, 21),
         ("i32", 0, 2, True, 13)]
    assert all(k.params["tiles"]["simd"] for k in ks)
    assert any((k.params["k"] // 2) % plan["pairs"] for k in ks
               for plan in k.params["tiles"]["narrow"].values())


def test_offset_model_takes_both_paths(fixed):
    """The first layer of OFFSET has the wide path, its golden vectors reach
    it (encoded inputs beyond int16) and the proven path too, and far rows
    decide (argmax) as onnxruntime does on at least 95% of rows."""
    from kmlc.verify import reference_outputs

    d, prog = fixed["offset"]
    first = next(k for k in prog.kernels if k.kind == "qdense")
    assert "wide_bound" in first.params and first.params["wide_bound"] > 2**31
    assert f"{first.fn}_wide(W, x, y);" in (d / "user" / "offset_fx_fx.c").read_text()
    g = prog.quant.int_graph
    twin = load(d)
    qin = g.ops[0]
    assert qin.kind == "qinput"
    enc = np.stack([interpret(type(g)("e", g.inputs, [qin.output], [qin]), row[None])[0]
                    .reshape(-1) for row in twin.encode(offset_rows(GOLDEN, 23, far=True))])
    wide = (np.abs(enc) > 32767).any(axis=1)
    assert 5 < wide.sum() < GOLDEN - 5, wide.sum()
    x = offset_rows(2000, 30, far=True)
    ref = reference_outputs(offset_model(), prog, x)
    agree = (np.argmax(twin.run(x), axis=1) == np.argmax(ref, axis=1)).mean()
    assert agree >= 0.95, agree


def hostile_rows(n_in, n=HOSTILE, seed=0):
    """int32 rows: extremes, zeros and random values of every magnitude."""
    r = np.random.default_rng(seed)
    x = r.integers(-2**31, 2**31, (n, n_in), dtype=np.int64)
    x = x >> r.integers(0, 32, (n, n_in))
    x[: n // 10] = r.choice([-2**31, 2**31 - 1, 0, -1, 1], (n // 10, n_in))
    return x.astype(np.int32)


@pytest.mark.parametrize("name", SEED_MODELS)
def test_agreement_with_float_model(name):
    rep = verify_fixed(EXAMPLES / f"{name}.onnx", calibration=calibration(name),
                       data=held_out(name))
    assert rep.ok, rep.text()
    for agree, rows, _ in rep.agreement.values():
        assert rows == 5000 and agree / rows >= 0.99, rep.text()


@pytest.mark.parametrize("name", MODELS)
def test_twin_equals_integer_evaluator(fixed, name):
    d, prog = fixed[name]
    twin = load(d)
    x = np.concatenate([twin.encode(held_out(name, 300)), hostile_rows(twin.in_elems, 300)])
    y = twin.run_raw(x)
    g = prog.quant.int_graph
    ref = np.stack([np.concatenate([np.asarray(o).reshape(-1) for o in interpret(g, row[None])])
                    for row in x])
    assert np.array_equal(y, ref.astype(np.int32))


@pytest.mark.parametrize("name", MODELS)
def test_twin_identical_across_compilers(fixed, name, tmp_path):
    d, _ = fixed[name]
    x = hostile_rows(load(d).in_elems, 3000, seed=1)
    base = load(d).run_raw(x)
    for cc, opt in (("gcc", "-O0"), ("clang", "-O0"), ("clang", "-O2"), ("gcc", "-O3")):
        # bits, not frames, are this test's concern: unoptimized, a large
        # model's forward keeps every workspace pointer on the stack, and
        # clang -O2 spills the saturation counts of the kernels it inlines;
        # the 512-byte bound holds for the twin's own build and the module's
        # (tests/kernel_c.py)
        extra = [opt, "-Wno-frame-larger-than"]
        so = user.build_twin(d / "user", f"{name}_fx", cc=cc, extra=extra,
                             out=tmp_path / f"{cc}{opt}.so")
        assert np.array_equal(user.Twin(d, so=so).run_raw(x), base), (cc, opt)


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("name", MODELS)
def test_no_undefined_behaviour_on_hostile_inputs(fixed, name, cc, tmp_path):
    d, _ = fixed[name]
    m = f"{name}_fx"
    (tmp_path / "drv.c").write_text(kernel_c.infer_driver(m))
    exe = tmp_path / "drv"
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-fno-omit-frame-pointer", f"-I{d / 'user'}", "-o", exe, tmp_path / "drv.c",
                    d / "user" / f"{m}.c", d / "user" / f"{m}_fx.c"], check=True)
    twin = load(d)
    x = hostile_rows(twin.in_elems, HOSTILE, seed=2)
    x.tofile(tmp_path / "in.bin")
    res = subprocess.run([exe, tmp_path / "in.bin", tmp_path / "out.bin"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "runtime error" not in res.stderr, res.stderr[-2000:]
    y = np.fromfile(tmp_path / "out.bin", dtype=np.int32).reshape(HOSTILE, -1)
    assert np.array_equal(y, twin.run_raw(x))


FP_INSN = re.compile(r"\b[xyz]mm\d+\b|\bf(?:ld|st|add|sub|mul|div)\w*\b|\bcvt\w+|"
                     r"\b(?:ld|st)mxcsr\b|\bx?save\b|\bmovs[sd]\b")


SIMD_FN = re.compile(r"_(sse2|avx2)$")


@pytest.mark.kernel
@pytest.mark.parametrize("name", MODELS)
def test_module_has_no_floating_point(fixed, name):
    """Every object is built with the kernel's integer flags; vector
    registers appear only in the SIMD paths' functions (kml_simd.h, target
    attributes), which only kml_<name>_infer_set enters, inside
    kernel_fpu_begin/end; everything else has no FP or vector instruction."""
    d, _ = fixed[name]
    ko = kernel.build_module(d / "kernel")
    assert "CFLAGS_" not in (d / "kernel" / "Kbuild").read_text()
    core = f"{name}_fx_fx"  # the model is named <name>_fx; its integer math is <model>_fx.c
    cmd = (d / "kernel" / f".{core}.o.cmd").read_text()
    assert "-mno-sse" in cmd and "-msse " not in cmd and "-mhard-float" not in cmd
    asm = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", ko], capture_output=True,
                         text=True, check=True).stdout
    funcs = dict(re.findall(r"^[0-9a-f]+ <([^>]+)>:\n(.*?)(?=^[0-9a-f]+ <|\Z)", asm, re.M | re.S))
    has_simd = bool(json.loads((d / "kmlc.json").read_text())["simd_macs"])
    assert f"kml_{core}_forward" in funcs
    assert has_simd == (f"kml_{core}_forward_avx2" in funcs)
    simd = [f for f in funcs if SIMD_FN.search(f.split(".")[0])]
    assert any(FP_INSN.search(funcs[f]) for f in simd) == has_simd
    for f, body in funcs.items():
        if f not in simd:
            assert not FP_INSN.findall(body), (f, FP_INSN.findall(body)[:5])
        calls = set(re.findall(r"R_X86_64_PLT32\s+(\w+)", body))
        if calls & {"kernel_fpu_begin_mask"} or calls & {f"kml_{core}_forward_{i}"
                                                         for i in ("sse2", "avx2")}:
            assert f == f"kml_{name}_fx_infer_set", f
    infer = funcs[f"kml_{name}_fx_infer_set"]   # kml_<name>_infer on the built-in set
    assert ("irq_fpu_usable" in infer and "kernel_fpu_end" in infer) == has_simd
    if not has_simd:
        assert not {"kernel_fpu_begin_mask", "kernel_fpu_end"} & set(kernel.undefined_symbols(ko))


def test_kernel_c_standards(fixed, tmp_path):
    for name, (d, _) in fixed.items():
        kernel_c.check_no_libm_allocation_or_mutable_globals(d, f"{name}_fx")
        kernel_c.check_stack_and_no_recursion(d, f"{name}_fx", tmp_path)


@pytest.mark.kernel
def test_checkpatch_clean(fixed):
    for d, _ in fixed.values():
        kernel_c.check_checkpatch_clean(d / "kernel")
        kernel_c.check_checkpatch_clean(d / "kunit")


@pytest.mark.kunit
def test_kunit_uml(fixed):
    res = kunit.run([d for d, _ in fixed.values()], arch="um")
    assert res["ok"], res["summary"]
    for name in MODELS:
        # the golden vectors, bad arguments, every path (SIMD models), and the
        # weight-set cases: the packed set, truncations, corruptions, each forgery
        d = fixed[name][0]
        meta = json.loads((d / "kmlc.json").read_text())
        assert res["suites"][f"kml_{name}_fx"]["passed"] == kunit.cases(d) \
            == GOLDEN + 1 + bool(meta["simd_macs"]) + 3 + meta["set_forgeries"]


@pytest.mark.kunit
def test_kunit_x86_64_fixed_and_float(fixed, tmp_path):
    """A real x86_64 kernel under qemu, the debug kernel (the suites are its
    modules): the fixed models, and a float model whose
    FPU section is the real kernel_fpu_begin/end there.  In the same boot a
    suite whose golden side has one bit flipped fails exactly its two cases
    that see it (the harness can fail), and fails the run."""
    import shutil

    fp = tmp_path / "readahead_fp"
    kcompile(EXAMPLES / "readahead.onnx", fp, name="readahead_fp", targets="kunit",
             golden_data=seed_models.sample_inputs("readahead", GOLDEN, seed=24))
    flip = tmp_path / "flip"
    kcompile(EXAMPLES / "readahead.onnx", flip, name="flip", targets="kunit",
             golden_data=seed_models.sample_inputs("readahead", GOLDEN, seed=25))
    src = flip / "kunit" / "flip_kunit.c"
    text = src.read_text()
    m = re.search(r"\.out = \{\s*0x([0-9a-f]{8})", text)
    src.write_text(text[:m.start(1)] + f"{int(m.group(1), 16) ^ 1:08x}" + text[m.end(1):])
    res = kunit.run([d for d, _ in fixed.values()] + [fp, flip], arch="x86_64")
    assert not res["ok"] and res["summary"].startswith("FAIL"), res["summary"]
    assert res["suites"]["kml_flip"] == {"passed": kunit.cases(flip) - 2, "failed": 2,
                                         "skipped": 0}, res["summary"]
    for n in MODELS:      # the golden vectors, bad arguments, every path, weight sets
        assert res["suites"][f"kml_{n}_fx"] == {"passed": kunit.cases(fixed[n][0]),
                                                "failed": 0, "skipped": 0}, res["summary"]
    assert res["suites"]["kml_readahead_fp"] == {"passed": kunit.cases(fp), "failed": 0,
                                                 "skipped": 0}, res["summary"]
    assert "report(s) in the kernel log" not in res["summary"], res["summary"]


@pytest.mark.kernel
@pytest.mark.kunit
def test_modules_build_with_llvm(tmp_path):
    """LLVM=1: every module kind builds with clang, W=1 and zero warnings
    (kmlc's 512-byte frame budget included), against the clang-configured
    tree of Debian's kernel configuration (``kernel.clang_tree``: Debian's
    headers are configured for gcc)."""
    import shutil

    from conftest import readahead_policy
    from kmlc.targets.buildcache import sources

    kdir = kernel.llvm_kdir()
    config = kernel.kernel_config(kdir)
    assert config["CONFIG_CC_IS_CLANG"] == "y" and "CONFIG_KASAN" not in config
    ra, ra_cal = readahead_policy()
    builds = {
        "fp": (EXAMPLES / "heimdall.onnx", {}),
        "fx": (EXAMPLES / "nfs_rsize.onnx", {"numerics": "fixed",
                                             "calibration": calibration("nfs_rsize")}),
        "wide": (EXAMPLES / "heimdall.onnx", {"numerics": "fixed", "weight_bits": "16,8,8",
                                              "calibration": calibration("heimdall")}),
        "admit": (EXAMPLES / "heimdall.onnx", {"numerics": "fixed", "hooks": ["admission"],
                                               "calibration": calibration("heimdall")}),
        "rafx": (ra, {"numerics": "fixed", "calibration": ra_cal, "hooks": ["readahead"]}),
        "rafp": (ra, {"hooks": ["readahead"]}),
        "nfs": (EXAMPLES / "nfs_rsize.onnx", {"hooks": ["nfs-rsize"]}),
    }
    for tag, (model, opts) in builds.items():
        kcompile(model, tmp_path / tag, name=f"llvm_{tag}", targets="kernel", **opts)
        ko = kernel.build_module(tmp_path / tag / "kernel", llvm=True)  # raises on a warning
        comment = subprocess.run(["readelf", "-p", ".comment", ko], capture_output=True,
                                 text=True).stdout
        assert "clang" in comment and "GCC" not in comment, (tag, comment)
    # the frame budget reached clang's command line (V=1 shows it)
    fx = tmp_path / "fx" / "plain"
    fx.mkdir()
    for f in sources(tmp_path / "fx" / "kernel"):
        shutil.copy(f, fx)
    res = subprocess.run(kernel.make_command(kdir, fx, llvm=True) + ["V=1", "modules"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "-Wframe-larger-than=512" in res.stdout, res.stdout[-2000:]
