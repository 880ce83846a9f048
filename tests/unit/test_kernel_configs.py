"""The kernels kmlc builds get the configuration asked for: Kconfig drops
an option a dependency rules out, and keeps on an option something selects
or that has no prompt, both silently; the debug kernel's build checks its
.config against DEBUG_CONFIG both ways before compiling."""
import pytest

from kmlc.errors import KmlcError
from kmlc.targets.kernels import DEBUG_CONFIG, _check_config
from kmlc.targets.kunit import ARCH_BUILD

WANTED = [ln for ln in DEBUG_CONFIG.splitlines() if ln.startswith("CONFIG_")]


def test_the_configuration_asked_for_passes(tmp_path):
    cfg = tmp_path / ".config"
    cfg.write_text("\n".join(WANTED + ["# CONFIG_LOCALVERSION_AUTO is not set", "CONFIG_NET=y"]) + "\n")
    _check_config(cfg)


@pytest.mark.parametrize("change", ["dropped", "kept on"])
def test_an_option_kconfig_changed_is_named(tmp_path, change):
    cfg = tmp_path / ".config"
    if change == "dropped":       # a dependency ruled KASAN out
        lines = [ln for ln in WANTED if ln != "CONFIG_KASAN=y"]
        named = "CONFIG_KASAN=y"
    else:                         # something selected it back on
        lines = WANTED + ["CONFIG_LOCALVERSION_AUTO=y"]
        named = "CONFIG_LOCALVERSION_AUTO off"
    cfg.write_text("\n".join(lines) + "\n")
    with pytest.raises(KmlcError) as e:
        _check_config(cfg)
    assert named in str(e.value)


def test_x86_64_kunit_runs_in_the_debug_kernel():
    assert "CONFIG_KUNIT=y" in WANTED
    assert "x86_64" not in ARCH_BUILD       # no kernel of its own: one build fewer


@pytest.mark.parametrize("name, config", [("linux-headers-6.12.1+deb12-amd64", True),
                                          ("linux-headers-6.1.0-9-amd64", False)])
def test_a_clang_tree_is_refused_for_headers_it_cannot_be_made_from(tmp_path, name, config):
    """kmlc prepares x86_64's clang tree from the cached 6.1 source with the
    headers' configuration: other kernels' headers, or headers without a
    configuration, are named in the refusal (before anything is unpacked)."""
    from kmlc.targets.kernel import clang_tree

    headers = tmp_path / name
    headers.mkdir()
    if config:
        (headers / ".config").write_text("CONFIG_64BIT=y\n")
    with pytest.raises(KmlcError) as e:
        clang_tree(headers=headers)
    assert str(headers) in str(e.value) and "--kdir" in str(e.value)


def test_only_the_clang_built_kunit_kernel_needs_clang(monkeypatch):
    """x86_64's suites are modules of the gcc-built debug kernel: a machine
    without clang runs them; arm64's kernel is built with clang, and its
    run is refused with one line naming the program and its package."""
    import shutil

    from kmlc.targets import kunit

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda t: None if t == "clang" else real(t))
    monkeypatch.setattr(kunit, "_run_as_modules", lambda *a, **k: "ran")
    assert kunit.run([], arch="x86_64") == "ran"
    with pytest.raises(KmlcError, match=r"clang is not installed \(package clang\)"):
        kunit.run([], arch="arm64")


@pytest.mark.parametrize("tool, package", [("bison", "bison"), ("depmod", "kmod")])
def test_the_debug_kernel_names_a_missing_build_tool_and_its_package(monkeypatch, tool, package):
    """Building the debug kernel needs Kbuild's tools and depmod: a missing
    one is named with its Debian package before anything is unpacked."""
    import shutil

    from kmlc.targets import kernels

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda t: None if t == tool else real(t))
    monkeypatch.setattr(kernels, "source_tree", lambda **k: pytest.fail("unpacked"))
    with pytest.raises(KmlcError, match=rf"^{tool} is not installed \(package {package}\)"):
        kernels.debug_kernel()
