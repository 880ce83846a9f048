"""User target: the twin as a shared library, and its Python binding.

The twin is built from the same ``<name>.c`` and ``<name>_fp.c`` as the
kernel module, with the same determinism flags (docs/numerics.md), plus
``<name>_twin.c`` for batch calls.  ``Twin`` loads it with ctypes.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import KmlcError

# Flags every twin build uses: the determinism contract, and warnings as the
# kernel would show them.  The generated Makefile repeats them.
CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-ffp-contract=off", "-fno-fast-math",
          "-fno-strict-aliasing", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wframe-larger-than=512"]


def find_cc(cc: str | None = None) -> str:
    for cand in ([cc] if cc else [os.environ.get("CC"), "cc", "gcc", "clang"]):
        if cand and shutil.which(cand):
            return cand
    raise KmlcError(f"no C compiler found ({cc or 'cc, gcc or clang'}); install gcc "
                    "(the README's setup command does)")


def sources(name: str) -> list[str]:
    return [f"{name}.c", f"{name}_fp.c", f"{name}_twin.c"]


def build_twin(userdir: Path, name: str, *, cc: str | None = None, extra=(),
               out: Path | None = None) -> Path:
    """Compile ``userdir``'s sources into ``lib kml_<name>.so``; a warning is a
    kmlc bug and fails the build like an error does."""
    cc = find_cc(cc)
    so = Path(out or userdir / f"libkml_{name}.so").resolve()
    cmd = [cc, *CFLAGS, *extra, "-shared", "-o", str(so), *sources(name)]
    res = subprocess.run(cmd, cwd=userdir, capture_output=True, text=True)
    if res.returncode != 0 or res.stderr.strip():
        what = "failed" if res.returncode else "warned"
        raise KmlcError(f"building the twin with {cc} {what} (a kmlc bug; please report):\n"
                        + res.stderr.strip())
    return so


class Twin:
    """A compiled model's userspace twin, callable from Python.

    ``run(X)`` maps float32 rows of ``in_elems`` inputs to rows of
    ``out_elems`` outputs, bit-identical to the kernel module.  One ``Twin``
    owns one workspace, so use one per thread.
    """

    def __init__(self, outdir, so: Path | None = None):
        outdir = Path(outdir)
        manifest = outdir / "kmlc.json"
        if not manifest.is_file():
            raise KmlcError("not a kmlc output directory (no kmlc.json)", where=str(outdir))
        self.meta = json.loads(manifest.read_text())
        self.name = self.meta["name"]
        self.in_elems = self.meta["in_elems"]
        self.out_elems = self.meta["out_elems"]
        so = so or outdir / "user" / f"libkml_{self.name}.so"
        if not so.is_file():
            raise KmlcError("no twin library here; compile with --target user (or all)",
                            where=str(so))
        # dlopen caches by path: load a private copy so a recompiled twin is seen.
        fd, tmp = tempfile.mkstemp(suffix=".so", prefix=f"kml_{self.name}_")
        os.close(fd)
        try:
            shutil.copyfile(so, tmp)
            self.lib = ctypes.CDLL(tmp)
        finally:
            os.unlink(tmp)
        p = ctypes.c_void_p
        self._batch = getattr(self.lib, f"kml_{self.name}_infer_batch")
        self._batch.argtypes = [p, p, ctypes.c_ulong, p]
        self._batch.restype = ctypes.c_int
        words = max(self.meta["workspace_bytes"], 8) // 8 + 1
        self._workspace = np.zeros(words, dtype=np.uint64)  # 8-byte aligned

    def run(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim == 1:
            return self.run(x[None, :])[0]
        if x.ndim != 2 or x.shape[1] != self.in_elems:
            raise KmlcError(f"input has shape {tuple(x.shape)}; the model takes rows of "
                            f"{self.in_elems} float32 values")
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty((x.shape[0], self.out_elems), dtype=np.float32)
        ret = self._batch(x.ctypes.data, y.ctypes.data, x.shape[0], self._workspace.ctypes.data)
        if ret:
            raise KmlcError(f"kml_{self.name}_infer returned {ret}")
        return y

    __call__ = run
