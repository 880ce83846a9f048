"""kmlc's Python API; the CLI is a thin layer over it.

``compile`` runs frontend -> passes -> planner -> codegen and writes OUTDIR
atomically: everything is produced in a temporary sibling directory that
replaces OUTDIR only once complete, so a failure never leaves a half-written
OUTDIR (and never deletes a directory kmlc did not create).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import __version__
from .calibrate import check_rows
from .errors import KmlcError
from .hooks import check_hook_params, check_hooks, owner
from .hooks.guard import check_guards, envelope as guard_envelope
from .passes import banner, run_pipeline
from .schedule import Program
from .weightset import corruption_cases, structure_hash

TARGETS = ("kernel", "user", "kunit")
NUMERICS = ("float", "fixed")
DEFAULT_MAX_WEIGHT_BYTES = 1 << 20      # 1 MiB of static const data in the module
DEFAULT_MAX_WORKSPACE_BYTES = 64 << 10  # 64 KiB the caller must provide per call
DEFAULT_GOLDEN_COUNT = 64


@dataclass
class CompileResult:
    outdir: Path
    program: Program
    manifest: dict
    warnings: list = field(default_factory=list)  # one line each, said at compile time


def reserved_names() -> set[str]:
    """Names a model may not take: its files (<name>.h, <name>.c,
    <name>_twin.c...) would collide with the runtime's (kml_*.h, kml_*.c)
    or with the generated kml_binding.h."""
    from . import runtime_kernel, runtime_user

    return {p.stem for d in (runtime_kernel.DIR, runtime_user.DIR) for p in d.iterdir()
            if p.suffix in (".h", ".c")} | {"kml_binding"}


def check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name) or name in reserved_names():
        raise KmlcError(f"model name {name!r} is not usable: use 1-40 lowercase letters, digits "
                        "and '_', starting with a letter (and not a kml_* runtime header name)")
    return name


def normalize_targets(targets) -> list[str]:
    if isinstance(targets, str):
        targets = [targets]
    out: list[str] = []
    for t in targets:
        for part in str(t).split(","):
            part = part.strip()
            if part == "all":
                out.extend(TARGETS)
            elif part in TARGETS:
                out.append(part)
            else:
                raise KmlcError(f"unknown target '{part}'; choose from kernel, user, kunit, all")
    return [t for t in TARGETS if t in out]


def golden_inputs(in_elems: int, count: int, seed: int, data: np.ndarray | None) -> np.ndarray:
    """Golden input rows: the first ``count`` rows of ``data`` when given;
    otherwise seeded normal noise at scales from 0.01 to 1000, so vectors
    reach the saturating branches of exp/sigmoid/tanh too."""
    if data is not None:
        return np.ascontiguousarray(data[:count], dtype=np.float32)
    rng = np.random.default_rng(seed)
    scales = np.array([1.0, 0.01, 10.0, 100.0, 1000.0, 3.0], dtype=np.float64)
    rows = rng.standard_normal((count, in_elems)) * scales[np.arange(count) % len(scales), None]
    rows[0] = 0.0
    return rows.astype(np.float32)


def check_shapes(graph, max_workspace_bytes: int) -> None:
    """Before anything is lowered or allocated: every tensor a call computes
    or takes (inputs, outputs, intermediates) fits the per-call budget, so
    a huge declared dimension or a fixed batch of a million rows is refused
    at once rather than built."""
    values = list(graph.inputs) + [v for op in graph.ops for v in op.outputs]
    for v in values:
        if v.type.nbytes > max_workspace_bytes:
            raise KmlcError(f"tensor '{graph.source_name(v)}' ({v.type}, {v.type.nbytes} B) is "
                            f"over the kernel budget of {max_workspace_bytes} B per call (a "
                            "leading dimension is one sample per call: make it 1 or symbolic); "
                            "raise it with --max-workspace-bytes")


def check_budget(prog: Program, max_weight_bytes: int, max_workspace_bytes: int) -> None:
    if prog.plan.weight_bytes > max_weight_bytes:
        big = max(prog.buffers("const"), key=lambda b: b.nbytes)
        raise KmlcError(f"model '{prog.name}' needs {prog.plan.weight_bytes} B of weights, over "
                        f"the kernel budget of {max_weight_bytes} B (largest: '{big.value}', "
                        f"{big.nbytes} B); raise it with --max-weight-bytes")
    if prog.plan.workspace_bytes > max_workspace_bytes:
        big = max(prog.buffers("temp"), key=lambda b: b.nbytes)
        raise KmlcError(f"model '{prog.name}' needs a {prog.plan.workspace_bytes} B workspace, "
                        f"over the kernel budget of {max_workspace_bytes} B (largest buffer: "
                        f"'{big.value}', {big.nbytes} B); raise it with --max-workspace-bytes")


def lower_model(model, example_inputs=None, *, params=None, name: str | None = None,
                numerics: str = "float", print_after: Callable[[str, str], None] | None = None,
                calibration: np.ndarray | None = None, weight_bits: str | list = "auto",
                input_frac_bits: list[int] | None = None, input_margin: float = 0.0,
                headroom: float | None = None, pinned: dict | None = None) -> Program:
    """Frontend and passes: a model (see ``compile``) to a planned program.
    Fixed point needs ``calibration`` rows."""
    from .frontends import load as import_model
    from .passes.quantize import HEADROOM, QuantOptions

    if numerics not in NUMERICS:
        raise KmlcError(f"--numerics {numerics} is not available in this kmlc "
                        f"(available: {', '.join(NUMERICS)})")
    if numerics == "float" and calibration is not None:
        raise KmlcError("--calibration is only used with --numerics fixed")
    graph = import_model(model, example_inputs, params=params,
                         name=check_name(name) if name else None).graph
    check_name(graph.name)
    if not 0 <= input_margin <= 10:
        raise KmlcError(f"--input-margin {input_margin:g}: expected a fraction of the "
                        "calibrated range in 0..10")
    if headroom is not None and not 1 <= headroom <= 1000:
        raise KmlcError(f"--headroom {headroom:g}: expected a factor of the calibrated "
                        "ranges in 1..1000")
    return run_pipeline(graph, numerics, print_after, calibration,
                        QuantOptions(weight_bits if isinstance(weight_bits, (list, tuple))
                                     else str(weight_bits), input_frac_bits,
                                     input_margin=float(input_margin),
                                     headroom=float(headroom or HEADROOM), pinned=pinned))


def compile(model, inputs_or_outdir=None, /, outdir=None, *, params=None, targets="all",
            name: str | None = None, numerics: str = "float",
            print_after: Callable[[str, str], None] | None = None,
            golden_data: np.ndarray | None = None, golden_count: int = DEFAULT_GOLDEN_COUNT,
            seed: int = 0, max_weight_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
            max_workspace_bytes: int = DEFAULT_MAX_WORKSPACE_BYTES,
            cc: str | None = None, calibration: np.ndarray | None = None,
            weight_bits: str | list = "auto", input_frac_bits: list[int] | None = None,
            input_margin: float = 0.0, headroom: float | None = None, hooks=(),
            hook_params=(), guards=()) -> CompileResult:
    """Compile ``model`` into ``outdir``; the frontend follows the model's type:

        compile("m.onnx" | onnx.ModelProto, outdir)
        compile(torch_module, example_inputs, outdir)   # a tensor or a tuple
        compile(sklearn_estimator, X_sample, outdir)    # through skl2onnx
        compile(relax_irmodule, outdir, params=None)

    ``numerics="fixed"`` needs ``calibration`` rows (N, in_elems).
    ``hook_params``: {name: value} or NAME=VALUE strings, the defaults of
    the hook's module parameters (kmlc.hooks); ``guards``: ``--guard``
    specs, the guards on the hook's decisions (kmlc.hooks.guard)."""
    from .codegen import emit
    from .frontends import load as import_model, takes_example_inputs
    from .targets import user

    example_inputs = None
    if takes_example_inputs(model):
        example_inputs = inputs_or_outdir
    elif outdir is None:
        outdir = inputs_or_outdir
    elif inputs_or_outdir is not None:
        raise KmlcError("two output directories given; example inputs are only for a "
                        "torch.nn.Module or a scikit-learn estimator")
    if outdir is None:
        raise KmlcError("no output directory given: compile(model, outdir) or, for a "
                        "torch.nn.Module or a scikit-learn estimator, "
                        "compile(model, example_inputs, outdir)")
    targets = normalize_targets(targets)
    outdir = Path(outdir)
    _check_outdir(outdir)
    imported = import_model(model, example_inputs, params=params,
                            name=check_name(name) if name else None)
    check_shapes(imported.graph, max_workspace_bytes)
    prog = lower_model(imported.graph, numerics=numerics, print_after=print_after,
                       calibration=calibration, weight_bits=weight_bits,
                       input_frac_bits=input_frac_bits, input_margin=input_margin,
                       headroom=headroom)
    check_budget(prog, max_weight_bytes, max_workspace_bytes)
    prog.hooks = check_hooks(prog, hooks, targets)
    prog.hook_params = check_hook_params(prog.hooks, hook_params)
    prog.guard = check_guards(guards, owner(prog.hooks[0]) if prog.hooks else None,
                              guard_envelope(prog))
    source, sha = imported.source, imported.sha256
    render = lambda ts, goldens=None: emit.render(  # noqa: E731
        prog, ts, source=source, sha256=sha, user_cflags=" ".join(user.cflags(prog.numerics == "fixed")), goldens=goldens)

    outdir.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        # a signal between mkdtemp's mkdir and the assignment would leave
        # the directory behind: hold them until tmp names it
        with _signals_held():
            tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.kmlc-", dir=outdir.parent))
        # The twin comes first: KUnit's golden outputs are its results.
        twin_dir = tmp / ("user" if "user" in targets else ".twin")
        _write(twin_dir, {rel.split("/", 1)[1]: text for rel, text in render(["user"]).items()})
        so = user.build_twin(twin_dir, prog.name, cc=cc)
        (tmp / "kmlc.json").write_text(json.dumps(_manifest(prog, targets, source, sha)))
        goldens = None
        if "kunit" in targets or "kernel" in targets:  # KUnit and the module's self-test
            if golden_data is not None:
                golden_data = check_rows(golden_data, prog.in_elems, "golden data")
            twin = user.Twin(tmp, so=so)
            rows = golden_inputs(prog.in_elems, golden_count, seed, golden_data)
            if twin.integer_inputs and golden_data is None:
                rows = np.round(rows)
            xs = twin.encode(rows)
            if xs.dtype != np.float32:   # exact for any input of its type: its extremes
                lo, hi = (0, 1) if xs.dtype == np.bool_ else (np.iinfo(xs.dtype).min,
                                                              np.iinfo(xs.dtype).max)
                xs[-3:] = np.array([lo, hi, 0], dtype=xs.dtype)[:, None]
            goldens = (xs, twin.run_raw(xs), twin.last_saturations.copy())
            # the same vectors for anyone's checking: kmlc run --goldens [--arch]
            np.savez(tmp / "goldens.npz", inputs=goldens[0], outputs=goldens[1],
                     saturations=goldens[2])
        _write(tmp, render(targets, goldens))
        if "user" not in targets:
            shutil.rmtree(twin_dir)
        manifest = _manifest(prog, targets, source, sha, goldens)
        (tmp / "kmlc.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / "report.txt").write_text(_report(prog))
        _replace(tmp, outdir)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CompileResult(outdir, prog, manifest, _warnings(prog))


def _warnings(prog: Program) -> list[str]:
    from .passes.error_bound import requant_warnings
    from .verify import MIN_SQNR

    if prog.quant is None:
        return []
    out = requant_warnings(prog.quant, MIN_SQNR)
    if prog.quant.input_margin:
        out.append(f"--input-margin {prog.quant.input_margin:g} coarsens the inputs' encoding "
                   "to widen the int16 fast path; inputs beyond it are computed exactly "
                   "anyway, so it changes speed and precision, not range")
    return out


def pack(model, like, out, *, example_inputs=None, calibration: np.ndarray | None = None,
         version: int = 1, params=None) -> dict:
    """Write ``out``, a ``.kmlw`` weight set of ``model`` for the model
    compiled in ``like`` (docs/weights.md): ``model`` is lowered with the
    options recorded there (name, numerics; for fixed point the weight
    widths and input encodings, and ``calibration`` rows), and refused, in
    one line, unless its structure is the compiled one's."""
    from .targets.user import read_manifest
    from .weightset import pack as pack_blob

    like, out = Path(like), Path(out)
    meta = read_manifest(like)
    fx = meta.get("fixed") or {}
    fixed = meta.get("numerics") == "fixed"
    if fixed and calibration is None:
        raise KmlcError(f"{like} holds a fixed-point model: its new weights need "
                        "--calibration rows")
    # fixed point: the compiled model's formats (every range, each layer's
    # weight width and accumulator), so that only the constants can change
    prog = lower_model(model, example_inputs, params=params, name=meta.get("name"),
                       numerics=meta.get("numerics", "float"), calibration=calibration,
                       weight_bits=list(fx.get("weight_bits", {}).values()) or "auto",
                       input_frac_bits=fx.get("frac_bits") if fixed else None,
                       pinned=fx.get("formats"))
    if structure_hash(prog).hex() != meta.get("structure_sha256"):
        raise KmlcError(f"its structure differs from the model compiled in {like} (graph, "
                        "shapes, or fixed-point formats such as output zero points): a weight "
                        "set must be for the same structure; recompile instead",
                        where=str(model) if isinstance(model, (str, Path)) else None)
    blob = pack_blob(prog, version)
    if (like / "user" / f"libkml_{prog.name}.so").is_file():
        # the module's own check (kml_weights.h), which the twin runs too: a
        # blob it would refuse is never written
        from .targets.user import Twin

        Twin(like).check_set(blob, "the packed weight set")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.kmlc-tmp")
    try:
        tmp.write_bytes(blob)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise KmlcError(f"cannot write the weight set: {e.strerror or e}", where=str(out)) \
            from None
    return {"name": prog.name, "version": version, "bytes": len(blob),
            "weight_bytes": prog.weight_bytes, "structure_sha256": meta["structure_sha256"]}


def load(outdir, weights=None, arch: str | None = None):
    """Open a compiled model's userspace twin (``kmlc.targets.user.Twin``),
    on the weight set ``weights`` (a ``.kmlw`` blob's path or bytes, from
    ``kmlc pack``) or, by default, the one it was compiled with; with
    ``arch`` ("arm64"), the twin built for that architecture, run under
    qemu-user (``ForeignTwin``)."""
    from .targets.user import ForeignTwin, Twin

    if arch:
        return ForeignTwin(outdir, arch=arch, weights=weights)
    return Twin(outdir, weights=weights)


def check_goldens(twin, outdir: Path) -> int:
    """Runs ``twin`` on OUTDIR's golden vectors (goldens.npz: the raw
    inputs, and the outputs and saturation counts KUnit and the module's
    self-test expect) and returns their count if every output is the same
    bit for bit; else raises, naming the first vector that differs."""
    path = Path(outdir) / "goldens.npz"
    if not path.is_file():
        raise KmlcError("no golden vectors here (compile with --target kernel or kunit)",
                        where=str(path))
    with np.load(path) as g:
        xs, ys, sat = g["inputs"], g["outputs"], g["saturations"]
    got = twin.run_raw(xs)
    same = (got.view(np.uint8).reshape(len(xs), -1) == ys.view(np.uint8).reshape(len(xs), -1)
            ).all(axis=1) & (twin.last_saturations == sat)
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        raise KmlcError(f"golden vector {i}: the twin's outputs differ from the compiled ones "
                        f"({int((~same).sum())} of {len(xs)} vectors differ)", where=str(path))
    return len(xs)


# --------------------------------------------------------------------------

def _check_outdir(outdir: Path) -> None:
    if outdir.exists() and not outdir.is_dir():
        raise KmlcError("exists and is not a directory", where=str(outdir))
    if outdir.is_dir() and any(outdir.iterdir()) and not (outdir / "kmlc.json").is_file():
        raise KmlcError("exists, is not empty and is not a kmlc output directory; refusing to "
                        "replace it", where=str(outdir))


def _write(root: Path, files: dict[str, str]) -> None:
    from . import runtime_kernel, runtime_user

    dirs = set()
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        dirs.add(p.parent)
    for d in dirs:  # each target directory builds on its own: give it the model's runtime
        for h in sorted(runtime_kernel.DIR.glob("*.h")):
            if h.name not in HOOK_HEADERS:
                shutil.copyfile(h, d / h.name)
        if d.name in ("user", ".twin"):
            for h in sorted(runtime_user.DIR.glob("*.h")):
                shutil.copyfile(h, d / h.name)


# Runtime headers of the hooks only: a hook's files bring them (kmlc.hooks).
HOOK_HEADERS = {"kml_hook.h", "kml_features.h", "kml_admit_trace.h", "kml_ra_trace.h",
                "kml_nfs_trace.h"}


def _replace(tmp: Path, outdir: Path) -> None:
    """The finished ``tmp`` becomes ``outdir``, the previous one removed.
    SIGINT and SIGTERM wait until both renames and the removal are done (a
    signal between the renames would leave no OUTDIR at all, one during
    the removal part of the old one)."""
    if outdir.exists():
        _check_outdir(outdir)
        old = outdir.with_name(f".{outdir.name}.kmlc-old")
        shutil.rmtree(old, ignore_errors=True)
        with _signals_held():          # and until the old one is gone: a
            outdir.rename(old)         # signal inside rmtree would leave
            tmp.rename(outdir)         # part of it behind
            shutil.rmtree(old)
    else:
        tmp.rename(outdir)


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait until the block is done, then take effect as
    they would have.  Python runs signal handlers in the main thread
    whichever thread the kernel delivered the signal to (a process with
    onnxruntime's or BLAS's threads has several), so the handlers defer
    them, not a signal mask, which holds only the thread that sets it."""
    if threading.current_thread() is not threading.main_thread():
        yield                        # handlers can only be set in the main thread
        return
    got = []
    held = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for s in dict.fromkeys(got):
            if callable(old[s]):
                old[s](s, None)          # KeyboardInterrupt, as the CLI's handlers raise
            elif old[s] == signal.SIG_DFL:
                signal.raise_signal(s)


def _manifest(prog: Program, targets, source: str, sha: str, goldens=None) -> dict:
    from .codegen.emit import fixed_interface, simd_context

    port = lambda p: {"name": p.name, "shape": list(p.type.shape),  # noqa: E731
                      "dtype": p.type.dtype.name, "onnx_dtype": onnx_dtype(prog, p),
                      "offset": p.buffer.offset, "elems": p.buffer.numel}
    return {
        "kmlc_version": __version__,
        "name": prog.name,
        "module": f"kml_{prog.name}",
        "numerics": prog.numerics,
        "targets": list(targets),
        "source": {"file": source, "sha256": sha},
        "inputs": [port(p) for p in prog.inputs],
        "outputs": [port(p) for p in prog.outputs],
        "in_elems": prog.in_elems,
        "out_elems": prog.out_elems,
        "in_dtype": prog.in_dtype.name,
        "out_dtype": prog.out_dtype.name,
        "workspace_bytes": prog.plan.workspace_bytes,
        "weight_bytes": prog.plan.weight_bytes,
        # what a weight set must have been built for (compiler/weightset.py)
        "structure_sha256": structure_hash(prog).hex(),
        "peak_live_bytes": prog.plan.peak_bytes,
        "kernels": len(prog.kernels),
        "golden_vectors": 0 if goldens is None else int(len(goldens[0])),
        # SIMD paths (kml_simd.h): multiply-adds they take per call, 0 for none
        "simd_macs": simd_context(prog)["simd_macs"],
        # the KUnit suite's forged weight sets (weightset.corruption_cases)
        "set_forgeries": len(corruption_cases(prog)),
        "macs": sum(k.params["k"] * k.params["n"] for k in prog.kernels if k.kind == "qdense")
        or None,
        "fixed": fixed_interface(prog),
        "hooks": list(getattr(prog, "hooks", []) or []),
        "hook_params": dict(getattr(prog, "hook_params", {}) or {}),
        "guard": getattr(prog, "guard", None) if getattr(prog, "hooks", None) else None,
        # the envelope guard's [lo, hi] of the encoded features (kml_binding.h)
        "guard_envelope": guard_envelope(prog) if getattr(prog, "hooks", None) else None,
    }


def onnx_dtype(prog: Program, p) -> str:
    """A port's element type in the source model: a fixed-point program's
    int16 outputs, int32 outputs on a scale (a tree ensemble's sums) and
    encoded int32 inputs stand for float32 values."""
    q = prog.quant
    if q is not None and (p.type.dtype.name == "i16" or "scale" in q.outputs.get(
            p.buffer.value, {})):
        return "f32"
    if q is not None and p.buffer.value in q.inputs:
        return q.inputs[p.buffer.value].get("onnx_dtype", "f32")
    return p.type.dtype.name


def _report(prog: Program) -> str:
    from .passes import _error_report

    parts = [banner("lower"), str(prog), "", banner("plan-memory"), str(prog.plan), ""]
    q = prog.quant
    if q is not None:
        parts += ["fixed point: calibrated on %d rows" % q.calibration_rows,
                  "  weight bits per layer: " + ", ".join(f"{k}: {v}" for k, v in
                                                         q.weight_bits.items()),
                  *([f"  decisions agree with float on {q.decision_agreement:.2f}% of the "
                     "calibration rows with these widths (--weight-bits auto)"]
                    if q.decision_agreement is not None else []),
                  "  SQNR with int8 weights (dB): " + ", ".join(
                      f"{k}: {v:.1f}" for k, v in q.sqnr_int8.items()), "",
                  _error_report(q), ""]
    return "\n".join(parts)
