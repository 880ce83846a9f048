"""arm64: modules cross-built against Debian's arm64 headers, KUnit in an
arm64 kernel and Debian's arm64 kernel booted under qemu-system-aarch64
with the modules and hooks, and the twin built for aarch64 and run under
qemu-user.

The modules: every bundled model in both numerics, float models with
functions and normalizations, fixed-point arithmetic and a tree ensemble,
built with aarch64-linux-gnu-gcc and W=1 (a warning fails the build): the
.ko is an AArch64 ELF whose vermagic is Debian's arm64 kernel's, the float
model's FPU section is kernel_neon_begin/end with FPCR pinned, and its float
object has no fused multiply-add (the determinism rules, docs/numerics.md).

KUnit: every model's golden-vector suite in a cross-built arm64 KUnit
kernel under qemu-system-aarch64 (TCG, cortex-a57: float suites inside the
real kernel_neon_begin/end).  qemu-test: Debian's own arm64 6.1 kernel
boots with the bundled models in both numerics (each self-test bit-identical
to the twin on its golden vectors) and with the readahead and NFS hooks
(both numerics) and the admission hook, whose scenarios pass and whose
traces replay through the x86-64 twin bit for bit (the readahead hook's
probes are an ftrace_ops of its own there: arm64 has no kprobes through
ftrace in 6.1), with 100 weight swaps under load on a
weakly ordered CPU (RCU publishing of the new set).

The twin: the same C built for aarch64 gives the x86-64 twin's outputs bit
for bit, on every golden vector (those KUnit and the self-test check, run by
`kmlc run --goldens --arch arm64`) and on hostile rows (zeros of both signs,
denormals, infinities, NaN, 1e30).  The oracle is the x86-64 twin, itself
checked against onnxruntime elsewhere; what is tested here is that
nothing in the generated C depends on the architecture.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, SEED_MODELS, kmlc_cli, nfs_policy, readahead_policy, \
    seed_models, tree_admission_policy
from kmlc.api import compile as kcompile, load, pack
from kmlc.targets import kernel, kernels, kunit, qemu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
import test_tensor_ops as tops  # noqa: E402

EM_AARCH64 = 183


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("arm64")
    out = {}
    for name in SEED_MODELS:
        cal = seed_models.sample_inputs(name, 1000, seed=41)
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fp", name=f"{name}_fp")
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fx", name=f"{name}_fx",
                 numerics="fixed", calibration=cal)
        out[f"{name}_fp"], out[f"{name}_fx"] = root / f"{name}_fp", root / f"{name}_fx"
    for name in ("features", "norms", "reductions", "movement", "embedding"):
        kcompile(tops.MODELS[name](), root / name, name=f"t_{name}")
        out[name] = root / name
    kcompile(tops.fixed_arithmetic(), root / "arith", name="t_arith", numerics="fixed",
             calibration=np.random.default_rng(7).normal(size=(2000, 4)).astype(np.float32))
    kcompile(tops.fixed_pipeline(), root / "pipeline", name="t_pipeline", numerics="fixed",
             calibration=tops.fixed_pipeline_rows(2000))
    m, cal = tree_admission_policy()
    kcompile(m, root / "tree_fx", name="tree_fx", numerics="fixed", calibration=cal)
    kcompile(m, root / "tree_fp", name="tree_fp")
    out.update(arith=root / "arith", pipeline=root / "pipeline", tree_fx=root / "tree_fx",
               tree_fp=root / "tree_fp")
    return out


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    """The hooks arm64 runs: readahead and NFS in both numerics, admission
    (fixed point: a tree ensemble); three packed weight sets for the fixed
    NFS model."""
    import onnx
    from onnx import numpy_helper

    root = tmp_path_factory.mktemp("arm64-hooks")
    m, cal = nfs_policy()
    kcompile(m, root / "nfs_fx", name="nfs_fx", numerics="fixed", calibration=cal,
             hooks=["nfs-rsize"], guards=["envelope"])
    kcompile(m, root / "nfs_fp", name="nfs_fp", hooks=["nfs-rsize"])
    sets = []
    for v in (1, 2, 3):
        mv = onnx.ModelProto()
        mv.CopyFrom(m)
        for t in mv.graph.initializer:
            t.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(t) * np.float32(1 - 0.05 * v), t.name))
        sets.append(root / f"nfs-v{v}.kmlw")
        pack(mv, root / "nfs_fx", sets[-1], calibration=cal, version=v)
    t, tcal = tree_admission_policy()
    kcompile(t, root / "adm_fx", name="adm_fx", numerics="fixed", calibration=tcal,
             hooks=["admission"], guards=["benefit"])
    m, cal = readahead_policy()
    kcompile(m, root / "ra_fx", name="ra_fx", numerics="fixed", calibration=cal,
             hooks=["readahead"], guards=["benefit=4"])
    kcompile(m, root / "ra_fp", name="ra_fp", hooks=["readahead"])
    return {"nfs_fx": root / "nfs_fx", "nfs_fp": root / "nfs_fp", "adm_fx": root / "adm_fx",
            "ra_fx": root / "ra_fx", "ra_fp": root / "ra_fp", "sets": sets}


BUILT = ("readahead_fp", "readahead_fx", "nfs_rsize_fp", "nfs_rsize_fx", "heimdall_fp",
         "heimdall_fx", "norms", "arith", "tree_fx")


@pytest.mark.kernel
def test_modules_cross_build_for_arm64_with_no_warnings(models):
    release = kernel.arm64_kdir().name.removeprefix("linux-headers-")
    assert release.endswith("-arm64")
    for name in BUILT:
        ko = kernel.build_module(models[name] / "kernel", arch="arm64")   # W=1: raises on a warning
        data = ko.read_bytes()
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == EM_AARCH64
        assert f"\0vermagic={release} SMP".encode() in data, name
    # a float model: FPU section, FPCR pinned, no contraction into fused multiply-adds
    kdir = models["readahead_fp"] / "kernel"
    kernel.build_module(kdir, arch="arm64")
    dis = {o: subprocess.run(["aarch64-linux-gnu-objdump", "-d", kdir / o], capture_output=True,
                             text=True, check=True).stdout
           for o in ("readahead_fp.o", "readahead_fp_fp.o")}
    entry, math = dis["readahead_fp.o"], dis["readahead_fp_fp.o"]
    assert "kernel_neon_begin" in entry and "kernel_neon_end" in entry
    assert "msr\tfpcr, xzr" in entry and "mrs\t" in entry
    assert "fmul" in math and "fadd" in math
    for fused in ("fmadd", "fmsub", "fnmadd", "fnmsub", "fmla", "fmls"):
        assert fused not in math, fused


@pytest.mark.kunit
def test_kunit_on_arm64(models, hooked):
    """Every suite passes in the arm64 KUnit kernel, each case counted
    (a suite that ran fewer cases than it has fails); hook models' suites
    too (the readahead one's: KUnit tests the model, not the probes)."""
    dirs = list(models.values()) + [hooked[k] for k in ("nfs_fx", "nfs_fp", "adm_fx", "ra_fx",
                                                        "ra_fp")]
    res = kunit.run(dirs, arch="arm64")
    assert res["ok"], res["summary"]
    for d in dirs:
        suite = json.loads((d / "kmlc.json").read_text())["module"]
        got = res["suites"][suite]
        assert got["passed"] == kunit.cases(d) and not got["failed"] and not got["skipped"], \
            (suite, got)


@pytest.mark.kernel
def test_modules_build_with_llvm_for_arm64(models, tmp_path):
    """--arch arm64 --llvm: modules of both numerics and of every hook build
    with clang, W=1 and zero warnings, against Debian's arm64 kernel
    configuration prepared for clang (``kernel.clang_tree``); each is an
    AArch64 module of that tree, compiled by clang."""
    kdir = kernel.llvm_kdir(arch="arm64")
    config = kernel.kernel_config(kdir)
    assert config["CONFIG_CC_IS_CLANG"] == "y" and config["CONFIG_ARM64"] == "y"
    release = kernels.release_of(kdir)
    nfs, nfs_cal = nfs_policy()
    adm, adm_cal = tree_admission_policy()
    hd_cal = seed_models.sample_inputs("heimdall", 1000, seed=41)
    builds = {"ll_fp": (EXAMPLES / "readahead.onnx", {}),
              "ll_fx": (EXAMPLES / "heimdall.onnx", {"numerics": "fixed",
                                                      "calibration": hd_cal}),
              "ll_nfs_fx": (nfs, {"numerics": "fixed", "calibration": nfs_cal,
                                  "hooks": ["nfs-rsize"]}),
              "ll_nfs_fp": (nfs, {"hooks": ["nfs-rsize"]}),
              "ll_adm": (adm, {"numerics": "fixed", "calibration": adm_cal,
                               "hooks": ["admission"]}),
              "ll_ra": (EXAMPLES / "readahead.onnx", {"hooks": ["readahead"]})}
    for name, (model, kw) in builds.items():
        d = tmp_path / name
        kcompile(model, d, name=name, targets="kernel", **kw)
        res = kmlc_cli("build", d, "--arch", "arm64", "--llvm")
        assert res.returncode == 0, (d.name, res.stderr)
        assert "(arm64, W=1, LLVM=1, 0 warnings)" in res.stdout, res.stdout
        ko = next((d / "kernel").glob("*.ko"))
        data = ko.read_bytes()
        assert int.from_bytes(data[18:20], "little") == EM_AARCH64
        assert f"\0vermagic={release} SMP".encode() in data, d.name
        comment = subprocess.run(["llvm-readelf", "-p", ".comment", ko], capture_output=True,
                                 text=True, check=True).stdout
        assert "clang version" in comment and "GCC:" not in comment, comment


@pytest.mark.kernel
def test_qemu_test_on_arm64(models, hooked):
    """Debian's arm64 6.1 kernel under qemu-system-aarch64: the bundled
    models' self-tests (both numerics), the readahead and NFS hooks'
    scenarios in both numerics and the admission mirror's (data checksummed, ext4 with the
    primary failed, failover), their traces replayed through the twin bit
    for bit, and swaps of the fixed NFS model's weights under load; the
    loops as long as --cycles and --swaps say."""
    dirs = [models[f"{n}_{x}"] for n in SEED_MODELS for x in ("fp", "fx")]
    dirs += [hooked[k] for k in ("nfs_fx", "nfs_fp", "adm_fx", "ra_fx", "ra_fp")]
    res = kmlc_cli("qemu-test", "--arch", "arm64", "--cycles", "4", "--swaps", "24", *dirs,
                   *[a for w in hooked["sets"] for a in ("--weights", w)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    lines = dict(ln.removeprefix("kmlc qemu-test: ").split(": ", 1)
                 for ln in res.stdout.splitlines() if ln.startswith("kmlc qemu-test: "))
    for d in dirs:
        mod = json.loads((d / "kmlc.json").read_text())["module"]
        assert lines[mod].startswith("PASS") and "8/8 golden vectors bit-identical" \
            in lines[mod], (mod, lines.get(mod))
    for mod, steps in (("kml_nfs_fx", ("events", "restore", "reload-cycles", "replay-reads",
                                       "guard-reads", "swap")),
                       ("kml_nfs_fp", ("events", "restore", "replay-reads")),
                       ("kml_adm_fx", ("mirror", "ext4", "failover", "replay-mirror",
                                       "guard-mirror")),
                       ("kml_ra_fx", ("events", "table", "restore", "fadvise", "reload-cycles",
                                      "replay-reads", "replay-multi", "guard-reads", "files")),
                       ("kml_ra_fp", ("events", "restore", "replay-reads", "files"))):
        for step in steps:
            assert lines[f"{mod}-{step}"].startswith("PASS"), (mod, step, lines)
    assert lines["kml_nfs_fx-swap"].startswith("PASS 24 swaps over 3 sets"), lines
    for mod in ("kml_nfs_fx", "kml_adm_fx", "kml_ra_fx", "kml_ra_fp"):
        assert lines[f"{mod}-reload-cycles"].startswith("PASS 4 cycles"), (mod, lines)
    assert not any(v.startswith("FAIL") for v in lines.values()), lines


def test_qemu_test_arm64_refuses_an_x86_kernel_name(models):
    res = kmlc_cli("qemu-test", "--arch", "arm64", "--kernel", "rt", models["readahead_fp"])
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip() == ("kmlc: error: --arch arm64 boots Debian's arm64 6.1 kernel; "
                                  "--kernel rt is x86-64 only"), res.stderr


def hostile(twin, seed=0):
    """Raw rows of the model's input type: specials for float inputs
    (zeros of both signs, denormals, infinities, NaN, huge), the extremes
    and zero for integer ones, and the golden-style noise."""
    rng = np.random.default_rng(seed)
    n = twin.in_elems
    if twin.in_dtype == np.float32:
        specials = np.float32([0.0, -0.0, 1e-42, -1e-40, np.inf, -np.inf, np.nan, 1e30, -1e30,
                               88.7, -103.0, 1.0, -1.0, 65504.0])
        rows = [np.resize(np.roll(specials, k), n) for k in range(len(specials))]
        rows += list((rng.standard_normal((32, n)) * 10.0 ** rng.integers(-3, 5, (32, 1))))
        return np.array(rows, dtype=np.float32)
    info = np.iinfo(twin.in_dtype) if twin.in_dtype != np.bool_ else None
    vals = [0, 1] if info is None else [info.min, info.max, 0, -1, 1]
    rows = [np.resize(np.roll(vals, k), n) for k in range(len(vals))]
    return np.array(rows + list(rng.integers(-1000, 1000, (16, n))), dtype=twin.in_dtype)


@pytest.mark.kernel
def test_the_arm64_twin_is_bit_identical_to_the_x86_64_twin(models):
    for name, d in models.items():
        res = kmlc_cli("run", d, "--goldens", "--arch", "arm64")
        assert res.returncode == 0, (name, res.stderr)
        n = int(np.load(d / "goldens.npz")["inputs"].shape[0])
        assert res.stdout.strip() == f"kmlc: {n}/{n} golden vectors bit-identical (arm64's twin)"
        here, there = load(d), load(d, arch="arm64")
        x = hostile(here)
        a, b = here.run_raw(x), there.run_raw(x)
        assert a.tobytes() == b.tobytes(), name
        assert np.array_equal(here.last_saturations, there.last_saturations), name


@pytest.mark.kernel
def test_a_changed_output_bit_fails_the_golden_check(models, tmp_path):
    """The check can fail: one golden output's bit flipped, and `kmlc run
    --goldens` names the vector, on either architecture."""
    import shutil

    d = tmp_path / "m"
    shutil.copytree(models["heimdall_fx"], d)
    with np.load(d / "goldens.npz") as g:
        parts = dict(g)
    raw = parts["outputs"].view(np.uint8)
    raw[5, 0] ^= 1
    np.savez(d / "goldens.npz", **parts)
    for arch in ((), ("--arch", "arm64")):
        res = kmlc_cli("run", d, "--goldens", *arch)
        assert res.returncode == 1 and "golden vector 5:" in res.stderr, res.stderr
