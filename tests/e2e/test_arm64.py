"""arm64: modules cross-built against Debian's arm64 headers, and the twin
built for aarch64 and run under qemu-user.

The modules: every bundled model in both numerics, float models with
functions and normalizations, fixed-point arithmetic and a tree ensemble,
built with aarch64-linux-gnu-gcc and W=1 (a warning fails the build): the
.ko is an AArch64 ELF whose vermagic is Debian's arm64 kernel's, the float
model's FPU section is kernel_neon_begin/end with FPCR pinned, and its float
object has no fused multiply-add (the determinism rules, docs/numerics.md).
A hook, whose probe points are x86-64's today, is refused in one line.

The twin: the same C built for aarch64 gives the x86-64 twin's outputs bit
for bit, on every golden vector (those KUnit and the self-test check, run by
`kmlc run --goldens --arch arm64`) and on hostile rows (zeros of both signs,
denormals, infinities, NaN, 1e30).  The oracle is the x86-64 twin, itself
checked against onnxruntime elsewhere; what is tested here is that
nothing in the generated C depends on the architecture.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, SEED_MODELS, kmlc_cli, readahead_policy, seed_models, \
    tree_admission_policy
from kmlc.api import compile as kcompile, load
from kmlc.targets import kernel

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


@pytest.mark.kernel
def test_a_hook_is_refused_on_arm64_in_one_line(tmp_path):
    m, _ = readahead_policy()
    kcompile(m, tmp_path / "o", name="rahook", hooks=["readahead"], targets="kernel")
    res = kmlc_cli("build", tmp_path / "o", "--arch", "arm64")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert "the readahead hook (built and tested on x86-64 only) needs CONFIG_X86_64" \
        in res.stderr, res.stderr


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
