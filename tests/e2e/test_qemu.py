"""The modules in Debian's real 6.1 kernel, booted in qemu: each model's
self-test runs its golden vectors through the real module (the float ones
inside the real kernel_fpu_begin/end), and a corrupted golden vector must
stop a module from loading."""
import re
import subprocess

import numpy as np
import pytest

import kernel_c
from conftest import EXAMPLES, SEED_MODELS, nfs_policy, readahead_policy, seed_models
from kmlc.api import compile as kcompile
from kmlc.targets import qemu


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
def admission(tmp_path_factory):
    out = tmp_path_factory.mktemp("adm") / "heimdall"
    kcompile(EXAMPLES / "heimdall.onnx", out, numerics="fixed", hooks=["admission"],
             calibration=seed_models.sample_inputs("heimdall", 2000, seed=42))
    return out


@pytest.mark.kernel
def test_admission_target_in_real_kernel(admission):
    """Slow primary (10 ms), fast replica: >= 80% of reads redirected, every
    byte read checksummed, while 64 KiB writes go through the target (to the
    primary; the same blocks to the replica, both checksummed); 100
    attach/detach cycles under load and 100 reload cycles without a kernel
    warning; then the module's trace, write completions in the history,
    replayed through the twin gives the same features and decisions."""
    from kmlc.api import load
    from kmlc.targets.hooks import parse_admission_trace, traces

    res = qemu.run([admission])
    assert res["ok"], "\n".join(res["lines"])
    summary = {ln.split(":")[0]: ln for ln in res["lines"]}
    for key in ("kml_heimdall-admission", "kml_heimdall-attach-cycles",
                "kml_heimdall-reload-cycles"):
        assert "PASS" in summary[key], summary
    m = re.search(r"reads=(\d+) to_replica=(\d+) writes=(\d+) checksum_errors=0",
                  summary["kml_heimdall-admission"])
    reads, rep, writes = int(m.group(1)), int(m.group(2)), int(m.group(3))
    assert reads >= 200 and rep >= 0.8 * reads and writes >= 64
    events, feats, decisions = parse_admission_trace(traces(res["log"])["admission"])
    assert len(decisions) == reads
    # every write completed on the primary and entered the history, between reads
    kinds = events[:, 0]
    assert (kinds == 2).sum() == writes
    first_read = np.flatnonzero(kinds == 0)[0]
    assert (kinds[first_read:] == 2).any()
    tf, td = load(admission).admit_replay(events)
    assert np.array_equal(tf, feats) and np.array_equal(td, decisions)
    # and the history the model saw holds them: replaying without the
    # write completions gives other features
    rf, _ = load(admission).admit_replay(events[kinds != 2])
    assert not np.array_equal(rf, feats)


def test_admission_hook_checks_the_model(tmp_path):
    from kmlc.errors import KmlcError

    with pytest.raises(KmlcError, match="--numerics fixed"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "a", hooks=["admission"])
    with pytest.raises(KmlcError, match="11 features"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "b", hooks=["admission"],
                 numerics="fixed", calibration=seed_models.sample_inputs("readahead", 100))
    with pytest.raises(KmlcError, match="'kml_heimdall_admission'.*at most 11"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "d", hooks=["admission"],
                 numerics="fixed", name="heimdall_admission",
                 calibration=seed_models.sample_inputs("heimdall", 100))
    with pytest.raises(KmlcError, match="unknown hook 'prefetch'"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "c", hooks=["prefetch"])


def test_hook_params_set_the_compiled_defaults(tmp_path):
    """--hook-param NAME=VALUE becomes the module parameter's initializer
    (none for 0 and N, as checkpatch wants), its modinfo description and
    the manifest's hook_params; anything else is an error that names it."""
    import json

    from kmlc.errors import KmlcError

    cal = seed_models.sample_inputs("heimdall", 100)
    adm = dict(numerics="fixed", calibration=cal, hooks=["admission"], targets="kernel")
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "d", **adm)
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "n", **adm,
             hook_params=["history_writes=n", "probe_every=0"])
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "p", **adm, hook_params={"probe_every": 16})
    decl = lambda d: re.findall(r"^static (?:bool|unsigned int) (probe_every|history_writes)"  # noqa: E731
                                r"(?: = (\w+))?;", (d / "kernel/heimdall_admit.c").read_text(),
                                re.M)
    assert decl(tmp_path / "d") == [("probe_every", "64"), ("history_writes", "true")]
    assert decl(tmp_path / "n") == [("probe_every", ""), ("history_writes", "")]
    assert decl(tmp_path / "p") == [("probe_every", "16"), ("history_writes", "true")]
    assert "N: reads only (default N)" in (tmp_path / "n/kernel/heimdall_admit.c").read_text()
    assert json.loads((tmp_path / "n/kmlc.json").read_text())["hook_params"] == \
        {"probe_every": 0, "history_writes": False}
    ra = readahead_policy()
    kcompile(ra[0], tmp_path / "r", numerics="fixed", calibration=ra[1], hooks=["readahead"],
             targets="kernel", name="rap", hook_params=["window_events=16", "ra_pages=4,4,0,256"])
    src = (tmp_path / "r/kernel/rap_ra.c").read_text()
    assert "static unsigned int window_events = 16;" in src
    assert re.search(r"static unsigned int ra_pages\[KML_RAP_OUT_ELEMS\] = \{\s*4, 4, 0, 256,\s*\};"
                     r"\nmodule_param_array\(ra_pages, uint, NULL, 0644\);", src)
    assert "(default 4,4,0,256)" in src
    assert json.loads((tmp_path / "r/kmlc.json").read_text())["hook_params"]["ra_pages"] == \
        [4, 4, 0, 256]
    for bad, msg in ((["ra_pages=4,4,80"], "ra_pages=4,4,80: expected 4 comma-separated "
                      r"integers in 0\.\.8192, one per class"),
                     (["ra_pages=4,4,80,9000"], "ra_pages=4,4,80,9000: expected 4"),
                     (["ra_pages=4,x,80,2"], "ra_pages=4,x,80,2: expected 4")):
        with pytest.raises(KmlcError, match=msg):
            kcompile(ra[0], tmp_path / "bad", numerics="fixed", calibration=ra[1],
                     hooks=["readahead"], hook_params=bad)
    for bad, msg in ((["history_writes=2"], "history_writes=2: expected 0 or 1"),
                     (["probe_every=-1"], r"probe_every=-1: expected an integer in 0\.\.4294967295"),
                     (["vote=3"], "the admission hook has no parameter 'vote'"),
                     (["probe_every"], "'probe_every': expected NAME=VALUE")):
        with pytest.raises(KmlcError, match=msg):
            kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "bad", **adm, hook_params=bad)
    with pytest.raises(KmlcError, match="compile with --hooks"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "bad", hook_params=["vote=3"])
    assert not (tmp_path / "bad").exists()
    # docs/hooks.md's table is the compiler's
    from conftest import ROOT
    from kmlc.api import HOOK_PARAMS

    rows = re.findall(r"^ *\| (admission|readahead|nfs-rsize) \| `(\w+)` \| ([\w,]+) \|",
                      (ROOT / "docs/hooks.md").read_text(), re.M)
    shown = lambda v: (("Y" if v else "N") if isinstance(v, bool)  # noqa: E731
                       else ",".join(map(str, v)) if isinstance(v, tuple) else str(v))
    assert rows == [(h, k, shown(v[0])) for h, t in HOOK_PARAMS.items() for k, v in t.items()]


@pytest.mark.kernel
def test_admission_sources_are_kernel_style(admission):
    kernel_c.check_checkpatch_clean(admission / "kernel")
    kernel_c.check_checkpatch_clean(admission / "kunit")


@pytest.fixture(scope="module")
def readahead(tmp_path_factory):
    root = tmp_path_factory.mktemp("ra")
    m, cal = readahead_policy()
    kcompile(m, root / "fx", name="rapolicy", numerics="fixed", calibration=cal,
             hooks=["readahead"])
    kcompile(m, root / "fp", name="rapolicy_fp", hooks=["readahead"])
    return root / "fx", root / "fp"


@pytest.mark.kernel
def test_readahead_hook_in_real_kernel(readahead):
    """Sequential reader ends with more readahead than random reader, for
    the fixed model (inline) and the float one (deferred, real FPU); 100
    unload/reload cycles while both read; twin replay gives the module's
    features (and, inline, its classes)."""
    from kmlc.api import load
    from kmlc.targets.hooks import parse_readahead_trace

    res = qemu.run(list(readahead))
    assert res["ok"], "\n".join(res["lines"])
    for mod in ("kml_rapolicy", "kml_rapolicy_fp"):
        lines = [ln for ln in res["lines"] if ln.startswith(mod + "-")]
        assert any("readahead: PASS sequential ra_pages=80 > random ra_pages=2" in ln
                   for ln in lines), lines
        assert any("mmap: PASS sequential ra_pages=80 > random ra_pages=2" in ln
                   for ln in lines), lines
        assert any("reload-cycles: PASS 100 cycles" in ln for ln in lines), lines
    dumps = re.findall(r"KMLC-TRACE-BEGIN readahead\n(.*?)KMLC-TRACE-END", res["log"], re.S)
    assert len(dumps) == 2
    for d, text in zip(readahead, dumps):
        events, feats, classes = parse_readahead_trace(text)
        assert len(feats) > 50
        assert (events[:, 3] & 4).any()     # faults on uncached pages of a mapping
        tf, tc = load(d).ra_replay(events)
        assert np.array_equal(tf, feats)
        if d.name == "fx":  # the float model decides later, in process context
            assert np.array_equal(tc, classes)


@pytest.fixture(scope="module")
def nfs_rsize(tmp_path_factory):
    """The transparent NFS policy, fixed (inline) and float (deferred)."""
    root = tmp_path_factory.mktemp("nfs")
    m, cal = nfs_policy()
    kcompile(m, root / "fx", name="nfspolicy", numerics="fixed", calibration=cal,
             hooks=["nfs-rsize"])
    kcompile(m, root / "fp", name="nfspolicy_fp", hooks=["nfs-rsize"])
    return root / "fx", root / "fp"


def check_nfs_run(res, dirs):
    """The NFS scenario's results for each model, and its trace replayed
    through the twin: the module's features and decisions, bit for bit."""
    from kmlc.api import load
    from kmlc.targets.hooks import parse_nfs_trace

    for d in dirs:
        mod = "kml_" + load(d).name
        lines = [ln for ln in res["lines"] if ln.startswith(mod + "-")]
        assert any("nfs-rsize: PASS rsize 1048576 -> random 4096 -> sequential 262144" in ln
                   for ln in lines), lines
        assert any("nfs-detach: PASS detached 1048576, reattached 4096, unloaded 1048576, "
                   "other mount's module 1048576" in ln for ln in lines), lines
        assert any("reload-cycles: PASS 100 cycles under NFS load, rsize 1048576" in ln
                   for ln in lines), lines
        assert any("nfs-module: PASS nfs.ko loaded after the module" in ln for ln in lines), lines
    dumps = re.findall(r"KMLC-TRACE-BEGIN nfs-rsize\n(.*?)KMLC-TRACE-END", res["log"], re.S)
    assert len(dumps) == len(dirs)
    for d, text in zip(dirs, dumps):
        events, feats, decisions = parse_nfs_trace(text)
        kinds = np.bincount(events[:, 0], minlength=5)
        assert kinds[:4].min() > 0, kinds        # reads, dones, page adds, reclaim scans
        assert len(feats) >= 4 and len(decisions) >= 4
        assert {0, 2} <= set(decisions[:, 0].tolist())
        assert {4096, 262144} <= set(decisions[:, 1].tolist())
        tf, td = load(d).nfs_replay(events)
        assert np.array_equal(tf, feats)
        assert np.array_equal(td, decisions)
        # the rsize the module read at each event follows its decisions
        rs = events[events[:, 0] < 3, 4]
        assert {1048576, 4096, 262144} <= set(rs.tolist())


@pytest.mark.kernel
def test_nfs_rsize_hook_in_real_kernel(nfs_rsize):
    """An NFSv4.2 mount over loopback in Debian's 6.1 kernel, the fixed
    model inline in the tracepoint probes: the mount's rsize (as
    /proc/mounts shows it) goes from the negotiated 1 MiB to 4 KiB after
    random reads and to 256 KiB after sequential ones; detaching and
    unloading restore 1 MiB; 100 unload/reload cycles under NFS load; every
    byte read checksummed; the trace replayed through the twin gives the
    module's features and decisions bit for bit.  (The float model runs in
    the 6.12 test: one NFS model per boot keeps the qemu time down.)"""
    res = qemu.run([nfs_rsize[0]])
    assert res["ok"], "\n".join(res["lines"])
    check_nfs_run(res, nfs_rsize[:1])


def test_nfs_rsize_hook_checks_the_model(tmp_path):
    from kmlc.errors import KmlcError

    with pytest.raises(KmlcError, match="8 NFS features and reads 4 class scores; this model "
                                        "takes 5 and gives 4"):
        kcompile(EXAMPLES / "readahead.onnx", tmp_path / "a", hooks=["nfs-rsize"])
    with pytest.raises(KmlcError, match="takes 11 and gives 1"):
        kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "b", hooks=["nfs-rsize"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # the seed NFS model (8 -> 25 -> 10 -> 5 -> 4) fits the hook, float and fixed
    kcompile(EXAMPLES / "nfs_rsize.onnx", tmp_path / "c", hooks=["nfs-rsize"], targets="kernel")
    kcompile(EXAMPLES / "nfs_rsize.onnx", tmp_path / "d", hooks=["nfs-rsize"], targets="kernel",
             numerics="fixed", calibration=seed_models.sample_inputs("nfs_rsize", 500, seed=3))
    assert (tmp_path / "c" / "kernel" / "nfs_rsize_nfs.c").is_file()
    assert "KML_NFS_FLOAT_FRAC" in (tmp_path / "c" / "kernel" / "nfs_rsize_policy.h").read_text()
    assert "KML_NFS_RSIZE_IN_FRAC_BITS" in (tmp_path / "d" / "kernel" /
                                             "nfs_rsize_policy.h").read_text()


@pytest.mark.kernel
def test_nfs_rsize_sources_are_kernel_style(nfs_rsize):
    for d in nfs_rsize:
        kernel_c.check_checkpatch_clean(d / "kernel")


@pytest.mark.kernel
def test_build_matrix_every_installed_kernel(models, admission, readahead, nfs_rsize, tmp_path):
    """Every kind of module builds with W=1 and zero warnings against each
    installed Debian kernel: 6.1 (the distribution's) and 6.12."""
    import shutil

    from kmlc.targets import kernel

    kdirs = kernel.installed_headers()
    releases = [qemu.release_of(k) for k in kdirs]
    assert any(r.startswith("6.1.") for r in releases), releases
    assert any(r.startswith("6.12.") for r in releases), releases
    for k in kdirs:
        for src in [models[1], models[2], admission, *readahead, *nfs_rsize]:
            d = tmp_path / f"{qemu.release_of(k)}-{src.parent.name}-{src.name}"
            shutil.copytree(src / "kernel", d)
            ko = kernel.build_module(d, kdir=k)  # raises on any warning
            info = subprocess.run(["modinfo", "-F", "vermagic", ko], capture_output=True,
                                  text=True).stdout
            assert info.startswith(qemu.release_of(k) + " "), info


@pytest.mark.kernel
def test_hooks_in_real_6_12_kernel(admission, readahead, nfs_rsize):
    """The same modules and hook scenarios in Debian's 6.12 kernel (IBT on,
    other function layout, CC_FLAGS_FPU; NFS reads over local I/O instead
    of RPCs), the NFS one with the float model (deferred to a work item)."""
    from kmlc.targets import kernel

    k612 = [k for k in kernel.installed_headers() if qemu.release_of(k).startswith("6.12.")]
    res = qemu.run([admission, *readahead, nfs_rsize[1]], kdir=k612[-1])
    assert res["ok"], "\n".join(res["lines"])
    # admission: self-test, routing, attach cycles, reload cycles; readahead x2: 4 each
    # (self-test, read, mmap, reload cycles); nfs-rsize: self-test, rsize, detach,
    # reload cycles, nfs.ko reload
    assert sum("PASS" in ln for ln in res["lines"]) == 17, res["lines"]
    check_nfs_run(res, nfs_rsize[1:])
