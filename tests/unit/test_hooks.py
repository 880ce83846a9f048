"""The hooks' owners (kmlc.hooks): parameters and their compiled-in
defaults, the trace formats their C headers define, the prototypes their
C assumes, and what their Kbuild refuses."""
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, kmlc_cli, readahead_policy, seed_models
from kmlc.api import compile as kcompile
from kmlc.errors import KmlcError
from kmlc.hooks import HOOKS, owner
from kmlc.hooks.base import read_trace, trace_format


def test_hook_params_set_the_compiled_defaults(tmp_path):
    """--hook-param NAME=VALUE becomes the default in kml_binding.h, its
    modinfo description and the manifest's hook_params; anything else is
    an error that names it."""
    cal = seed_models.sample_inputs("heimdall", 100)
    adm = dict(numerics="fixed", calibration=cal, hooks=["admission"], targets="kernel")
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "d", **adm)
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "n", **adm,
             hook_params=["history_writes=n", "probe_every=0"])
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "p", **adm, hook_params={"probe_every": 16})
    defs = lambda d: dict(re.findall(r"^#define (KML_ADMIT_\w+) (.+)$",  # noqa: E731
                                     (d / "kernel/kml_binding.h").read_text(), re.M))
    assert defs(tmp_path / "d") == {"KML_ADMIT_PROBE_EVERY": "64",
                                    "KML_ADMIT_PROBE_EVERY_DOC": '"64"',
                                    "KML_ADMIT_HISTORY_WRITES": "true",
                                    "KML_ADMIT_HISTORY_WRITES_DOC": '"Y"'}
    assert defs(tmp_path / "n")["KML_ADMIT_HISTORY_WRITES"] == "false"
    assert defs(tmp_path / "n")["KML_ADMIT_HISTORY_WRITES_DOC"] == '"N"'
    assert defs(tmp_path / "p")["KML_ADMIT_PROBE_EVERY"] == "16"
    assert json.loads((tmp_path / "n/kmlc.json").read_text())["hook_params"] == \
        {"probe_every": 0, "history_writes": False}
    m, c = readahead_policy()
    kcompile(m, tmp_path / "r", numerics="fixed", calibration=c, hooks=["readahead"],
             targets="kernel", name="rap", hook_params=["window_events=16", "ra_pages=4,4,0,256"])
    b = (tmp_path / "r/kernel/kml_binding.h").read_text()
    assert "#define KML_RA_WINDOW_EVENTS 16\n" in b
    assert "#define KML_RA_RA_PAGES { 4, 4, 0, 256 }\n" in b
    assert '#define KML_RA_RA_PAGES_DOC "4,4,0,256"\n' in b
    assert json.loads((tmp_path / "r/kmlc.json").read_text())["hook_params"]["ra_pages"] == \
        [4, 4, 0, 256]
    for bad, msg in ((["ra_pages=4,4,80"], "ra_pages=4,4,80: expected 4 comma-separated "
                      r"integers in 0\.\.8192, one per class"),
                     (["ra_pages=4,4,80,9000"], "ra_pages=4,4,80,9000: expected 4"),
                     (["ra_pages=4,x,80,2"], "ra_pages=4,x,80,2: expected 4")):
        with pytest.raises(KmlcError, match=msg):
            kcompile(m, tmp_path / "bad", numerics="fixed", calibration=c,
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


def test_docs_table_is_the_owners():
    """docs/hooks.md's parameter table is the owners' (one spelling)."""
    rows = re.findall(r"^ *\| (admission|readahead|nfs-rsize) \| `(\w+)` \| ([\w,]+) \| "
                      r"([^|]+?) \|", (ROOT / "docs/hooks.md").read_text(), re.M)
    shown = lambda v: (("Y" if v else "N") if isinstance(v, bool)  # noqa: E731
                       else ",".join(map(str, v)) if isinstance(v, tuple) else str(v))
    rng = lambda p: "Y/N" if isinstance(p.default, bool) else f"{p.lo}..{p.hi}"  # noqa: E731
    want = [(h.name, k, shown(p.default), rng(p)) for h in HOOKS.values()
            for k, p in h.params.items()]
    assert [(h, k, d, r.split()[0]) for h, k, d, r in rows] == want


def test_trace_formats_are_the_headers():
    """Each event's fields come from its header's TP_printk, and a trace
    line in that format reads back as the numbers it prints (a line
    written here, as the kernel prints it)."""
    ra = trace_format("kml_ra_trace.h")
    assert ra == {"kml_ra_miss": ["file", "seq", "index", "ra_pages", "flags", "f"],
                  "kml_ra_decision": ["file", "seq", "cls", "ra_pages"]}
    for h in HOOKS.values():
        assert set(h.trace_events()) and all(h.trace_events().values())
    text = ("# entries-in-buffer/entries-written: 3/3   #P:2\n"
            " kml_reader-168 [001] ....1.. 4.949895: kml_ra_miss: file=2 seq=1 index=36474 "
            "ra_pages=32 flags=2 f=16,2058,2195,4300,16\n"
            " kml_reader-168 [001] ....1.. 4.949897: kml_ra_decision: file=2 seq=1 cls=3 "
            "ra_pages=120\n"
            " other-1 [000] ..... 5.0: sched_switch: prev_comm=x prev_pid=1\n")
    ev = read_trace(text, ra)
    assert ev["kml_ra_miss"].tolist() == [[2, 1, 36474, 32, 2, 16, 2058, 2195, 4300, 16]]
    assert ev["kml_ra_decision"].tolist() == [[2, 1, 3, 120]]
    with pytest.raises(KmlcError, match="does not match the kml_ra_decision event's format"):
        read_trace(text.replace("cls=3", "class=3"), ra)
    with pytest.raises(KmlcError, match="have 9 values, not 10"):
        read_trace(text.replace("f=16,2058,", "f=2058,"), ra, {"kml_ra_miss": 10})


def test_readahead_trace_replays_in_file_order(tmp_path):
    """Misses recorded on two CPUs come out of the trace in time order, not
    in each file's order; the replay follows each file's sequence numbers
    (the features of a window of misses 1, 3 and 2 in that order differ
    from 1, 2, 3)."""
    m, c = readahead_policy()
    kcompile(m, tmp_path / "r", numerics="fixed", calibration=c, hooks=["readahead"],
             name="rap")
    from kmlc.api import load

    twin = load(tmp_path / "r")
    pages = [10, 500, 20, 30]       # file 1's misses, in their order
    f, cls = twin.replay([[1, p, 32, (1 if i == 0 else 0) | (2 if i == 3 else 0)]
                          for i, p in enumerate(pages)])
    lines = []
    for seq in (0, 2, 1, 3):        # printed out of order
        flags = (1 if seq == 0 else 0) | (2 if seq == 3 else 0)
        feats = ",".join(map(str, f[0])) if seq == 3 else "0,0,0,0,0"
        lines.append(f" r-1 [00{seq % 2}] ..... 1.0: kml_ra_miss: file=1 seq={seq} "
                     f"index={pages[seq]} ra_pages=32 flags={flags} f={feats}")
    lines.append(f" r-1 [000] ..... 1.1: kml_ra_decision: file=1 seq=3 cls={cls[0]} "
                 "ra_pages=2")
    rep = twin.replay_trace("\n".join(lines) + "\n")
    assert rep.identical and len(rep.features) == 1
    wrong = "\n".join(lines).replace("seq=1 index=500", "seq=1 index=501")
    assert not twin.replay_trace(wrong + "\n").identical


def test_model_names_cannot_take_runtime_files():
    """A model named like a runtime file would overwrite it in OUTDIR."""
    from kmlc.api import check_name

    for name in ("kml_features", "kml_hook", "kml_ra", "kml_binding", "kml_admit_trace",
                 "kml_types"):
        with pytest.raises(KmlcError, match="not usable"):
            check_name(name)
    assert check_name("kml_mine") == "kml_mine"


def nfstrace(version: str) -> str:
    """fs/nfs/nfstrace.h of Debian's linux-source-<version>."""
    if version == "6.1":
        from conftest import kernel_tree

        return (kernel_tree() / "fs/nfs/nfstrace.h").read_text()
    tar = sorted(Path("/usr/src").glob(f"linux-source-{version}.tar.*"))
    assert tar, f"install linux-source-{version} (the README's setup does)"
    with tarfile.open(tar[-1]) as t:
        return t.extractfile(f"linux-source-{version}/fs/nfs/nfstrace.h").read().decode()


@pytest.mark.parametrize("version", ["6.1", "6.12"])
def test_nfs_tracepoint_prototypes_are_the_kernels(version):
    """nfs.ko's tracepoints are not declared in the installed headers: the
    probes in kml_nfs.c take their prototypes as the source of each
    kernel kmlc supports declares them."""
    src = (ROOT / "runtime-kernel/kml_nfs.c").read_text()
    text = nfstrace(version)
    norm = lambda s: " ".join(s.replace("\n", " ").split())  # noqa: E731
    for event, probe in (("nfs_initiate_read", "kml_tp_read"),
                         ("nfs_readpage_done", "kml_tp_done")):
        proto = re.search(r"TRACE_EVENT\(" + event + r",\s*TP_PROTO\((.*?)\),", text, re.S)
        mine = re.search(r"static void " + probe + r"\(void \*data, (.*?)\)\n", src, re.S)
        assert proto and mine, event
        assert norm(proto.group(1)) == norm(mine.group(1)), (version, event)
    assert "6.1 6.2 6.3 6.4 6.5 6.6 6.7 6.8 6.9 6.10 6.11 6.12" in owner("nfs-rsize").kbuild


@pytest.mark.kernel
def test_kbuild_refuses_what_the_code_cannot_run_on(tmp_path):
    """A kernel without what a hook needs fails the build with one line
    naming it (here the configuration's DYNAMIC_FTRACE_WITH_REGS unset on
    make's command line); Kconfig says the same for an in-tree build."""
    from kmlc.targets.kernel import find_kdir, make_command

    m, c = readahead_policy()
    kcompile(m, tmp_path / "r", numerics="fixed", calibration=c, hooks=["readahead"],
             name="rap", targets="kernel")
    kdir = tmp_path / "r/kernel"
    res = subprocess.run(make_command(find_kdir(), kdir)
                         + ["CONFIG_DYNAMIC_FTRACE_WITH_REGS=", "modules"],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert ("kml_rap: the readahead hook (probes through ftrace) needs "
            "CONFIG_DYNAMIC_FTRACE_WITH_REGS") in res.stderr, res.stderr[-2000:]
    kconfig = (kdir / "Kconfig").read_text()
    assert re.search(r"depends on \(X86_64 \|\| ARM64\) && DYNAMIC_FTRACE_WITH_REGS "
                     r"&& FILE_LOCKING", kconfig)
    assert not (kdir / "kml_rap.ko").exists()


@pytest.mark.parametrize("kinds,ok", [([0, 1, 2, 4], True), ([0, 0, 2, 4], False), ([], False)])
def test_nfs_replay_verdict_needs_every_kind_of_event(monkeypatch, kinds, ok):
    """An NFS replay passes only when the trace held reads, read completions
    and page-cache adds (the three events the features are made of) and the
    module's features are the twin's; the verdict line counts each kind.
    A lost event fails it whatever the replay says."""
    import numpy as np

    from kmlc.hooks.base import Replay

    hook = owner("nfs-rsize")
    f = np.ones((1, 5), np.int64)
    rows = np.array([[k] + [0] * 11 for k in kinds], np.int64).reshape(len(kinds), 12)
    monkeypatch.setattr(hook, "replay", lambda twin, text: Replay(f, f, f, f, rows))
    line, _ = hook.replay_verdict("m", "fx", "", None)
    assert line.split()[1] == ("PASS" if ok else "FAIL"), line
    n = [kinds.count(k) for k in range(3)]
    assert f"{n[0]} reads, {n[1]} dones, {n[2]} page adds in the history" in line
    lost = "# entries-in-buffer/entries-written: 10/12   #P:2\n"
    line, _ = hook.replay_verdict("m", "fx", lost, None)
    assert line == "m-replay-fx FAIL the trace lost 2 events"


def test_scenario_modules_come_from_the_images_own_lists(tmp_path):
    """A scenario's Debian modules are found by name in the image's
    modules.order, loaded after their own depends= (either spelling, - or
    _), never twice, compressed ones unpacked; one the kernel builds in is
    not loaded; one the image lacks is refused in one line naming it."""
    import lzma

    from kmlc.errors import KmlcError
    from kmlc.targets import qemu

    mods = tmp_path / "k" / "image" / "lib" / "modules" / "6.1.0-9-arm64"
    (mods / "kernel" / "drivers").mkdir(parents=True)

    def ko(path: str, depends: str, xz: bool = False) -> None:
        data = b"\x7fELF...\0name=x\0depends=" + depends.encode() + b"\0vermagic=6.1\0"
        f = mods / path
        if xz:
            f.with_name(f.name + ".xz").write_bytes(lzma.compress(data))
        else:
            f.write_bytes(data)

    ko("kernel/drivers/dm-mod.ko", "dax")
    ko("kernel/drivers/dax.ko", "", xz=True)
    ko("kernel/drivers/dm-delay.ko", "dm_mod")
    ko("kernel/drivers/null_blk.ko", "configfs")
    (mods / "modules.order").write_text("kernel/drivers/dax.ko\nkernel/drivers/dm-mod.ko\n"
                                        "kernel/drivers/dm-delay.ko\nkernel/drivers/null_blk.ko\n")
    (mods / "modules.builtin").write_text("kernel/fs/configfs/configfs.ko\n")
    sc = [qemu.Scenario("a", tmp_path / "a.ko", needs=["dm-delay", "null_blk", "dm-mod"])]
    got = qemu.debian_modules(tmp_path / "k", sc)
    assert [m for m, _ in got] == ["dax", "dm-mod", "dm-delay", "null_blk"]
    assert all(b"\0depends=" in data for _, data in got)          # dax.ko.xz unpacked
    sc = [qemu.Scenario("b", tmp_path / "b.ko", needs=["nfsd"])]
    with pytest.raises(KmlcError, match="the k kernel has no module 'nfsd'"):
        qemu.debian_modules(tmp_path / "k", sc)


def test_dkms_reads_the_kbuilds_requirements():
    """BUILD_EXCLUSIVE_CONFIG takes each single-option requirement;
    BUILD_EXCLUSIVE_ARCH the architectures allowed by every either-or
    requirement made only of architecture options (intersected), and none
    when an either-or names another option."""
    from kmlc.targets.package import kbuild_requirements

    kb = ("ifeq ($(CONFIG_X86_64)$(CONFIG_ARM64),)\n$(error a)\nendif\n"
          "ifeq ($(CONFIG_BLK_DEV_DM),)\n$(error b)\nendif\n"
          "ifeq ($(CONFIG_X86_64)$(CONFIG_KERNEL_MODE_NEON),)\n$(error c)\nendif\n")
    assert kbuild_requirements(kb) == (["CONFIG_BLK_DEV_DM"], ["aarch64", "x86_64"])
    kb2 = kb + "ifeq ($(CONFIG_X86_64)$(CONFIG_X86_32),)\n$(error d)\nendif\n"
    assert kbuild_requirements(kb2) == (["CONFIG_BLK_DEV_DM"], ["aarch64", "x86_64"])
    only_x86 = kb + "ifeq ($(CONFIG_X86_64)$(CONFIG_X86_64),)\n$(error e)\nendif\n"
    assert kbuild_requirements(only_x86)[1] == ["x86_64"]
    assert kbuild_requirements("ifeq ($(CONFIG_NFS_FS)$(CONFIG_NFS_V4),)\n") == ([], [])


def test_a_boots_default_timeout_grows_with_its_scenarios():
    """kmlc qemu-test's default timeout: 600 s (1,800 on the debug kernel)
    for a few models, and 150 s per hooked model beyond that (450 on the
    debug kernel; a swap scenario half again), so that six hooked models
    on a busy machine are not cut off at 600 s (which a CI run saw)."""
    from pathlib import Path

    from kmlc.targets.kernels import Kernel
    from kmlc.targets.qemu import Scenario, default_timeout

    k = Kernel("6.12", Path("/k"), "6.12.0", Path("/r"))
    dbg = Kernel("debug", Path("/k"), "6.1.0-kmlc-debug", Path("/r"), debug=True)
    hooked = [Scenario(f"m{i}", Path("/m.ko"), hook=object()) for i in range(6)]
    plain = [Scenario(f"p{i}", Path("/p.ko")) for i in range(6)]
    assert default_timeout(plain, k) == 600 and default_timeout(hooked[:4], k) == 600
    assert default_timeout(hooked, k) == 900 and default_timeout(hooked + plain, k) == 1020
    assert default_timeout(hooked[:2], dbg) == 1800
    swapped = [Scenario(f"s{i}", Path("/s.ko"), hook=object(), swaps=True) for i in range(4)]
    assert default_timeout(swapped, dbg) == 4 * (450 + 225)


def test_scenario_loops_are_the_kernels_unless_asked():
    """Debian's x86-64 kernels run 25 reload cycles and 100 swaps (6.12: 8
    cycles); the debug kernel 5 and 100; arm64 5 and 20; the debug kernel and arm64 move
    40% of the scenarios' data;
    a count given to the scenario is the count its shell loops run and
    report."""
    from pathlib import Path

    from kmlc.hooks import owner
    from kmlc.targets.kernels import Kernel, Loops
    from kmlc.targets.qemu import swap_scenario

    fast = Kernel("rt", Path("/k"), "6.1.0-rt-amd64", Path("/r"))
    dbg = Kernel("debug", Path("/k"), "6.1.0-kmlc-debug", Path("/r"), debug=True)
    arm = Kernel("6.1", Path("/k"), "6.1.0-arm64", Path("/r"), arch="arm64")
    new = Kernel("6.12", Path("/k"), "6.12.117+deb12-amd64", Path("/r"))
    assert fast.loops == Loops(25, 100, 100) and dbg.loops == Loops(5, 100, 40)
    assert arm.loops == Loops(5, 20, 40) and new.loops == Loops(8, 100, 100)
    for hook in ("readahead", "nfs-rsize", "admission"):
        text = owner(hook).scenario("kml_x", "kml_x.ko", Loops(7, 1))
        assert "for c in $(seq 7); do" in text and '"7 cycles' in text, hook
    # the data the steps move: all of it on Debian's x86-64 kernels, 40% (at
    # least what each check needs) on the debug kernel
    full, part = (owner("admission").scenario("m", "m.ko", k.loops) for k in (fast, dbg))
    assert "for c in $(seq 100); do echo 0 > $P/enabled" in full
    assert "for c in $(seq 40); do echo 0 > $P/enabled" in part
    assert "writes 41 120;" in full and "writes 41 72;" in part and '"62 files intact' in part
    assert "for round in $(seq 4); do" in full and "for round in $(seq 2); do" in part
    assert '[ "$w0" -ge 64 ]' in full and '[ "$w0" -ge 32 ]' in part
    full, part = (owner("nfs-rsize").scenario("m", "m.ko", k.loops) for k in (fast, dbg))
    assert full.count("8192 1000 ") == 10 and part.count("8192 400 ") == 10
    full, part = (owner("readahead").scenario("m", "m.ko", k.loops) for k in (fast, dbg))
    assert "phases /dev/$1 4096 3" in full and "phases /dev/$1 1638 3" in part
    text = swap_scenario("kml_x", None, 3, 13)
    assert "while [ $i -lt 13 ]" in text and "running $(( (13 - 2) % 3 ))" in text
    assert '"13 swaps over 3 sets' in text


def test_swap_check_fails_on_a_wrong_version_or_golden_output(tmp_path):
    """The swap scenario's check of the running set (its shell function,
    run here by the host's sh on files laid out as in the guest): true only
    when the module's version and its golden outputs are the set's."""
    import re
    import subprocess

    from kmlc.targets.qemu import swap_scenario

    fn = re.search(r"^running\(\) \{.*?\}\n", swap_scenario("kml_x", None, 3, 13), re.M | re.S)
    s, lib = tmp_path / "sys", tmp_path / "lib"
    s.mkdir(), lib.mkdir()
    gold = "3f800000 0\nbf800000 2\n"
    (lib / "expect1").write_text("7\n")
    (lib / "gold1").write_text(gold)

    def running(version, goldens):
        (s / "weights_version").write_text(version)
        (tmp_path / "goldens").write_text(goldens)
        return subprocess.run(["sh", "-c", fn.group(0) + "running 1"], env={
            "S": str(s), "L": str(lib), "G": str(tmp_path / "goldens"), "PATH": "/usr/bin:/bin"},
            capture_output=True).returncode

    assert running("7\n", gold) == 0
    assert running("6\n", gold) == 1
    assert running("7\n", gold.replace("bf8", "bf9")) == 1
    assert running("7\n", gold[:-1]) == 1
    assert running("7\n", gold + "0 0\n") == 1


def test_loop_counts_out_of_range_are_refused_before_any_boot(tmp_path):
    """--swaps below 2 (the rollback step reads the set before the last)
    and --cycles below 1 are refused by name, with no traceback."""
    for opt, bad, lo in (("--swaps", "1", 2), ("--cycles", "0", 1), ("--swaps", "x", None)):
        r = kmlc_cli("qemu-test", tmp_path, opt, bad)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert f"Invalid value for '{opt}'" in r.stderr, r.stderr
        if lo is not None:
            assert f"{lo}<=x<=100000" in r.stderr, r.stderr
