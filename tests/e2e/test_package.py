"""`kmlc package`: a DKMS source tree and Debian packages of a compiled model.

The oracles are the tools a distribution uses, not kmlc: bash reads
dkms.conf, plain `make` builds the tree, dpkg-deb reads the packages, and
on this machine dpkg installs them, DKMS builds and signs the module for
every installed kernel with headers (its MOK key, checked with openssl),
the module DKMS built loads in Debian's 6.1 kernel under qemu and passes
its self-test and its hook's scenario, the twin package runs as the
compiled twin does, and `dpkg -r` leaves nothing of either behind.
"""
import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import kmlc_cli, mlp_model, readahead_policy
from kmlc.api import compile as kcompile, load
from kmlc.targets.kernel import installed_headers
from kmlc.targets.kernels import release_of
from test_signing import split, verifies


def conf(tree: Path) -> dict:
    """dkms.conf as DKMS reads it: sourced by bash."""
    names = ["PACKAGE_NAME", "PACKAGE_VERSION", "BUILT_MODULE_NAME[0]",
             "DEST_MODULE_LOCATION[0]", "AUTOINSTALL", "BUILD_EXCLUSIVE_CONFIG",
             "BUILD_EXCLUSIVE_ARCH", "MAKE[0]"]
    script = "kernel_source_dir=KDIR; . ./dkms.conf; " + "; ".join(
        f'printf "%s\\n" "${{{n}}}"' for n in names)
    out = subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return dict(zip(names, out))


@pytest.mark.kernel
def test_the_dkms_tree_is_the_module_and_builds_with_plain_make(tmp_path):
    out = tmp_path / "o"
    m, cal = readahead_policy()
    kcompile(m, out, name="rapkg", numerics="fixed", calibration=cal, hooks=["readahead"])
    assert kmlc_cli("build", out).returncode == 0          # build products in OUTDIR/kernel
    res = kmlc_cli("package", out, "--dkms", "-o", tmp_path / "dist", "--version", "2.1")
    assert res.returncode == 0, res.stderr
    tree = tmp_path / "dist" / "kml-rapkg-2.1"
    assert res.stdout.strip() == f"kmlc: wrote {tree}"
    c = conf(tree)
    assert (c["PACKAGE_NAME"], c["PACKAGE_VERSION"], c["BUILT_MODULE_NAME[0]"],
            c["AUTOINSTALL"]) == ("kml-rapkg", "2.1", "kml_rapkg", "yes")
    assert c["MAKE[0]"] == "make KDIR=KDIR"
    # what the Kbuild checks of a kernel's configuration, DKMS checks first
    kbuild = (out / "kernel" / "Kbuild").read_text()
    needs = re.findall(r"ifeq \(\$\((CONFIG_\w+)\),\)", kbuild)
    assert needs and "CONFIG_DYNAMIC_FTRACE_WITH_REGS" in needs
    assert c["BUILD_EXCLUSIVE_CONFIG"].split() == needs
    # the hook's architectures (either option), as DKMS matches uname -m
    assert "ifeq ($(CONFIG_X86_64)$(CONFIG_ARM64),)" in kbuild
    assert c["BUILD_EXCLUSIVE_ARCH"] == "^(aarch64|x86_64)$"
    assert re.fullmatch(c["BUILD_EXCLUSIVE_ARCH"], os.uname().machine)
    # the sources, byte for byte; no build products
    shipped = {p.name for p in tree.iterdir()} - {"dkms.conf"}
    sources = {p.name for p in (out / "kernel").iterdir()
               if p.suffix in (".c", ".h") or p.name in ("Kbuild", "Makefile", "Kconfig",
                                                         "selftest_inputs.txt")}
    sources -= {p.name for p in (out / "kernel").glob("*.mod.c")}
    assert shipped == sources
    for name in shipped:
        assert (tree / name).read_bytes() == (out / "kernel" / name).read_bytes(), name
    # the tree builds as DKMS builds it: make KDIR=<headers>, no kmlc involved
    for kdir in installed_headers()[:1] + installed_headers()[-1:]:
        work = tmp_path / f"build-{kdir.name}"
        shutil.copytree(tree, work)
        r = subprocess.run(["make", f"KDIR={kdir}"], cwd=work, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "warning:" not in r.stdout + r.stderr
        vermagic = subprocess.run(["/sbin/modinfo", "-F", "vermagic", work / "kml_rapkg.ko"],
                                  capture_output=True, text=True).stdout.split()[0]
        assert vermagic == release_of(kdir)
    # qemu-test --ko takes a module built elsewhere only for the kernel it boots
    built612 = work / "kml_rapkg.ko"
    res = kmlc_cli("qemu-test", out, "--ko", built612)        # Debian's 6.1 by default
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{built612}: built for {vermagic}, not for the 6.1 kernel" in res.stderr, res.stderr


@pytest.mark.kernel
def test_package_refuses_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "o"
    kcompile(mlp_model([4, 8, 2]), out, name="pk", targets="user")     # no kernel target
    good = tmp_path / "good"
    kcompile(mlp_model([4, 8, 2]), good, name="pk", targets="kernel")
    for args, why in (((out, "--deb"), "no kernel module sources here"),
                      ((tmp_path / "none", "--dkms"), "not a kmlc output directory"),
                      ((good,), "say what to write"),
                      ((good, "--dkms", "--version", "v1"), "starts with a digit"),
                      ((good, "--deb", "--version", "1-2"), "only letters, digits"),
                      ((good, "--deb", "--maintainer", "nobody"), "'Name <email>'")):
        res = kmlc_cli("package", *args, "-o", tmp_path / "dist")
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert why in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
        assert not (tmp_path / "dist").exists()
        assert not list(tmp_path.glob(".dist.kmlc-*"))


def _dpkg(*args, check=True):
    r = subprocess.run(["dpkg", *args], capture_output=True, text=True)
    assert not check or r.returncode == 0, r.stdout + r.stderr
    return r


def _installed_module(kernel: str, module: str) -> bytes | None:
    d = Path("/lib/modules") / kernel / "updates" / "dkms"
    for f in (d / f"{module}.ko", d / f"{module}.ko.xz"):
        if f.is_file():
            return f.read_bytes() if f.suffix == ".ko" else lzma.decompress(f.read_bytes())
    return None


@pytest.mark.kernel
def test_the_deb_installs_builds_for_every_kernel_boots_and_removes_cleanly(tmp_path):
    if not shutil.which("dkms") or subprocess.run(["id", "-u"], capture_output=True,
                                                  text=True).stdout.strip() != "0":
        pytest.fail("this test installs packages: it needs root and dkms (the README's setup "
                    "installs dkms)")
    from kmlc.targets import qemu

    out = tmp_path / "o"
    m, cal = readahead_policy()
    kcompile(m, out, name="radeb", numerics="fixed", calibration=cal, hooks=["readahead"])
    res = kmlc_cli("package", out, "--deb", "-o", tmp_path / "dist", "--version", "3.0",
                   "--maintainer", "Lab Admin <admin@example.org>")
    assert res.returncode == 0, res.stderr
    arch = _dpkg("--print-architecture").stdout.strip()
    dkms_deb = tmp_path / "dist" / "kml-radeb-dkms_3.0_all.deb"
    twin_deb = tmp_path / "dist" / f"kml-radeb-twin_3.0_{arch}.deb"
    info = subprocess.run(["dpkg-deb", "-f", dkms_deb, "Package", "Version", "Architecture",
                           "Depends", "Maintainer"], capture_output=True, text=True).stdout
    assert info.split("\n")[:5] == ["Package: kml-radeb-dkms", "Version: 3.0",
                                    "Architecture: all", "Depends: dkms (>= 2.8)",
                                    "Maintainer: Lab Admin <admin@example.org>"], info
    kernels = [release_of(k) for k in installed_headers()]
    assert any(k.startswith("6.1.") for k in kernels) and any(k.startswith("6.12.")
                                                              for k in kernels)
    try:
        r = _dpkg("-i", dkms_deb, twin_deb)
        for k in kernels:
            assert f"built and installed for {k}" in r.stdout, r.stdout
            st = subprocess.run(["dkms", "status", "-m", "kml-radeb", "-v", "3.0", "-k", k],
                                capture_output=True, text=True).stdout
            assert "installed" in st, st
            ko = _installed_module(k, "kml_radeb")
            assert ko is not None, k
            assert re.search(rb"\0vermagic=" + re.escape(k.encode()) + rb" ", ko), k
            # signed by DKMS with the machine's MOK key, as its framework.conf says
            body, sig = split(ko)
            assert verifies(tmp_path, body, sig, Path("/var/lib/dkms/mok.pub"))
        # a kernel installed later: the hook DKMS installs for kernel packages
        # builds it again (AUTOINSTALL)
        later = kernels[-1]
        subprocess.run(["dkms", "remove", "-m", "kml-radeb", "-v", "3.0", "-k", later],
                       check=True, capture_output=True)
        assert _installed_module(later, "kml_radeb") is None
        subprocess.run(["/etc/kernel/postinst.d/dkms", later], check=True, capture_output=True)
        assert _installed_module(later, "kml_radeb") is not None
        # the module DKMS built for 6.1 loads in 6.1: self-test and hook scenario
        # (3 reload cycles: the hook's own boots run the long loops)
        k61 = next(k for k in kernels if k.startswith("6.1.") and k.endswith("-amd64")
                   and "-rt-" not in k)
        ko61 = tmp_path / "kml_radeb.ko"
        ko61.write_bytes(_installed_module(k61, "kml_radeb"))
        boot = qemu.run([out], kdir=f"/lib/modules/{k61}/build", modules={out: ko61}, cycles=3)
        assert boot["ok"], "\n".join(boot["lines"])
        assert any(ln.startswith("kml_radeb: PASS") for ln in boot["lines"]), boot["lines"]
        assert any(ln.startswith("kml_radeb-") and ": PASS" in ln
                   for ln in boot["lines"]), boot["lines"]
        # the twin package is the compiled twin
        x = cal[:64]
        assert np.array_equal(load("/usr/lib/kmlc/radeb").run(x), load(out).run(x))
    finally:
        _dpkg("-r", "kml-radeb-dkms", "kml-radeb-twin", check=False)
    for pkg in ("kml-radeb-dkms", "kml-radeb-twin"):
        assert "install ok installed" not in _dpkg("-s", pkg, check=False).stdout
    assert not Path("/usr/src/kml-radeb-3.0").exists()
    assert not Path("/var/lib/dkms/kml-radeb").exists()
    assert not Path("/usr/lib/kmlc/radeb").exists()
    assert not list(Path("/lib/modules").glob("*/updates/dkms/kml_radeb.ko*"))
    for k in kernels:
        dep = Path("/lib/modules") / k / "modules.dep"
        assert not dep.is_file() or "kml_radeb" not in dep.read_text()


@pytest.mark.kernel
def test_a_kernel_the_build_fails_for_is_named_and_upgrades_and_others_are_left_alone(tmp_path):
    """dpkg -i of the DKMS package while one installed kernel's build fails
    (6.12's, made to fail in the Kbuild, as a kernel whose API moved
    would): the package still installs, names that kernel and its build
    log, installs the module for every other kernel, and `dpkg -r` removes
    it from all of them.  Beside another kmlc package, which neither its
    upgrade nor its removal touches; upgraded in place (`dpkg -i` of a
    retrained model's 1.1, here compiled in fixed point): DKMS then holds
    1.1 alone and the kernels run its module."""
    if not shutil.which("dkms") or os.geteuid() != 0:
        pytest.fail("this test installs packages: it needs root and dkms (the README's setup "
                    "installs dkms)")

    def package(name, version, **options):
        out = tmp_path / f"{name}-{version}"
        kcompile(mlp_model([4, 8, 2]), out, name=name, targets="kernel", **options)
        if name == "pkfail":
            kbuild = out / "kernel" / "Kbuild"
            kbuild.write_text("ifneq ($(filter 6.12.%,$(KERNELRELEASE)),)\n"
                              "$(error kml_pkfail: this build fails on 6.12, on purpose)\n"
                              "endif\n" + kbuild.read_text())
        res = kmlc_cli("package", out, "--deb", "-o", tmp_path / "dist", "--version", version)
        assert res.returncode == 0, res.stderr
        return tmp_path / "dist" / f"kml-{name}-dkms_{version}_all.deb"

    def description(kernel, module):
        ko = tmp_path / f"{module}.ko"
        ko.write_bytes(_installed_module(kernel, module))
        return subprocess.run(["modinfo", "-F", "description", ko], capture_output=True,
                              text=True, check=True).stdout.strip()

    rows = np.random.default_rng(3).normal(size=(256, 4)).astype(np.float32)
    debs = [package("pkfail", "1.0"), package("pkother", "1.0"),
            package("pkfail", "1.1", numerics="fixed", calibration=rows)]
    kernels = [release_of(k) for k in installed_headers()]
    failing = [k for k in kernels if k.startswith("6.12.")]
    assert failing and len(failing) < len(kernels), kernels
    try:
        r = _dpkg("-i", debs[0])     # exit 0
        assert "install ok installed" in _dpkg("-s", "kml-pkfail-dkms").stdout
        for k in kernels:
            if k in failing:
                assert (f"kml-pkfail: the build for {k} failed (exit" in r.stderr
                        and "/var/lib/dkms/kml-pkfail/1.0/build/make.log" in r.stderr), r.stderr
                assert _installed_module(k, "kml_pkfail") is None, k
            else:
                assert f"kml-pkfail: built and installed for {k}" in r.stdout, r.stdout
                assert description(k, "kml_pkfail") == "kmlc model pkfail (float)", k
        _dpkg("-i", debs[1])
        assert all(_installed_module(k, "kml_pkother") is not None for k in kernels)
        # the upgrade: the old version's prerm takes 1.0 out of DKMS, the
        # new postinst builds 1.1 (fixed point) for the same kernels
        r = _dpkg("-i", debs[2])
        assert "\nVersion: 1.1\n" in _dpkg("-s", "kml-pkfail-dkms").stdout
        st = subprocess.run(["dkms", "status", "-m", "kml-pkfail"], capture_output=True,
                            text=True).stdout
        assert "kml-pkfail/1.1," in st and "kml-pkfail/1.0" not in st, st
        assert not Path("/usr/src/kml-pkfail-1.0").exists()
        assert not Path("/var/lib/dkms/kml-pkfail/1.0").exists()
        for k in kernels:
            if k in failing:
                assert f"kml-pkfail: the build for {k} failed (exit" in r.stderr, r.stderr
                assert _installed_module(k, "kml_pkfail") is None, k
            else:
                assert description(k, "kml_pkfail") == "kmlc model pkfail (fixed)", k
            assert description(k, "kml_pkother") == "kmlc model pkother (float)", k
        _dpkg("-r", "kml-pkfail-dkms")
        # the other package's module is still installed, and known to depmod
        for k in kernels:
            assert _installed_module(k, "kml_pkother") is not None, k
            assert "kml_pkother" in (Path("/lib/modules") / k / "modules.dep").read_text(), k
    finally:
        _dpkg("-r", "kml-pkfail-dkms", "kml-pkother-dkms", check=False)
    assert not Path("/var/lib/dkms/kml-pkother").exists()
    assert not list(Path("/lib/modules").glob("*/updates/dkms/kml_pkother.ko*"))
    assert "install ok installed" not in _dpkg("-s", "kml-pkfail-dkms", check=False).stdout
    assert not list(Path("/usr/src").glob("kml-pk*"))
    assert not Path("/var/lib/dkms/kml-pkfail").exists()
    assert not list(Path("/lib/modules").glob("*/updates/dkms/kml_pkfail.ko*"))
