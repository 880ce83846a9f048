"""The kernels kmlc builds get the configuration asked for: Kconfig drops
an option a dependency rules out, and keeps on an option something selects
or that has no prompt, both silently; the debug kernel's build checks its
.config against DEBUG_CONFIG both ways before compiling."""
import pytest

from kmlc.errors import KmlcError
from kmlc.targets.kernels import DEBUG_CONFIG, _check_config
from kmlc.targets.kunit import ARCH_BUILD, GUEST_TRIM

WANTED = [ln for ln in DEBUG_CONFIG.splitlines() if ln.startswith("CONFIG_")]


def test_the_configuration_asked_for_passes(tmp_path):
    cfg = tmp_path / ".config"
    cfg.write_text("\n".join(WANTED + ["# CONFIG_IPV6 is not set", "CONFIG_NET=y"]) + "\n")
    _check_config(cfg)


@pytest.mark.parametrize("change", ["dropped", "kept on"])
def test_an_option_kconfig_changed_is_named(tmp_path, change):
    cfg = tmp_path / ".config"
    if change == "dropped":       # a dependency ruled KASAN out
        lines = [ln for ln in WANTED if ln != "CONFIG_KASAN=y"]
        named = "CONFIG_KASAN=y"
    else:                         # something selected ACPI back on
        lines = WANTED + ["CONFIG_ACPI=y"]
        named = "CONFIG_ACPI off"
    cfg.write_text("\n".join(lines) + "\n")
    with pytest.raises(KmlcError) as e:
        _check_config(cfg)
    assert named in str(e.value)


def test_guest_trim_is_in_the_debug_and_arm64_kernels_only():
    assert GUEST_TRIM in DEBUG_CONFIG and "# CONFIG_ACPI is not set" in GUEST_TRIM
    assert GUEST_TRIM in ARCH_BUILD["arm64"][2]
    assert "x86_64" not in ARCH_BUILD       # x86_64's suites run in the debug kernel
