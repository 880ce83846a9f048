"""The hooks' feature extractors for simulators and training scripts.

A kmlc hook computes its model's input features in the kernel with
``runtime-kernel/kml_features.h``.  This module runs that same C, built as
a userspace library (``runtime-user/kml_features_twin.c``, with the twin's
flags), on event streams a simulator or a recorded trace provides, with no
model attached: so a model is trained on exactly the features the module
will compute.

Features come back encoded as the kernel computes them, ``round(value *
2^frac)`` saturated to int32, and decoded as float64 (``raw / 2^frac``).
The default fraction bits are the ones the hooks use for float models.

    >>> w = kmlc.features.readahead(events)           # rows {t_ns, file, page, ra_pages}
    >>> w.values, w.closed_by                          # (W, 5) features, closing event
    >>> kmlc.features.admission(events).values         # rows {kind, a, b, c}
    >>> kmlc.features.nfs(events).values               # rows {t_ns, kind, mount, a, rsize}

Simulators whose decisions feed back into later events use the streams,
one event at a time: ``ReadaheadStream``, ``AdmissionStream`` and
``NfsStream`` (with ``NfsRsize``, the NFS hook's vote and clamps).  With
``frac=twin.hook_frac``, their features go straight into
``twin.decide()``, the module's own decision code.
"""
from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass

import numpy as np

from .errors import KmlcError

RA_FEATURES = 5
ADMIT_FEATURES = 11
NFS_FEATURES = 8
NFS_KINDS = {"read": 0, "done": 1, "page": 2, "reclaim": 3}
# Admission: integer features exact; throughput (B/us) with 8 fraction bits.
ADMIT_FRAC = (0,) * 8 + (8,) * 3

_lib = None


@dataclass
class Features:
    raw: np.ndarray            # (rows, features) int32, as the kernel encodes them
    frac: np.ndarray           # (features,) fraction bits of each column
    closed_by: np.ndarray | None = None  # readahead: index of the event closing each window

    @property
    def values(self) -> np.ndarray:
        """The features as float64: raw / 2^frac."""
        return self.raw.astype(np.float64) / np.exp2(self.frac.astype(np.float64))


def library() -> ctypes.CDLL:
    """The extractor library, built once per source version and cached
    under ~/.cache/kmlc/features/."""
    global _lib
    if _lib is not None:
        return _lib
    import subprocess

    from . import runtime_kernel, runtime_user
    from .targets.kunit import cache_dir, locked
    from .targets.user import CFLAGS, find_cc

    src = runtime_user.DIR / "kml_features_twin.c"
    headers = [runtime_kernel.DIR / h for h in ("kml_features.h", "kml_types.h")]
    cc = find_cc()
    key = hashlib.sha256(b"".join(p.read_bytes() for p in [src, *headers])
                         + " ".join([cc, *CFLAGS]).encode()).hexdigest()[:16]
    so = cache_dir() / "features" / key / "libkml_features.so"
    with locked("features"):
        if not so.is_file():
            so.parent.mkdir(parents=True, exist_ok=True)
            tmp = so.with_suffix(".tmp")
            res = subprocess.run([cc, *CFLAGS, "-shared", f"-I{runtime_kernel.DIR}",
                                  "-o", str(tmp), str(src)], capture_output=True, text=True)
            if res.returncode or res.stderr.strip():
                raise KmlcError("building the feature extractors failed (a kmlc bug)",
                                details=res.stderr.strip())
            tmp.rename(so)
    lib = ctypes.CDLL(str(so))
    p, ul, u32, u64 = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_uint32, ctypes.c_uint64
    s64 = ctypes.c_int64
    lib.kml_ra_extract.argtypes = [p, ul, u32, u64, p, p, p]
    lib.kml_admit_extract.argtypes = [p, ul, p, p]
    lib.kml_ra_extract.restype = lib.kml_admit_extract.restype = ctypes.c_long
    lib.kml_ra_step_miss.argtypes = [p, s64, s64, u32, u32, u64, p, p]
    lib.kml_ra_file_cost.argtypes, lib.kml_ra_file_cost.restype = [p], u64
    lib.kml_admit_step_complete.argtypes = [p, u32, u64, u64]
    lib.kml_admit_step_read.argtypes = [p, u64, u32, p, p]
    lib.kml_nfs_extract.argtypes = [p, ul, u64, p, p, p]
    lib.kml_nfs_extract.restype = ctypes.c_long
    lib.kml_nfs_step_event.argtypes = [p, p, u32, s64, s64, u32, u64, p, p]
    lib.kml_nfs_step_reclaim.argtypes = [p, u64]
    lib.kml_nfs_step_decide.argtypes = [p, u32, u32, u32]
    lib.kml_nfs_step_decide.restype = u32
    _lib = lib
    return lib


def ra_float_frac() -> np.ndarray:
    """The fraction bits the readahead hook uses for a float model."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * RA_FEATURES).in_dll(library(),
                                                                      "kml_ra_float_frac")).copy()


def nfs_float_frac() -> np.ndarray:
    """The fraction bits the NFS rsize hook uses for a float model."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * NFS_FEATURES).in_dll(library(),
                                                                       "kml_nfs_float_frac")).copy()


def _events(events, what: str, cols: int = 4) -> np.ndarray:
    ev = np.asarray(events)
    if ev.size == 0:
        return np.zeros((0, cols), dtype=np.int64)
    if ev.ndim != 2 or ev.shape[1] != cols:
        raise KmlcError(f"{what} events must be rows of {cols} integers; got shape {ev.shape}")
    if not np.issubdtype(ev.dtype, np.integer):
        raise KmlcError(f"{what} events must be integers; got dtype {ev.dtype}")
    return np.ascontiguousarray(ev, dtype=np.int64)


def _frac(frac, n: int) -> np.ndarray:
    f = np.broadcast_to(np.asarray(frac, dtype=np.int64), (n,))
    if f.min() < 0 or f.max() > 30:
        raise KmlcError(f"fraction bits must be 0..30; got {list(f)}")
    return np.ascontiguousarray(f, dtype=np.uint8)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        raise KmlcError(f"the {what} feature extractor failed (errno {-ret})")
    return ret


def readahead(events, *, window_events: int = 64, window_ms: float = 1000.0,
              frac=None) -> Features:
    """KML's five readahead features per file window, as the readahead hook
    computes them.  ``events``: rows {time ns, file id, page index,
    ra_pages} in time order, one per miss that reaches readahead (the
    kernel's page_cache_sync_ra/async_ra calls), with the file's readahead
    in pages at that moment.  ``window_events``/``window_ms`` are the hook's
    module parameters of the same names."""
    ev = _events(events, "readahead")
    if window_events < 2 or window_ms <= 0:
        raise KmlcError(f"readahead windows need window_events >= 2 and window_ms > 0; got "
                        f"{window_events} and {window_ms}")
    if len(ev) > 1 and np.any(np.diff(ev[:, 0]) < 0):
        raise KmlcError("readahead events must be in time order")
    f = _frac(ra_float_frac() if frac is None else frac, RA_FEATURES)
    raw = np.zeros((len(ev), RA_FEATURES), dtype=np.int32)
    closed = np.zeros(len(ev), dtype=np.int64)
    n = _check(library().kml_ra_extract(ev.ctypes.data, len(ev), int(window_events),
                                        int(window_ms * 1e6), f.ctypes.data, raw.ctypes.data,
                                        closed.ctypes.data), "readahead")
    return Features(raw[:n], f, closed[:n])


def admission(events, *, frac=ADMIT_FRAC) -> Features:
    """Heimdall's 11 features for every read, as the admission hook computes
    them.  ``events``: rows {kind, a, b, c} in time order; kind 0 is a read
    (a: size in bytes, b: reads and writes in flight on the primary), kind
    1 a read's and kind 2 a write's completion on the primary (a: queue
    length at submit, b: latency ns, c: bytes); both kinds of completion
    enter the history alike."""
    ev = _events(events, "admission")
    if not np.isin(ev[:, 0], (0, 1, 2)).all():
        raise KmlcError("admission events have kind 0 (read), 1 (read done) or 2 (write done) "
                        "only")
    f = _frac(frac, ADMIT_FEATURES)
    raw = np.zeros((int((ev[:, 0] == 0).sum()), ADMIT_FEATURES), dtype=np.int32)
    n = _check(library().kml_admit_extract(ev.ctypes.data, len(ev), f.ctypes.data,
                                           raw.ctypes.data), "admission")
    return Features(raw[:n], f)


def nfs(events, *, window_ms: float = 1000.0, frac=None) -> Features:
    """KML's eight NFS rsize features per mount window, as the nfs-rsize
    hook computes them (docs/hooks.md).  ``events``: rows {time ns, kind,
    mount id, a, rsize} in time order; kind 0 an NFS READ sent (a: file
    offset in bytes), 1 a READ done (a: ns since its send, -1 if unknown),
    2 a page added to the page cache of one of the mount's files (a: page
    index), 3 a reclaim scan anywhere in the system (a: pages reclaimed;
    mount ignored); rsize: the mount's rsize at that moment.
    ``window_ms`` is the hook's module parameter of the same name."""
    ev = _events(events, "NFS", cols=5)
    if window_ms <= 0:
        raise KmlcError(f"NFS windows need window_ms > 0; got {window_ms}")
    if not np.isin(ev[:, 1], list(NFS_KINDS.values())).all():
        raise KmlcError("NFS events have kind 0 (read), 1 (done), 2 (page) or 3 (reclaim)")
    if len(ev) > 1 and np.any(np.diff(ev[:, 0]) < 0):
        raise KmlcError("NFS events must be in time order")
    f = _frac(nfs_float_frac() if frac is None else frac, NFS_FEATURES)
    raw = np.zeros((len(ev), NFS_FEATURES), dtype=np.int32)
    closed = np.zeros(len(ev), dtype=np.int64)
    n = _check(library().kml_nfs_extract(ev.ctypes.data, len(ev), int(window_ms * 1e6),
                                         f.ctypes.data, raw.ctypes.data, closed.ctypes.data),
               "NFS")
    return Features(raw[:n], f, closed[:n])


def _size(symbol: str) -> int:
    return ctypes.c_ulong.in_dll(library(), symbol).value


class ReadaheadStream:
    """The readahead hook's windows, one miss at a time: ``add()`` returns
    the encoded features of the window the miss closes, else None; then
    ``last_cost`` is that window's cost for the benefit guard (ns per page
    the reader consumed, kml_ra_step())."""

    def __init__(self, *, window_events: int = 64, window_ms: float = 1000.0, frac=None):
        if window_events < 2 or window_ms <= 0:
            raise KmlcError(f"readahead windows need window_events >= 2 and window_ms > 0; "
                            f"got {window_events} and {window_ms}")
        self.frac = _frac(ra_float_frac() if frac is None else frac, RA_FEATURES)
        self.window_events, self.window_ns = int(window_events), int(window_ms * 1e6)
        self._files: dict[int, ctypes.Array] = {}
        self._out = np.zeros(RA_FEATURES, dtype=np.int32)
        self._lib, self._state_size = library(), _size("kml_ra_file_size")
        self._ptrs = (self.frac.ctypes.data, self._out.ctypes.data)
        self.last_cost = 0

    def add(self, t_ns: int, file: int, page: int, ra_pages: int) -> np.ndarray | None:
        st = self._files.get(file)
        if st is None:
            st = self._files[file] = ctypes.create_string_buffer(self._state_size)
        if self._lib.kml_ra_step_miss(st, t_ns, page, ra_pages, self.window_events,
                                      self.window_ns, *self._ptrs):
            self.last_cost = int(self._lib.kml_ra_file_cost(st))
            return self._out.copy()
        return None

    def forget(self, file: int) -> None:
        """Drop a file's open window (the file was closed)."""
        self._files.pop(file, None)


class AdmissionStream:
    """The admission hook's per-device history, one event at a time."""

    def __init__(self, *, frac=ADMIT_FRAC):
        self.frac = _frac(frac, ADMIT_FEATURES)
        self._lib = library()
        self._state = ctypes.create_string_buffer(_size("kml_admit_state_size"))
        self._out = np.zeros(ADMIT_FEATURES, dtype=np.int32)
        self._ptrs = (self.frac.ctypes.data, self._out.ctypes.data)

    def complete(self, qlen: int, latency_ns: int, nbytes: int) -> None:
        """A read or a write finished on the primary; it had ``qlen`` I/Os
        (reads and writes) ahead of it."""
        self._lib.kml_admit_step_complete(self._state, qlen, latency_ns, nbytes)

    def read(self, size: int, inflight: int) -> np.ndarray:
        """The encoded features of a read of ``size`` bytes arriving with
        ``inflight`` reads and writes in flight on the primary."""
        self._lib.kml_admit_step_read(self._state, size, inflight, *self._ptrs)
        return self._out.copy()


class NfsStream:
    """The NFS rsize hook's windows, one event at a time: ``event()``
    returns the encoded features of the window the event closes, else None;
    ``reclaim()`` records a reclaim scan (it counts in every mount's
    window)."""

    def __init__(self, *, window_ms: float = 1000.0, frac=None):
        if window_ms <= 0:
            raise KmlcError(f"NFS windows need window_ms > 0; got {window_ms}")
        self.frac = _frac(nfs_float_frac() if frac is None else frac, NFS_FEATURES)
        self.window_ns = int(window_ms * 1e6)
        self._lib = library()
        self._reclaim = ctypes.create_string_buffer(_size("kml_nfs_reclaim_size"))
        self._mounts: dict[int, ctypes.Array] = {}
        self._out = np.zeros(NFS_FEATURES, dtype=np.int32)
        self._ptrs = (self.frac.ctypes.data, self._out.ctypes.data)
        self._window_size = _size("kml_nfs_window_size")

    def event(self, t_ns: int, kind: int, mount: int, a: int, rsize: int) -> np.ndarray | None:
        """A read (kind 0, a: offset), done (1, a: latency ns or -1) or page
        add (2, a: index) of ``mount`` at ``t_ns``, its rsize being ``rsize``."""
        if kind not in (0, 1, 2):
            raise KmlcError(f"NfsStream.event takes kinds 0, 1 and 2; got {kind} "
                            "(reclaim scans go to reclaim())")
        st = self._mounts.get(mount)
        if st is None:
            st = self._mounts[mount] = ctypes.create_string_buffer(self._window_size)
        if self._lib.kml_nfs_step_event(st, self._reclaim, kind, t_ns, a, rsize, self.window_ns,
                                        *self._ptrs):
            return self._out.copy()
        return None

    def reclaim(self, pages: int) -> None:
        self._lib.kml_nfs_step_reclaim(self._reclaim, pages)


class NfsRsize:
    """What the NFS rsize hook sets for a mount, prediction by prediction:
    the rsize the class asks for, voted over the last ``vote`` predictions
    and clamped to a power of two in 4 KiB .. 256 KiB, at most the mount's
    negotiated rsize (kml_nfs_decide())."""

    def __init__(self, *, vote: int = 1):
        self.vote = int(vote)
        self._lib = library()
        self._votes = ctypes.create_string_buffer(_size("kml_nfs_votes_size"))

    def decide(self, want: int, negotiated: int) -> int:
        return int(self._lib.kml_nfs_step_decide(self._votes, want, self.vote, negotiated))
