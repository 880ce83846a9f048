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

from ..schedule import SIMD_ISAS
from ..errors import KmlcError
from . import buildcache
from ..passes.quantize import encode_rows

# Flags every twin build uses: the determinism contract, and warnings as the
# kernel would show them.  The generated Makefile repeats them.
CFLAGS = ["-std=gnu11", "-O2", "-fPIC", "-ffp-contract=off", "-fno-fast-math",
          "-fno-strict-aliasing", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wframe-larger-than=512"]
# Fixed-point twins: no auto-vectorization, so that the scalar path is the
# kernel's (whose integer code has no vector registers) in speed and stack;
# the SIMD paths are explicit (kml_simd.h).
FIXED_CFLAGS = ["-fno-tree-vectorize", "-fno-tree-slp-vectorize"]


def cflags(fixed: bool) -> list[str]:
    return CFLAGS + (FIXED_CFLAGS if fixed else [])


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
    fixed = (Path(userdir) / f"{name}_fx.c").is_file()
    cmd = [cc, *cflags(fixed), *extra, "-shared", "-o", str(so), *sources(userdir, name)]
    _compile(cmd, userdir, f"the twin with {cc}")
    return so


def _compile(cmd: list[str], cwd: Path, what: str) -> None:
    """Runs a twin's compiler command; an error or a warning is a kmlc bug
    and raises, naming the first diagnostic."""
    rc, err = buildcache.compile_twin(
        cmd, cwd, lambda c: subprocess.run(c, cwd=cwd, capture_output=True, text=True))
    if rc != 0 or err.strip():
        diag = [ln for ln in err.splitlines() if "error:" in ln or "warning:" in ln]
        first = (diag or err.strip().splitlines() or ["no output"])[0].strip()
        raise KmlcError(f"building {what} {'failed' if rc else 'warned'}: {first} "
                        "(a kmlc bug; please report)", details=err.strip())


# Architectures a twin is built for besides this machine's: the cross
# compiler, the qemu-user that runs its program, the program's suffix.
FOREIGN = {"arm64": ("aarch64-linux-gnu-gcc", "qemu-aarch64", "aarch64")}


def build_runner(outdir: Path, arch: str) -> Path:
    """OUTDIR/user/kml_<name>_run.<arch>: the twin's sources and
    runtime-user/kml_run.c as a static program for ``arch``, built with
    the twin's flags (a warning fails it), and rebuilt when a source is
    newer."""
    from .. import runtime_user

    if arch not in FOREIGN:
        raise KmlcError(f"no twin for --arch {arch}; choose from {', '.join(FOREIGN)}")
    cc, emu, suffix = FOREIGN[arch]
    for tool, pkg in ((cc, "gcc-aarch64-linux-gnu"), (emu, "qemu-user")):
        if not shutil.which(tool):
            raise KmlcError(f"{tool} is not installed (Debian's {pkg}; the README's setup "
                            "installs it)")
    name = read_manifest(outdir)["name"]
    userdir = Path(outdir) / "user"
    if not (userdir / f"{name}_twin.c").is_file():
        raise KmlcError("no twin sources here; compile with --target user (or all)",
                        where=str(userdir))
    exe = userdir / f"kml_{name}_run.{suffix}"
    srcs = [userdir / f for f in sources(userdir, name)] + [runtime_user.DIR / "kml_run.c"]
    deps = srcs + list(userdir.glob("*.h"))
    if exe.is_file() and all(exe.stat().st_mtime >= d.stat().st_mtime for d in deps):
        return exe
    fixed = (userdir / f"{name}_fx.c").is_file()
    flags = [f for f in cflags(fixed) if f != "-fPIC"]
    tmp = exe.with_name(exe.name + ".tmp")
    cmd = [cc, *flags, "-static", f"-DKML_INFER_BATCH=kml_{name}_infer_batch", "-I",
           str(userdir), "-o", str(tmp), *map(str, srcs)]
    try:
        _compile(cmd, userdir, f"the {arch} twin with {cc}")
    except KmlcError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, exe)
    return exe


SIZE_KEYS = ("in_elems", "out_elems", "workspace_bytes", "fixed", "in_dtype", "out_dtype")
# Element types of in[] and out[] (kmlc.json's in_dtype, out_dtype), and
# the bytes the twin library says one element has.
IO_DTYPES = {"f32": np.float32, "i32": np.int32, "i64": np.int64, "bool": np.bool_}


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
            "inputs": list, "outputs": list}
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

    def __init__(self, outdir, so: Path | None = None, weights=None):
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
            sizes = list((ctypes.c_ulong * 7).in_dll(self.lib, "kml_twin_sizes"))
            self._structure = bytes((ctypes.c_ubyte * 32).in_dll(self.lib, "kml_twin_structure"))
        except (OSError, AttributeError, ValueError) as e:
            why = " ".join(str(e).replace(tmp, so.name).split())
            raise KmlcError(f"not a twin library kmlc can load ({why}); "
                            "recompile the model", where=str(so)) from None
        finally:
            os.unlink(tmp)
        # Buffer sizes come from the library itself; kmlc.json must agree.
        self.in_dtype, self.out_dtype = (np.dtype(IO_DTYPES.get(self.meta.get(k), np.void))
                                         for k in ("in_dtype", "out_dtype"))
        said = [self.meta["in_elems"], self.meta["out_elems"], self.meta["workspace_bytes"],
                int(bool(self.meta.get("fixed"))), self.in_dtype.itemsize,
                self.out_dtype.itemsize]
        for key, lib_value, json_value in zip(SIZE_KEYS, sizes, said):
            if lib_value != json_value:
                if key.endswith("dtype"):
                    json_value, lib_value = self.meta.get(key), f"{lib_value}-byte elements"
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
        self._batch.argtypes = [p, p, p, ctypes.c_ulong, p, p]
        self.weight_bytes = sizes[6]
        self._weights = None                       # the set's image, None: built-in
        self.weights_version = None
        # each publish (a set loaded, or the built-in one again) is a new
        # generation, as each write to the module's weights or rollback is
        self.weights_generation = 0
        self._refs: list[np.ndarray] = []
        if weights is not None:
            self.load_weights(weights)
        self.saturations = 0                       # values saturated, over every run
        self.last_saturations = np.zeros(0, np.uint32)  # per row of the last run
        self._batch.restype = ctypes.c_int
        words = max(workspace, 8) // 8 + 1
        self._workspace = np.zeros(words, dtype=np.uint64)  # 8-byte aligned

    def load_weights(self, weights) -> None:
        """Run on the weight set in ``weights`` (a ``.kmlw`` blob's path or
        bytes, from ``kmlc pack``) instead of the built-in one; None goes
        back to the built-in set.  Either publishes a new generation
        (``weights_generation``; the hook's guards judge the set afresh,
        docs/hooks.md).  A blob for another structure, truncated or
        corrupted is refused and the current set (and generation) stays."""
        if weights is None:
            self._weights, self.weights_version = None, None
            self._publish()
            return
        what = "weights blob"
        if not isinstance(weights, (bytes, bytearray)):
            what = str(weights)
            try:
                weights = Path(weights).read_bytes()
            except OSError as e:
                raise KmlcError(f"cannot read the weight set: {e.strerror}", where=what) from None
        self._weights, self.weights_version = self.check_set(bytes(weights), what)
        self._publish()

    def _publish(self) -> None:
        """Points the library's kml_<name>_current at a struct kml_set_ref
        (kml_weights.h) holding the loaded set (NULL: the built-in one) and
        a new generation, as the module's weights attribute publishes one:
        every entry point that reads the current set (the hooks' decide and
        replay, kml_<name>_infer) then runs on it."""
        self.weights_generation += 1
        ref = np.array([0 if self._weights is None else self._weights.ctypes.data,
                        self.weights_generation], dtype=np.uint64)
        cur = ctypes.c_void_p.in_dll(self.lib, f"kml_{self.name}_current")
        cur.value = ref.ctypes.data
        self._refs = [ref]          # what the library points at stays alive

    def check_set(self, blob: bytes, what: str = "weights blob") -> tuple[np.ndarray, int]:
        """The weight set in ``blob`` (8-byte aligned words holding the
        struct) and its version, as the model's own C validates it
        (kml_weights.h: the module runs the same code); a refused blob
        raises KmlcError with its one-line reason."""
        fn = getattr(self.lib, f"kml_{self.name}_check_set", None)
        if fn is None:
            raise KmlcError("this twin library predates weight-set checks; recompile the model",
                            where=what)
        p = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_ulong, p, p, p, p]
        fn.restype = ctypes.c_int
        buf = np.zeros(self.weight_bytes // 8 + 1, np.uint64)   # aligned as the struct
        version, why, layer = ctypes.c_uint32(), ctypes.c_char_p(), ctypes.c_char_p()
        if fn(blob, len(blob), buf.ctypes.data, ctypes.byref(version), ctypes.byref(why),
              ctypes.byref(layer)):
            node = f" (layer {layer.value.decode(errors='replace')})" if layer.value else ""
            raise KmlcError(f"{what}: refused: {why.value.decode()}{node}")
        return buf, version.value

    # The paths of a fixed-point model (kml_simd.h), in enum kml_path's order
    PATHS = ("scalar", *SIMD_ISAS)

    def _path_fn(self, what: str):
        fn = getattr(self.lib, f"kml_{self.name}_{what}", None)
        if fn is None:
            raise KmlcError(f"model '{self.name}' has no SIMD paths (only fixed-point models "
                            "with dense layers summed in int32 do)")
        return fn

    @property
    def paths(self) -> list[str]:
        """The paths this model has and this CPU runs, scalar first."""
        fn = getattr(self.lib, f"kml_{self.name}_set_path", None)
        if fn is None:
            return ["scalar"]
        ok = [p for i, p in enumerate(self.PATHS) if fn(i) == 0]
        fn(-1 if self._forced is None else self.PATHS.index(self._forced))  # as it was
        return ok

    _forced = None

    def set_path(self, path: str | None) -> None:
        """Force a path ("scalar", "sse2", "avx2"), or None for the best the
        CPU has; a path the CPU lacks is an error."""
        if path is not None and path not in self.PATHS:
            raise KmlcError(f"unknown path {path!r}; choose from {', '.join(self.PATHS)}")
        ret = self._path_fn("set_path")(-1 if path is None else self.PATHS.index(path))
        if ret:
            raise KmlcError(f"this CPU has no {path} path")
        self._forced = path

    @property
    def path(self) -> str:
        """The path a call takes (the forced one, or the CPU's best)."""
        fn = getattr(self.lib, f"kml_{self.name}_get_path", None)
        return self.PATHS[fn()] if fn is not None else "scalar"

    def path_calls(self) -> dict[str, int]:
        """Calls per path since the library was loaded."""
        fn = getattr(self.lib, f"kml_{self.name}_path_calls", None)
        if fn is None:
            return {}
        fn.restype = ctypes.c_uint64
        return {p: int(fn(i)) for i, p in enumerate(self.PATHS)}

    @property
    def fixed(self) -> dict | None:
        """The fixed-point interface (kmlc.json), or None for a float model."""
        return self.meta.get("fixed")

    @property
    def integer_inputs(self) -> bool:
        """True when the model's inputs are integers (or bools), taken as
        they are in both numerics."""
        first = self.meta["inputs"][0] if self.meta["inputs"] else {}
        return isinstance(first, dict) and first.get("onnx_dtype", "f32") != "f32"

    def encode(self, x) -> np.ndarray:
        """Feature rows as the model's raw input: integer features as they
        are (refused if not integers of the input's type); float features
        unchanged as float32 for a float model, and for a fixed model in[i]
        = round(x_i * 2^F_i), ties away from zero, saturated to int32."""
        x = self._rows(x)
        if self.integer_inputs:
            return self._integers(x)
        if not self.fixed:
            return x.astype(np.float32)
        bad = ~np.isfinite(x.astype(np.float64))
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise KmlcError(f"input row {r} holds {x[r, c]} (column {c}); a fixed-point model "
                            "takes finite values only")
        return encode_rows(x, self.fixed["frac_bits"])

    def _integers(self, x: np.ndarray) -> np.ndarray:
        dt = self.in_dtype
        if x.dtype.kind in "iub":
            info = np.iinfo(dt) if dt != np.bool_ else None
            if info is not None and x.size and (x.min() < info.min or x.max() > info.max):
                raise KmlcError(f"input values reach {x.min()}..{x.max()}, beyond {dt}")
            return x.astype(dt)
        bad = ~(np.isfinite(x) & (x == np.round(x)))
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise KmlcError(f"input row {r} holds {x[r, c]} (column {c}); the model takes "
                            f"{self.meta['inputs'][0]['onnx_dtype']} inputs")
        return self._integers(x.astype(np.int64))

    def decode(self, q: np.ndarray) -> np.ndarray:
        """Raw outputs as rows: integer (int32, int64, bool) outputs as they
        are; float outputs as float32, for a fixed model real = (q -
        zero_point) * scale per output; class indices and bools beside float
        outputs as exact floats (``run_named`` gives each its own type)."""
        if self.out_dtype != np.int32 or not self.fixed:
            return q
        y = np.empty(q.shape, dtype=np.float64)
        off = 0
        for o, port in zip(self.fixed["outputs"], self.meta["outputs"]):
            sl = slice(off, off + port["elems"])
            y[:, sl] = q[:, sl] if "scale" not in o else (q[:, sl] - o["zp"]) * o["scale"]
            off += port["elems"]
        return y.astype(np.float32)

    def _rows(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.in_elems:
            raise KmlcError(f"input has shape {tuple(x.shape)}; the model takes rows of "
                            f"{self.in_elems} values")
        return x

    def run_raw(self, x) -> np.ndarray:
        """The C entry point on raw rows (of the in[] and out[] types)."""
        x = np.ascontiguousarray(self._rows(x), dtype=self.in_dtype)
        y = np.empty((x.shape[0], self.out_elems), dtype=self.out_dtype)
        sat = np.zeros(x.shape[0], np.uint32)
        w = None if self._weights is None else self._weights.ctypes.data
        ret = self._batch(w, x.ctypes.data, y.ctypes.data, x.shape[0],
                          self._workspace.ctypes.data, sat.ctypes.data)
        if ret:
            raise KmlcError(f"kml_{self.name}_infer returned {ret}")
        self.last_saturations = sat
        self.saturations += int(sat.sum())
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

    @property
    def decided_generation(self) -> int:
        """The weight-set generation the last ``decide`` ran on, as the
        decision's own C read it with the set (what the module's hooks hand
        their guards); ``weights_generation`` unless it ran before a load."""
        self._need_hook()
        fn = self.lib.kml_twin_decided_gen
        fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_uint64
        return int(fn(self._buf().ctypes.data))

    def guard(self, steps, cfg: dict | None = None, nkeys: int = 1) -> np.ndarray:
        """Steps of a new guard (rows {kind, key, model, dflt, x, value[,
        gen]}, as ``TwinGuard.steps`` takes them) with ``cfg`` (default: the
        compiled one): {applied, why, arm, state} per row."""
        return TwinGuard(self, cfg, nkeys).steps(steps)

    def guard_session(self, cfg: dict | None = None, nkeys: int = 1) -> "TwinGuard":
        """A guard whose state lasts from call to call: for a simulator
        that evaluates the guarded policy one decision at a time.  Its
        decisions are made under the twin's current weight set: one loaded
        since (``load_weights``) is judged afresh, as in the module."""
        return TwinGuard(self, cfg, nkeys)

    def _need_hook(self) -> None:
        if not self.meta.get("hooks"):
            raise KmlcError(f"{self.name} was compiled without --hooks")

    def run(self, x) -> np.ndarray:
        """Feature rows in, output rows out, through exactly the module's
        path (see ``decode`` for the outputs' type)."""
        x = np.asarray(x)
        if x.ndim == 1:
            return self.run(x[None, :])[0]
        return self.decode(self.run_raw(self.encode(x)))

    def run_named(self, x) -> dict[str, np.ndarray]:
        """Each output by name, in its ONNX type and shape (a leading
        dimension of rows): float32, int32, int64 or bool."""
        x = np.asarray(x)
        y = self.run(x[None, :] if x.ndim == 1 else x)
        out = {}
        for port in self.meta["outputs"]:
            v = y[:, port["offset"]:port["offset"] + port["elems"]]
            v = v.astype(IO_DTYPES[port.get("onnx_dtype", "f32")])
            v = v.reshape((len(y), *port["shape"]))
            out[port["name"]] = v[0] if x.ndim == 1 else v
        return out

    __call__ = run


class TwinGuard:
    """One guard of a hook module (``runtime-kernel/kml_guard.h``), run by
    the module's own C in the twin: ``decide`` and ``cost`` are the
    module's kml_guarded_decide() and kml_guarded_cost() without the clock
    and the envelope check, which the caller supplies (``now``, ``outside``).
    Keys (files, mirrors, mounts) are numbered 0..nkeys-1.

    Weight sets: a decision is made under the twin's current generation
    (``Twin.weights_generation``), and a decision under a later one than
    the guard's resets its benefit state (counted as ``resets``); a cost
    counts only for the generation its decision was made under, by default
    the session's last decision's (``generation``).  A simulator whose costs
    arrive after later decisions, across a swap, passes each cost the
    ``generation`` its decision left."""
    COUNTERS = ("model", "shadow", "envelope", "control", "demoted", "probe", "rate",
                "periods", "demotions", "promotions", "envelope_trips", "envelope_clears",
                "resets")

    def __init__(self, twin: Twin, cfg: dict | None, nkeys: int):
        from ..hooks import guard as G

        twin._need_hook()
        self.twin, self.lib = twin, twin.lib
        self.generation = 0     # its last decision's weight-set generation (0: none yet)
        base = {**G.defaults(), **(twin.meta.get("guard") or {})}
        unknown = set(cfg or {}) - set(G.PARAMS)
        if unknown:
            raise KmlcError(f"unknown guard parameters: {', '.join(sorted(unknown))}")
        base.update(cfg or {})
        self.cfg = np.array([base[k] for k in G.PARAMS], dtype=np.uint32)
        size = ctypes.c_ulong.in_dll(self.lib, "kml_twin_guard_size").value
        ksize = ctypes.c_ulong.in_dll(self.lib, "kml_twin_guard_key_size").value
        self.nkeys = int(nkeys)
        self._g = np.zeros(size // 8 + 1, dtype=np.uint64)
        self._keys = np.zeros((ksize * self.nkeys) // 8 + 1, dtype=np.uint64)
        fn = self.lib.kml_twin_guard
        p = ctypes.c_void_p
        fn.argtypes, fn.restype = [p, ctypes.c_ulong, p, p, p, ctypes.c_ulong, p], ctypes.c_long
        self._fn = fn

    def steps(self, rows) -> np.ndarray:
        """Rows {kind, key, model, dflt, x, value, gen}: kind 0 a decision
        (x: bit 0 outside the envelope, bit 1 shadow mode on whatever the
        configuration says; value: time, ns; gen: the weight-set generation
        it was made under), kind 1 a cost (x: the arm; value: the cost;
        gen: its decision's generation).  Without the gen column, decisions
        take the twin's current generation and each cost its last
        decision's.  {applied, why, arm, state} per row."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[1] != 7:
            rows = rows.reshape(-1, 6)
            dec = rows[:, 0] == 0
            gen = np.where(dec, self.twin.weights_generation, self.generation)
            if dec.any():
                gen[np.argmax(dec):] = self.twin.weights_generation
            rows = np.column_stack([rows, gen])
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1, 7)
        out = np.zeros((len(rows), 4), dtype=np.int64)
        ret = self._fn(rows.ctypes.data, len(rows), self.cfg.ctypes.data, self._g.ctypes.data,
                       self._keys.ctypes.data, self.nkeys, out.ctypes.data)
        if ret:
            raise KmlcError(f"kml_twin_guard returned {ret}: a row's kind or key is out of range")
        dec = np.flatnonzero(rows[:, 0] == 0)
        if len(dec):
            self.generation = int(rows[dec[-1], 6])
        return out

    def decide(self, model: int, dflt: int, *, key: int = 0, outside: bool = False,
               now: int = 0, gen: int | None = None) -> tuple[int, int, int]:
        """The decision to apply, what decided it (kmlc.hooks.guard.WHY)
        and its A/B arm (0 model, 1 default, 2 none), made under the
        weight-set generation ``gen`` (default: the twin's current one)."""
        gen = self.twin.weights_generation if gen is None else gen
        o = self.steps([[0, key, model, dflt, int(outside), now, gen]])[0]
        return int(o[0]), int(o[1]), int(o[2])

    def cost(self, arm: int, cost: int, gen: int | None = None) -> bool:
        """A decision's cost on arm (0..2^64-1, as the module's u64), for
        a decision made under generation ``gen`` (default: the last
        decision's); True when it ended an A/B period."""
        v = int(np.array(cost, dtype=np.uint64).view(np.int64))
        gen = self.generation if gen is None else gen
        return bool(self.steps([[1, 0, 0, 0, arm, v, gen]])[0, 0])

    @property
    def counters(self) -> dict[str, int]:
        out = np.zeros(len(self.COUNTERS), dtype=np.uint64)
        fn = self.lib.kml_twin_guard_counters
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None
        fn(self._g.ctypes.data, out.ctypes.data)
        return dict(zip(self.COUNTERS, map(int, out)))

    @property
    def state(self) -> int:
        """KML_GUARD_DEMOTED_BIT (1) | KML_GUARD_TRIPPED_BIT (2), now
        (kml_guard_state())."""
        fn = self.lib.kml_twin_guard_state
        fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_uint32
        return int(fn(self._g.ctypes.data))


class ForeignTwin(Twin):
    """The twin built for another architecture (``FOREIGN``) and run there
    under qemu-user: the same sources, flags and determinism rules
    (docs/numerics.md), so its outputs are the host twin's bit for bit.
    Encoding and decoding are the host twin's (they are Python, on the
    same kmlc.json); ``run_raw`` runs the model's C on ``arch``.  For
    checking, not speed: every call starts a program under emulation."""

    def __init__(self, outdir, arch: str = "arm64", weights=None):
        self.exe = build_runner(Path(outdir), arch)
        self.arch = arch
        super().__init__(outdir, weights=weights)

    def run_raw(self, x) -> np.ndarray:
        x = np.ascontiguousarray(self._rows(x), dtype=self.in_dtype)
        n = x.shape[0]
        with tempfile.TemporaryDirectory(prefix="kmlc-run-") as d:
            args = []
            if self._weights is not None:
                (Path(d) / "set").write_bytes(self._weights.tobytes())
                args.append(str(Path(d) / "set"))
            res = subprocess.run([FOREIGN[self.arch][1], str(self.exe), *args],
                                 input=x.tobytes(), capture_output=True)
        ybytes = n * self.out_elems * self.out_dtype.itemsize
        if res.returncode or len(res.stdout) != ybytes + 4 * n:
            why = res.stderr.decode(errors="replace").strip() or f"exit {res.returncode}"
            raise KmlcError(f"the {self.arch} twin failed: {why}", where=str(self.exe))
        y = np.frombuffer(res.stdout[:ybytes], dtype=self.out_dtype).reshape(n, self.out_elems)
        sat = np.frombuffer(res.stdout[ybytes:], dtype=np.uint32).copy()
        self.last_saturations = sat
        self.saturations += int(sat.sum())
        return y.copy()
