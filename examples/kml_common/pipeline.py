"""The plumbing of the examples' one-command pipelines (run.py): one-line
errors, the kmlc command line, worker processes, the machine's description,
and the README's results block."""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Fail(Exception):
    """A pipeline step failed: run.py prints it as one line and exits 1."""


class Parser(argparse.ArgumentParser):
    def error(self, message):            # one line, no usage dump
        print(f"run.py: {message}", file=sys.stderr)
        sys.exit(2)


def missing_packages(extra=()) -> str | None:
    """The first Python package the examples need that is not installed, as
    a message, or None."""
    for mod, why in (("kmlc", "pip install -e . (the README's setup)"),
                     ("torch", "pip install torch onnx"), ("onnx", "pip install onnx"),
                     ("matplotlib", "pip install matplotlib"), *extra):
        if importlib.util.find_spec(mod) is None:
            return f"this example needs the Python package {mod} ({why})"
    return None


def rel(p) -> str:
    p = Path(p)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def kmlc(*args) -> dict:
    """Runs the kmlc command line next to this Python, from the repository's
    root; returns the command and its output."""
    exe = Path(sys.executable).parent / "kmlc"
    args = [rel(a) if isinstance(a, Path) else str(a) for a in args]
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=ROOT)
    cmd = "kmlc " + " ".join(args)
    if res.returncode:
        raise Fail(f"{cmd}: {(res.stderr or res.stdout).strip()}")
    return {"command": cmd, "output": res.stdout.strip()}


def pool(jobs: int):
    """A fork pool of ``jobs`` workers (None for one job); make it before
    torch starts any thread."""
    if jobs <= 1:
        return None
    import multiprocessing as mp
    return mp.get_context("fork").Pool(jobs)


def have_headers() -> bool:
    from kmlc.targets.kernel import find_kdir

    try:
        find_kdir()
        return True
    except Exception:
        return False


def machine() -> str:
    osname = platform.system()
    try:
        for ln in Path("/etc/os-release").read_text().splitlines():
            if ln.startswith("PRETTY_NAME="):
                osname = ln.split("=", 1)[1].strip('"')
    except OSError:
        pass
    cpu = "unknown CPU"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{osname}, kernel {platform.release()}, {os.cpu_count()} CPUs ({cpu})"


def update_readme(readme: Path, md: str) -> None:
    """Puts ``md`` between the README's results markers."""
    if not readme.is_file():
        return
    text = readme.read_text()
    new = re.sub(r"(<!-- results:begin -->\n).*?(<!-- results:end -->)",
                 lambda m: m.group(1) + md + m.group(2), text, flags=re.S)
    readme.write_text(new)
