"""User target: the twin as a shared library, and its Python binding.

The twin is built from the same ``<name>.c`` and ``<name>_fp.c`` (or, for
fixed point, ``<name>_fx.c``) as the
kernel module, with the same determinism flags (docs/numerics.md), plus
``<name>_twin.c`` for batch calls.  ``Twin`` loads it with ctypes.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import KmlcError
from ..passes.quantize import encode_rows

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


def sources(userdir: Path, name: str) -> list[str]:
    """Entry point, the model's math (<name>_fp.c float or <name>_fx.c
    fixed), the twin's batch entry, and a hook's twin C (kml_*_twin.c)."""
    core = [f"{name}_{c}.c" for c in ("fp", "fx") if (userdir / f"{name}_{c}.c").is_file()]
    hook = sorted(p.name for p in Path(userdir).glob("kml_*_twin.c")
                  if p.name != f"{name}_twin.c")      # a model may be named kml_*
    return [f"{name}.c", *core, f"{name}_twin.c", *hook]


def build_twin(userdir: Path, name: str, *, cc: str | None = None, extra=(),
               out: Path | None = None) -> Path:
    """Compile ``userdir``'s sources into ``lib kml_<name>.so``; a warning is a
    kmlc bug and fails the build like an error does."""
    cc = find_cc(cc)
    so = Path(out or userdir / f"libkml_{name}.so").resolve()
    cmd = [cc, *CFLAGS, *extra, "-shared", "-o", str(so), *sources(userdir, name)]
    res = subprocess.run(cmd, cwd=userdir, capture_output=True, text=True)
    if res.returncode != 0 or res.stderr.strip():
        what = "failed" if res.returncode else "warned"
        diag = [ln for ln in res.stderr.splitlines() if "error:" in ln or "warning:" in ln]
        first = (diag or res.stderr.strip().splitlines() or ["no output"])[0].strip()
        raise KmlcError(f"building the twin with {cc} {what}: {first} (a kmlc bug; please "
                        "report)", details=res.stderr.strip())
    return so


SIZE_KEYS = ("in_elems", "out_elems", "workspace_bytes", "fixed")


def read_manifest(outdir: Path) -> dict:
    """OUTDIR/kmlc.json, checked for the fields the twin reads: one clear
    error for a missing, unreadable, malformed or incomplete file."""
    manifest = outdir / "kmlc.json"
    if not manifest.is_file():
        raise KmlcError("not a kmlc output directory (no kmlc.json)", where=str(outdir))
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise KmlcError(f"cannot be read ({' '.join(str(e).split())}); recompile the model",
                        where=str(manifest)) from None
    want = {"name": str, "in_elems": int, "out_elems": int, "workspace_bytes": int,
            "outputs": list}
    bad = [k for k, t in want.items() if not isinstance(meta, dict) or not isinstance(
        meta.get(k), t) or isinstance(meta.get(k), bool)]
    if bad:
        raise KmlcError(f"lacks a valid '{bad[0]}'; recompile the model", where=str(manifest))
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", meta["name"]):
        raise KmlcError(f"names the model '{meta['name']}', not a kmlc model name",
                        where=str(manifest))
    return meta


class Twin:
    """A compiled model's userspace twin, callable from Python.

    ``run(X)`` maps float32 rows of ``in_elems`` inputs to rows of
    ``out_elems`` outputs, bit-identical to the kernel module.  One ``Twin``
    owns one workspace, so use one per thread.
    """

    def __init__(self, outdir, so: Path | None = None):
        outdir = Path(outdir)
        self.meta = read_manifest(outdir)
        self.name = self.meta["name"]
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
            self._batch = getattr(self.lib, f"kml_{self.name}_infer_batch")
            sizes = list((ctypes.c_ulong * 4).in_dll(self.lib, "kml_twin_sizes"))
        except (OSError, AttributeError, ValueError) as e:
            why = " ".join(str(e).replace(tmp, so.name).split())
            raise KmlcError(f"not a twin library kmlc can load ({why}); "
                            "recompile the model", where=str(so)) from None
        finally:
            os.unlink(tmp)
        # Buffer sizes come from the library itself; kmlc.json must agree.
        said = [self.meta["in_elems"], self.meta["out_elems"], self.meta["workspace_bytes"],
                int(bool(self.meta.get("fixed")))]
        for key, lib_value, json_value in zip(SIZE_KEYS, sizes, said):
            if lib_value != json_value:
                raise KmlcError(f"kmlc.json says {key} = {json_value} but the twin library was "
                                f"compiled with {lib_value}; recompile rather than edit",
                                where=str(outdir / "kmlc.json"))
        self.in_elems, self.out_elems, workspace = sizes[:3]
        try:
            elems = sum(int(port["elems"]) for port in self.meta["outputs"])
            frac = self.fixed["frac_bits"] if self.fixed else [0] * self.in_elems
            consistent = elems == self.out_elems and len(frac) == self.in_elems and (
                not self.fixed or len(self.fixed["outputs"]) == len(self.meta["outputs"]))
        except (KeyError, TypeError, ValueError):
            consistent = False
        if not consistent:
            raise KmlcError("describes outputs or input encodings that do not match the twin "
                            "library; recompile rather than edit", where=str(outdir / "kmlc.json"))
        p = ctypes.c_void_p
        self._batch.argtypes = [p, p, ctypes.c_ulong, p]
        self._batch.restype = ctypes.c_int
        words = max(workspace, 8) // 8 + 1
        self._workspace = np.zeros(words, dtype=np.uint64)  # 8-byte aligned

    @property
    def fixed(self) -> dict | None:
        """The fixed-point interface (kmlc.json), or None for a float model."""
        return self.meta.get("fixed")

    def encode(self, x) -> np.ndarray:
        """Float feature rows as the model's raw input: unchanged float32 for
        a float model; for a fixed model in[i] = round(x_i * 2^F_i), ties away
        from zero, saturated to int32 (the module then clamps to the
        calibrated range itself)."""
        x = self._rows(x)
        if not self.fixed:
            return x.astype(np.float32)
        bad = ~np.isfinite(x.astype(np.float64))
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise KmlcError(f"input row {r} holds {x[r, c]} (column {c}); a fixed-point model "
                            "takes finite values only")
        return encode_rows(x, self.fixed["frac_bits"])

    def decode(self, q: np.ndarray) -> np.ndarray:
        """Raw outputs as float32 rows: real = (q - zero_point) * scale per
        output; class indices as exact floats."""
        if not self.fixed:
            return q
        y = np.empty(q.shape, dtype=np.float64)
        off = 0
        for o, port in zip(self.fixed["outputs"], self.meta["outputs"]):
            sl = slice(off, off + port["elems"])
            y[:, sl] = q[:, sl] if o.get("index") else (q[:, sl] - o["zp"]) * o["scale"]
            off += port["elems"]
        return y.astype(np.float32)

    def _rows(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.in_elems:
            raise KmlcError(f"input has shape {tuple(x.shape)}; the model takes rows of "
                            f"{self.in_elems} values")
        return x

    def run_raw(self, x) -> np.ndarray:
        """The C entry point on raw rows (float32, or int32 for fixed)."""
        dtype = np.int32 if self.fixed else np.float32
        x = np.ascontiguousarray(self._rows(x), dtype=dtype)
        y = np.empty((x.shape[0], self.out_elems), dtype=dtype)
        ret = self._batch(x.ctypes.data, y.ctypes.data, x.shape[0], self._workspace.ctypes.data)
        if ret:
            raise KmlcError(f"kml_{self.name}_infer returned {ret}")
        return y

    # ---- a hook's replay and decision (kmlc.hooks) ------------------------------------

    def _hook(self):
        from ..hooks import owner

        self._need_hook()
        return owner(self.meta["hooks"][0])

    def _buf(self) -> np.ndarray:
        """The caller-owned buffer of the hook's decisions (struct kml_model_buf)."""
        if not hasattr(self, "_hook_buf"):
            size = ctypes.c_ulong.in_dll(self.lib, "kml_twin_buf_size").value
            self._hook_buf = np.zeros(size // 8 + 1, dtype=np.uint64)
        return self._hook_buf

    def call_replay(self, ev: np.ndarray, windows: int, per: int, decisions: int,
                    out_cols: int):
        """kml_twin_replay (runtime-user/kml_<stem>_twin.c) on int64 trace
        rows ``ev``: the features of up to ``windows`` windows (``per``
        values each; as many as it returns) and ``decisions`` decisions of
        ``out_cols`` values."""
        fn = self.lib.kml_twin_replay
        p = ctypes.c_void_p
        fn.argtypes, fn.restype = [p, ctypes.c_ulong, p, p, p], ctypes.c_long
        ev = np.ascontiguousarray(ev, dtype=np.int64)
        feats = np.zeros((windows, per), dtype=np.int32)
        out = np.zeros((decisions, out_cols) if out_cols > 1 else decisions, dtype=np.int32)
        n = fn(ev.ctypes.data, len(ev), feats.ctypes.data, out.ctypes.data,
               self._buf().ctypes.data)
        if n < 0:
            raise KmlcError(f"kml_twin_replay returned {n}")
        return feats[:n], out

    def replay(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """Trace rows, in the layout of the model's hook (kmlc.hooks), through
        the hook's own feature code and decision: (features, decisions)."""
        return self._hook().replay_rows(self, rows)

    def replay_trace(self, text: str):
        """The module's trace (the text of /sys/kernel/tracing/trace) replayed
        through the twin: a kmlc.hooks.base.Replay, module beside twin."""
        return self._hook().replay(self, text)

    @property
    def hook_frac(self) -> np.ndarray:
        """The fraction bits the model's hook encodes each feature with
        (``kmlc.features`` takes them as ``frac``)."""
        self._need_hook()
        fn = self.lib.kml_twin_frac
        fn.restype = ctypes.POINTER(ctypes.c_uint8)
        return np.ctypeslib.as_array(fn(), (self.in_elems,)).copy()

    def decide(self, features) -> np.ndarray:
        """The hook's decision for rows of encoded features (as
        ``kmlc.features`` computes them with ``frac=twin.hook_frac``), by the
        module's own decision code: admission 1 (decline) or 0, readahead
        the class."""
        self._need_hook()
        f = np.ascontiguousarray(features, dtype=np.int32).reshape(-1, self.in_elems)
        out = np.zeros(len(f), dtype=np.int32)
        fn = self.lib.kml_twin_decide
        fn.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p]
        ret = fn(f.ctypes.data, len(f), out.ctypes.data, self._buf().ctypes.data)
        if ret:
            raise KmlcError(f"kml_twin_decide returned {ret}")
        return out

    def _need_hook(self) -> None:
        if not self.meta.get("hooks"):
            raise KmlcError(f"{self.name} was compiled without --hooks")

    def run(self, x) -> np.ndarray:
        """Float rows in, float rows out, through exactly the module's path."""
        x = np.asarray(x)
        if x.ndim == 1:
            return self.run(x[None, :])[0]
        return self.decode(self.run_raw(self.encode(x)))

    __call__ = run
