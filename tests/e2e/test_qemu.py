"""The modules in real kernels, booted in qemu: each model's self-test runs
its golden vectors through the real module (the float ones inside the real
kernel_fpu_begin/end), a corrupted golden vector stops a module from
loading, and every hook's scenario passes in Debian's 6.1 and 6.12
kernels, its PREEMPT_RT kernel and the debug kernel kmlc builds (lockdep,
KASAN, UBSAN, KFENCE), with models kmlc's authors did not design for it
(every decision the same); and weight sets hot-swapped 100 times while
each hook runs (25 times in the debug kernel; docs/weights.md)."""
import json
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kernel_c
from conftest import (EXAMPLES, SEED_MODELS, constant_policy, nfs_policy, readahead_policy,
                      seed_models, tree_admission_policy, tree_readahead_policy)
from kmlc.api import compile as kcompile, pack
from kmlc.hooks import owner
from kmlc.targets import kernels, qemu


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qemu")
    out = []
    for name in SEED_MODELS:
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fp", name=f"{name}_fp",
                 targets="kernel")
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fx", name=f"{name}_fx",
                 targets="kernel", numerics="fixed",
                 calibration=seed_models.sample_inputs(name, 1000, seed=41))
        out += [root / f"{name}_fp", root / f"{name}_fx"]
    return out


@pytest.mark.kernel
def test_modules_selftest_in_real_kernel(models):
    res = qemu.run(models)
    assert res["ok"], "\n".join(res["lines"])
    passed = [ln for ln in res["lines"] if "PASS" in ln and "8/8 golden vectors" in ln]
    assert len(passed) == 6, res["lines"]


@pytest.mark.kernel
def test_corrupted_golden_vector_stops_the_module(models, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(models[0], bad)
    src = next((bad / "kernel").glob("*_mod.c"))
    text = src.read_text()
    m = re.search(r"\.out = \{\s*0x([0-9a-f]{8})", text)
    src.write_text(text[:m.start(1) - 2] + f"0x{int(m.group(1), 16) ^ 1:08x}"
                   + text[m.end(1):])
    res = qemu.run([bad])
    assert not res["ok"]
    assert any("FAIL insmod" in ln for ln in res["lines"]), res["lines"]
    assert "1 of 8 golden vectors differ from the twin" in res["log"]


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    """Every hook with the seed or test models, both numerics, and with
    constant models: readahead always readreverse, admission always
    declining (so that its overlap rule is exercised)."""
    root = tmp_path_factory.mktemp("hooked")
    out, src = {}, {}
    cal = seed_models.sample_inputs("heimdall", 2000, seed=42)
    kcompile(EXAMPLES / "heimdall.onnx", root / "heimdall", numerics="fixed",
             hooks=["admission"], calibration=cal, guards=["envelope"])
    out["admission"] = root / "heimdall"
    src["admission"] = onnx.load(EXAMPLES / "heimdall.onnx"), cal
    m, cal = constant_policy(11, [10.0], act="Sigmoid")
    # guards (here and above): their steps replay through the twin bit for bit
    kcompile(m, root / "decline", name="decline", numerics="fixed", calibration=cal,
             hooks=["admission"], guards=["benefit"])
    out["admission-const"], src["admission-const"] = root / "decline", (m, cal)
    m, cal = readahead_policy()
    kcompile(m, root / "rafx", name="rapolicy", numerics="fixed", calibration=cal,
             hooks=["readahead"], guards=["benefit=4", "rate=50"])
    kcompile(m, root / "rafp", name="rapolicy_fp", hooks=["readahead"])
    out["readahead-fx"], out["readahead-fp"] = root / "rafx", root / "rafp"
    src["readahead-fx"], src["readahead-fp"] = (m, cal), (m, None)
    m, cal = constant_policy(5, [0.0, 0.0, 0.0, 1.0])
    kcompile(m, root / "raconst", name="raconst", numerics="fixed", calibration=cal,
             hooks=["readahead"])
    out["readahead-const"] = root / "raconst"
    m, cal = nfs_policy()
    kcompile(m, root / "nfsfx", name="nfspolicy", numerics="fixed", calibration=cal,
             hooks=["nfs-rsize"])
    kcompile(m, root / "nfsfp", name="nfspolicy_fp", hooks=["nfs-rsize"])
    out["nfs-fx"], out["nfs-fp"] = root / "nfsfx", root / "nfsfp"
    src["nfs-fx"], src["nfs-fp"] = (m, cal), (m, None)
    # tree ensembles (scikit-learn's, through skl2onnx) behind two hooks
    m, cal = tree_admission_policy()
    kcompile(m, root / "treeadmit", name="treeadmit", numerics="fixed", calibration=cal,
             hooks=["admission"])
    out["admission-tree"] = root / "treeadmit"
    m, cal = tree_readahead_policy()
    kcompile(m, root / "ratree", name="ratree", numerics="fixed", calibration=cal,
             hooks=["readahead"])
    kcompile(m, root / "ratreefp", name="ratree_fp", hooks=["readahead"])
    out["readahead-tree-fx"], out["readahead-tree-fp"] = root / "ratree", root / "ratreefp"
    # three retrained versions of each (every weight and bias scaled by 0.95,
    # 0.90, 0.85), packed for the compiled model: what the swap scenario loads
    sets = {}
    for key, (model, rows) in src.items():
        sets[key] = []
        for v in (1, 2, 3):
            m = onnx.ModelProto()
            m.CopyFrom(model)
            for t in m.graph.initializer:
                a = numpy_helper.to_array(t)
                if a.dtype == np.float32:
                    t.CopyFrom(numpy_helper.from_array(a * np.float32(1 - 0.05 * v), t.name))
            path = root / f"{key}-v{v}.kmlw"
            pack(m, out[key], path, calibration=rows, version=v)
            sets[key].append(path)
    out["sets"] = sets
    return out


def check_hooks(res, dirs, swaps=()):
    """Every step of every hook's scenario passed (the replay of its traces
    through the twin included, and for the models in ``swaps`` the
    weight-swap scenario); what the policies did is only printed."""
    assert res["ok"], "\n".join(res["lines"])
    for d in dirs:
        meta = json.loads((d / "kmlc.json").read_text())
        mod, hook = meta["module"], owner(meta["hooks"][0])
        status = {ln.split(":", 1)[0]: ln.split(": ", 1)[1].split(" ", 1)[0]
                  for ln in res["lines"] if ln.startswith(mod)}
        assert status[mod] == "PASS", res["lines"]
        for step in hook.steps + (("swap",) if d in swaps else ()):
            assert status[f"{mod}-{step}"] in ("PASS", "INFO" if step == "overlap" else "PASS"), \
                (step, res["lines"])
        # the log times each step the guest ran (the uptime after its result)
        ran = set(re.findall(rf"^KMLC-RESULT ({mod}-\S+) ", res["log"], re.M))
        timed = set(re.findall(rf"^KMLC-TIME \d+\.\d+ ({mod}-\S+)$", res["log"], re.M))
        assert ran and ran == timed, (ran ^ timed)
        # every module's guard steps replayed, from its first, through the twin
        assert any(k.startswith(f"{mod}-guard-") and v == "PASS" for k, v in status.items()), \
            res["lines"]
    lines = {ln.split(":", 1)[0]: ln for ln in res["lines"]}
    # the loops ran as long as the kernel's counts say (Kernel.loops), and
    # the steps moved the kernel's volume of data
    loops = res["loops"]
    cycles, n = loops.cycles, loops.swaps
    for d in dirs:
        meta = json.loads((d / "kmlc.json").read_text())
        mod = meta["module"]
        assert re.search(rf"-reload-cycles: PASS {cycles} cycles", lines[f"{mod}-reload-cycles"])
        if meta["hooks"][0] == "admission":
            assert f"-attach-cycles: PASS {loops.scaled(100, 10)} cycles under load" in \
                lines[f"{mod}-attach-cycles"]
            assert f"-ext4: PASS {30 + loops.scaled(80, 20)} files intact" in lines[f"{mod}-ext4"]
    for d in swaps:
        mod = json.loads((d / "kmlc.json").read_text())["module"]
        m = re.search(rf"{n} swaps over 3 sets.* (\d+) inferences meanwhile", lines[f"{mod}-swap"])
        assert m and int(m.group(1)) > 0, lines[f"{mod}-swap"]
    return lines


def sets_of(hooked, keys):
    return [p for k in keys for p in hooked["sets"].get(k, [])]


@pytest.mark.kernel
def test_hooks_in_real_kernel(hooked):
    """Debian's 6.1: the admission mirror with Heimdall's seed model (data
    checksummed, legs identical, ext4 with the primary failed mid-run,
    failover, table reload), readahead fixed (inline) and float (work
    item), NFS fixed; out-of-range parameter writes refused; restore on
    detach and unload; reload cycles; traces replayed bit for bit; and
    100 weight swaps for each hook while it runs (the debug kernel runs
    as many)."""
    dirs = [hooked[k] for k in ("admission", "readahead-fx", "readahead-fp", "nfs-fx")]
    swapped = ("admission", "readahead-fx", "nfs-fx")      # each hook
    lines = check_hooks(qemu.run(dirs, weights=sets_of(hooked, swapped)), dirs,
                        swaps=[hooked[k] for k in swapped])
    assert re.search(r"legs identical", lines["kml_heimdall-ext4"])
    assert re.search(r"256 files read at once, 256 with a decision", lines["kml_rapolicy-files"])


@pytest.mark.kernel
def test_hooks_in_real_6_12_kernel(hooked):
    """Debian's 6.12 (IBT: the probes sit after endbr64; CC_FLAGS_FPU;
    NFS reads over local I/O), with constant models and NFS float: every
    read declined, so reads overlapping a write in flight go to the primary
    and never see an older write than one already read; and tree ensembles
    behind the admission hook (fixed point, a bool decision) and the
    readahead hook (fixed point inline, float in its work item)."""
    from kmlc.targets import kernel

    k612 = [k for k in kernel.installed_headers() if kernels.release_of(k).startswith("6.12.")]
    dirs = [hooked[k] for k in ("admission-const", "readahead-const", "nfs-fp", "admission-tree",
                                "readahead-tree-fx", "readahead-tree-fp")]
    lines = check_hooks(qemu.run(dirs, kdir=k612[-1]), dirs)
    m = re.search(r"backwards 0; (\d+) reads sent to the primary", lines["kml_decline-overlap"])
    assert m and int(m.group(1)) > 0, lines["kml_decline-overlap"]


@pytest.mark.kernel
def test_hooks_in_rt_kernel(hooked):
    """Debian's PREEMPT_RT kernel: spinlock_t sleeps there, so a hook that
    took one in a probe would log "BUG: sleeping function called from
    invalid context"; the hooks' locks are raw.  Weight swaps under load
    too (a float model: its classify_q reads the set under RCU-sched)."""
    dirs = [hooked[k] for k in ("admission", "readahead-fx", "nfs-fp")]
    res = qemu.run(dirs, kernel="rt", weights=sets_of(hooked, ["nfs-fp"]))
    assert res["release"].endswith("-rt-amd64")
    check_hooks(res, dirs, swaps=[hooked["nfs-fp"]])


@pytest.mark.kernel
def test_hooks_in_debug_kernel(hooked):
    """Linux 6.1 with lockdep, DEBUG_ATOMIC_SLEEP, KASAN, UBSAN and KFENCE:
    every scenario, 100 weight swaps for each hook while it runs (each
    version's golden outputs the twin's, forgeries refused, rollback), and
    no report in the kernel log."""
    dirs = [hooked[k] for k in ("admission-const", "readahead-fx", "readahead-fp", "nfs-fx")]
    swapped = ("admission-const", "readahead-fx", "nfs-fx")      # each hook
    res = qemu.run(dirs, kernel="debug", weights=sets_of(hooked, swapped))
    assert res["release"].endswith("-kmlc-debug")
    config = (qemu.resolve("debug").root / "image" / "boot" /
              f"config-{res['release']}").read_text()
    for opt in ("PROVE_LOCKING", "DEBUG_ATOMIC_SLEEP", "KASAN", "UBSAN", "KFENCE"):
        assert f"CONFIG_{opt}=y" in config, opt
    check_hooks(res, dirs, swaps=[hooked[k] for k in swapped])


SIMD_SCRIPT = """
set -e
p=/sys/module/$KML_MODULE/parameters
d=/sys/kernel/debug/$KML_MODULE/paths
[ "$(cat $p/simd)" = avx2 ]             # qemu -cpu max has AVX2: the best path
[ "$(cat $p/simd_min_macs)" = 512 ]
# the self-test ran its 8 golden vectors on each path, nothing was kept scalar
[ "$(cat $d)" = "$(printf 'scalar 8\\nsse2 8\\navx2 8\\nbusy 0')" ]
echo sse2 > $p/simd && [ "$(cat $p/simd)" = sse2 ]
if echo neon > $p/simd 2>/dev/null; then exit 4; fi
[ "$(cat $p/simd)" = sse2 ]              # a refused value changes nothing
echo auto > $p/simd && [ "$(cat $p/simd)" = avx2 ]
echo 100000 > $p/simd_min_macs && [ "$(cat $p/simd)" = scalar ]
"""


@pytest.mark.kernel
def test_simd_paths_in_real_kernel(tmp_path):
    """A fixed-point model with SIMD paths in Debian's 6.1 kernel: the
    self-test runs every path (debugfs "paths" counts them), the module
    parameters show and force the path, refuse a path that does not exist,
    and simd_min_macs turns SIMD off."""
    d = tmp_path / "heimdall_simd"
    kcompile(EXAMPLES / "heimdall.onnx", d, name="heimdall_simd", targets="kernel",
             numerics="fixed", calibration=seed_models.sample_inputs("heimdall", 1000, seed=41))
    assert json.loads((d / "kmlc.json").read_text())["simd_macs"] >= 512
    script = tmp_path / "simd.sh"
    script.write_text(SIMD_SCRIPT)
    res = qemu.run([d], script=script)
    assert res["ok"], "\n".join(res["lines"])
    for path in ("scalar", "sse2", "avx2"):
        assert f"8/8 golden vectors bit-identical to the twin ({path} path)" in res["log"]


SCRIPT = """
set -e
case $KML_MODULE in
kml_heimdall)   # a mirror over two empty legs of 64 MiB or more
    [ $(blockdev --getsize64 $KML_LEG0) -ge 67108864 ] && [ -b $KML_LEG1 ]
    dd if=/dev/urandom of=/tmp/blk bs=64k count=16 2>/dev/null
    dd if=/tmp/blk of=$KML_TARGET bs=64k oflag=direct 2>/dev/null
    [ "$(dd if=$KML_TARGET bs=64k count=16 iflag=direct 2>/dev/null | md5sum)" = \\
      "$(md5sum < /tmp/blk)" ]
    [ "$(dd if=$KML_LEG1 bs=64k count=16 iflag=direct 2>/dev/null | md5sum)" = \\
      "$(md5sum < /tmp/blk)" ] ;;
kml_nfspolicy)  # an NFS mount with a data file
    [ "$(kml_reader seq $KML_MOUNT/data 8192 512)" = "$(kml_reader seq /export/data 8192 512)" ] ;;
kml_raconst)    # a scratch disk; this one fails on purpose
    kml_reader seq $KML_DISK 1024 1024 > /dev/null
    exit 3 ;;
esac
"""


@pytest.mark.kernel
def test_user_scripts(hooked, tmp_path):
    """kmlc qemu-test --script: the user's script runs in the guest with the
    hook's environment ready ($KML_TARGET and its legs, $KML_MOUNT,
    $KML_DISK; busybox, kml_reader and dmsetup on PATH), and its exit
    status is the verdict."""
    script = tmp_path / "check.sh"
    script.write_text(SCRIPT)
    dirs = [hooked[k] for k in ("admission", "nfs-fx", "readahead-const")]
    res = qemu.run(dirs, script=script)
    lines = {ln.split(":", 1)[0]: ln for ln in res["lines"]}
    assert "PASS exit 0" in lines["kml_heimdall-script"], res["lines"]
    assert "PASS exit 0" in lines["kml_nfspolicy-script"], res["lines"]
    assert "FAIL exit 3" in lines["kml_raconst-script"], res["lines"]
    assert not res["ok"]
    assert not any("-replay" in ln or "-mirror" in ln for ln in res["lines"])


def test_hooks_check_the_model(tmp_path):
    from kmlc.errors import KmlcError

    cal = seed_models.sample_inputs("heimdall", 100)
    with pytest.raises(KmlcError, match="--numerics fixed"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "a", hooks=["admission"])
    with pytest.raises(KmlcError, match="11 features"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "b", hooks=["admission"],
                 numerics="fixed", calibration=seed_models.sample_inputs("readahead", 100))
    with pytest.raises(KmlcError, match="'kml_heimdall_admission'.*at most 11"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "d", hooks=["admission"],
                 numerics="fixed", name="heimdall_admission", calibration=cal)
    with pytest.raises(KmlcError, match="unknown hook 'prefetch'"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "c", hooks=["prefetch"])
    with pytest.raises(KmlcError, match="8 NFS features and reads 4 class scores; this model "
                                        "takes 5 and gives 4"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "e", hooks=["nfs-rsize"])
    with pytest.raises(KmlcError, match="takes 11 and gives 1"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "f", hooks=["nfs-rsize"])
    assert not any((tmp_path / x).exists() for x in "abcdef")
    # the seed NFS model (8 -> 25 -> 10 -> 5 -> 4) fits the hook, float and fixed
    kcompile(EXAMPLES / "nfs_rsize.onnx", tmp_path / "g", hooks=["nfs-rsize"], targets="kernel")
    kcompile(EXAMPLES / "nfs_rsize.onnx", tmp_path / "h", hooks=["nfs-rsize"], targets="kernel",
             numerics="fixed", calibration=seed_models.sample_inputs("nfs_rsize", 500, seed=3))
    assert "KML_NFS_FLOAT_FRAC" in (tmp_path / "g/kernel/kml_binding.h").read_text()
    assert "KML_NFS_RSIZE_IN_FRAC_BITS" in (tmp_path / "h/kernel/kml_binding.h").read_text()


@pytest.mark.kernel
def test_hook_sources_are_kernel_style(hooked):
    """The hooks' C, runtime and generated binding alike, is checkpatch
    --strict clean: no error, warning or check."""
    for d in (v for k, v in hooked.items() if k != "sets"):
        kernel_c.check_checkpatch_clean(d / "kernel", strict=True)


@pytest.mark.kernel
def test_build_matrix_every_installed_kernel(models, hooked, tmp_path):
    """Every kind of module builds with W=1 and zero warnings against each
    installed Debian kernel: 6.1 (the distribution's), 6.12 and 6.1 RT."""
    import shutil

    from kmlc.targets import kernel

    kdirs = kernel.installed_headers()
    releases = [kernels.release_of(k) for k in kdirs]
    assert any(r.startswith("6.1.") and not r.endswith("-rt-amd64") for r in releases), releases
    assert any(r.startswith("6.12.") for r in releases), releases
    assert any(r.endswith("-rt-amd64") for r in releases), releases
    for k in kdirs:
        for src in [models[1], models[2], *(v for k, v in hooked.items() if k != "sets")]:
            d = tmp_path / f"{kernels.release_of(k)}-{src.parent.name}-{src.name}"
            shutil.copytree(src / "kernel", d)
            ko = kernel.build_module(d, kdir=k)  # raises on any warning
            info = subprocess.run(["modinfo", "-F", "vermagic", ko], capture_output=True,
                                  text=True).stdout
            assert info.startswith(kernels.release_of(k) + " "), info
