"""Hook modules' qemu scenarios (none yet: the model's own self-test runs)."""
from __future__ import annotations

from pathlib import Path


def scenarios(outdir: Path, kdir: Path) -> list:
    return []
