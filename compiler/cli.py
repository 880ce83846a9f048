"""The ``kmlc`` command line (Click).

Every failure a user can cause is a ``KmlcError``, printed as one line
``kmlc: error: ...`` with exit status 1.  Anything else is a kmlc bug: it is
reported as an internal error with exit status 2, and KMLC_DEBUG=1 shows
the traceback.
"""
from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from . import __version__
from .errors import KmlcError
from .ir import c_text


def _load_npy(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise KmlcError("no such file", where=path)
    try:
        return np.load(p, allow_pickle=False)
    except Exception as e:
        raise KmlcError(f"cannot read {what} as .npy ({e})", where=path) from None


def _int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise KmlcError(f"--input-frac-bits takes integers separated by commas, not '{text}'")


def _model_arg(model: str, input_shapes) -> tuple:
    """MODEL as the API takes it, and its example inputs: an ONNX path, or
    for FILE.py:NAME a torch.nn.Module with zero inputs of each --input-shape."""
    path, sep, attr = model.rpartition(":")
    if not sep or not path.endswith(".py"):
        if input_shapes:
            raise KmlcError("--input-shape is for a PyTorch model given as FILE.py:NAME",
                            where=model)
        return model, None
    from .frontends import require

    torch = require("torch", "a PyTorch model (FILE.py:NAME)", "torch")
    from .frontends.torch import module_from_file

    shapes = [_shape(s) for s in input_shapes]
    module = module_from_file(path, attr)
    if not shapes:
        raise KmlcError("a PyTorch model needs --input-shape (e.g. --input-shape 1,5), once per "
                        "forward() argument", where=model)
    return module, tuple(torch.zeros(s) for s in shapes)


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(t) for t in text.split(","))
    except ValueError:
        dims = ()
    if not dims or min(dims) <= 0:
        raise KmlcError(f"--input-shape takes positive integers separated by commas (e.g. 1,5), "
                        f"not '{text}'")
    return dims


def _print_stage(stage: str, text: str, err: bool = True) -> None:
    from .passes import banner

    click.echo(banner(stage), err=err)
    click.echo(text + "\n", err=err)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kmlc")
def cli():
    """kmlc compiles small ONNX or PyTorch models into Linux kernel modules,
    userspace twins and KUnit suites that agree bit for bit."""


_INPUT_SHAPE = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="D,D,...",
    help="For FILE.py:NAME: the shape of forward()'s input; repeat for each input.")


@cli.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@_INPUT_SHAPE
@click.option("-o", "--outdir", required=True, type=click.Path(file_okay=False),
              help="Output directory (replaced atomically; must be new, empty or kmlc's).")
@click.option("--target", "targets", multiple=True, default=["all"], show_default=True,
              help="kernel, user, kunit or all; repeat or comma-separate.")
@click.option("--name", help="Model name (C identifier); default: the file name (the "
              "module's class name for FILE.py:NAME).")
@click.option("--numerics", default="float", show_default=True,
              type=click.Choice(["float", "fixed"]),
              help="float: f32 in an FPU section; fixed: integers only (needs --calibration).")
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Rows (N, in_elems) .npy of realistic inputs, for --numerics fixed.")
@click.option("--weight-bits", default="auto", show_default=True,
              help="Fixed point: weight width: auto (int8 wherever decisions hold), 8, 16, or "
              "one per dense layer in model order (8,16,8: pins what auto picked).")
@click.option("--input-frac-bits", help="Fixed point: fraction bits of the int32 inputs, one "
              "value or one per input element (default: chosen from the calibration range).")
@click.option("--input-margin", default=0.0, show_default=True, type=float,
              help="Fixed point, an optimization: widen the input range the int16 fast path "
              "covers by this fraction of the calibrated width on each side, at a coarser "
              "input step (every int32 input is computed exactly either way).")
@click.option("--headroom", type=float, help="Fixed point: every activation's int16 encoding "
              "spans this many times its calibrated range (default 10: inputs up to 10x "
              "beyond calibration do not saturate the hidden layers; 1.5 gives finer steps "
              "and a tighter error bound inside the calibrated range).")
@click.option("--hooks", multiple=True, help="Kernel hooks to generate: admission "
              "(a device-mapper target), readahead (per-file readahead), nfs-rsize "
              "(per-mount NFS rsize); see docs/hooks.md.")
@click.option("--hook-param", "hook_params", multiple=True, metavar="NAME=VALUE",
              help="Compiled-in default of a hook's module parameter, e.g. "
              "history_writes=0; repeatable (docs/hooks.md).")
@click.option("--guard", "guards", multiple=True, metavar="SPEC",
              help="A guard on the hook's decisions: shadow, envelope[=PCT], benefit[=EVERY], "
              "rate[=MS], or PARAMETER=VALUE (e.g. benefit_margin_pct=5); repeatable "
              "(docs/hooks.md, Guards).")
@click.option("--print-after-all", is_flag=True, help="Print the IR after every pass (stderr).")
@click.option("--golden-data", type=click.Path(dir_okay=False),
              help="Rows (N, in_elems) .npy to use as KUnit golden inputs.")
@click.option("--golden-count", default=64, show_default=True, type=click.IntRange(1, 4096))
@click.option("--seed", default=0, show_default=True, help="Seed for random golden inputs.")
@click.option("--max-weight-bytes", default=1 << 20, show_default=True, type=int)
@click.option("--max-workspace-bytes", default=64 << 10, show_default=True, type=int)
def compile_cmd(model, input_shapes, outdir, targets, name, numerics, calibration, weight_bits,
                input_frac_bits, input_margin, headroom, hooks, hook_params, guards,
                print_after_all,
                golden_data, golden_count, seed, max_weight_bytes, max_workspace_bytes):
    """Compile MODEL into OUTDIR: kernel/, user/, kunit/.  MODEL is an .onnx
    file, or FILE.py:NAME with NAME an nn.Module class or a function
    returning one (with --input-shape)."""
    from .api import compile as kcompile

    model, example_inputs = _model_arg(model, input_shapes)
    data = _load_npy(golden_data, "golden data") if golden_data else None
    cal = _load_npy(calibration, "calibration data") if calibration else None
    r = kcompile(model, example_inputs, outdir, targets=targets, name=name, numerics=numerics,
                 print_after=_print_stage if print_after_all else None, golden_data=data,
                 golden_count=golden_count, seed=seed, max_weight_bytes=max_weight_bytes,
                 max_workspace_bytes=max_workspace_bytes, calibration=cal,
                 weight_bits=weight_bits, input_frac_bits=_int_list(input_frac_bits),
                 input_margin=input_margin, headroom=headroom,
                 hooks=hooks, hook_params=hook_params, guards=guards)
    m = r.manifest
    click.echo(f"kmlc: compiled {m['name']} ({m['numerics']}): {m['in_elems']} -> "
               f"{m['out_elems']} values, {m['kernels']} kernels, weights {m['weight_bytes']} B, "
               f"workspace {m['workspace_bytes']} B -> {outdir}/ [{', '.join(m['targets'])}]")
    fx = m["fixed"] or {}
    if fx.get("weight_bits"):
        widths = ", ".join(f"{c_text(n)} int{b}" for n, b in fx["weight_bits"].items())
        agree = fx.get("decision_agreement")
        click.echo(f"kmlc: fixed point, weights: {widths}" + (
            f" (decisions as float's on {agree:.2f}% of the calibration rows)"
            if agree is not None else ""))
    if m.get("simd_macs"):
        click.echo(f"kmlc: fixed point, SIMD paths (SSE2, AVX2 where the CPU has it) for "
                   f"{m['simd_macs']} of {m['macs']} multiply-adds: the same bits as the scalar "
                   "path, taken where the FPU may be used and the model has >= simd_min_macs "
                   "(512) of them")
    for o in fx.get("outputs", []):
        if o.get("integer"):
            click.echo(f"kmlc: fixed point, output '{o['name']}': integers, decided exactly on "
                       "the fixed-point values (report.txt)")
            continue
        click.echo(f"kmlc: fixed point, output '{o['name']}': " + (
            f"|fixed - float| <= {o['error_bound']:.3g}" if "error_bound" in o else
            f"class as float's wherever its top-2 gap > {o['gap']:.3g}") +
            " on inputs in the calibrated range (report.txt)")
    for w in r.warnings:
        click.echo(f"kmlc: warning: {w}", err=True)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@_INPUT_SHAPE
@click.option("--name", help="Model name; default: the file name.")
@click.option("--numerics", default="float", show_default=True,
              type=click.Choice(["float", "fixed"]))
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Rows .npy, for --numerics fixed.")
def inspect(model, input_shapes, name, numerics, calibration):
    """Print MODEL's IR after every pass, its schedule and its memory plan
    (MODEL as for compile)."""
    from .api import lower_model

    model, example_inputs = _model_arg(model, input_shapes)
    cal = _load_npy(calibration, "calibration data") if calibration else None
    lower_model(model, example_inputs, name=name, numerics=numerics, calibration=cal,
                print_after=lambda s, t: _print_stage(s, t, err=False))


@cli.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--kdir", type=click.Path(file_okay=False),
              help="Kernel build directory (default: running kernel's, else installed headers).")
@click.option("--llvm", is_flag=True, help="Build with LLVM=1 (clang), for a clang-built "
              "kernel: against --kdir, else Debian's kernel configuration of --arch prepared for "
              "clang (once, under ~/.cache/kmlc).")
@click.option("--sign", nargs=2, type=click.Path(dir_okay=False), metavar="KEY CERT",
              help="Sign the .ko with the kernel tree's scripts/sign-file (its "
              "CONFIG_MODULE_SIG_HASH, else sha256): private key, X.509 certificate.")
@click.option("--arch", default="x86_64", show_default=True, type=click.Choice(["x86_64", "arm64"]),
              help="arm64: cross-build with aarch64-linux-gnu-gcc against Debian's arm64 headers "
              "of the same kernel (fetched once), or --kdir; with --llvm, with clang against their "
              "configuration prepared for clang.")
def build(outdir, kdir, llvm, sign, arch):
    """Build OUTDIR/kernel into a .ko with W=1; any warning fails."""
    from .targets.kernel import build_module, sign_module, target_kdir

    ko = build_module(Path(outdir) / "kernel", kdir=kdir, llvm=llvm, arch=arch)
    k = target_kdir(kdir, llvm=llvm, arch=arch)
    signed = f", signed {sign_module(ko, *sign, k)}" if sign else ""
    click.echo(f"kmlc: built {ko} against {k} ({arch}, W=1{', LLVM=1' if llvm else ''}, "
               f"0 warnings{signed})")


@cli.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--dkms", is_flag=True, help="Write a DKMS source tree (DIR/<package>-<version>).")
@click.option("--deb", is_flag=True, help="Write Debian packages: the DKMS source (depends on "
              "dkms), and the userspace twin when OUTDIR has one.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="The directory to write into (created if missing).")
@click.option("--version", "pkg_version", default="1.0", show_default=True,
              help="The package version: raise it for every build you ship.")
@click.option("--maintainer", default="kmlc <kmlc@localhost>", show_default=True,
              help="The Debian packages' Maintainer field, 'Name <email>'.")
def package(outdir, dkms, deb, output, pkg_version, maintainer):
    """Package OUTDIR's kernel module for other machines: a DKMS source tree
    (--dkms), Debian packages (--deb), or both (docs/targets.md)."""
    from .targets.package import package as kpackage

    for f in kpackage(outdir, output, dkms=dkms, deb=deb, version=pkg_version,
                      maintainer=maintainer):
        click.echo(f"kmlc: wrote {f}")


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@_INPUT_SHAPE
@click.option("--like", required=True, type=click.Path(file_okay=False),
              help="The output directory of the compiled model whose weights these replace.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The weight set to write (.kmlw).")
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Fixed point: rows (N, in_elems) .npy for the new weights.")
@click.option("--version", "set_version", default=1, show_default=True,
              type=click.IntRange(0, 2**32 - 1), help="The weight set's version number.")
def pack(model, input_shapes, like, output, calibration, set_version):
    """Write MODEL's weights as a weight set (.kmlw) for the model compiled
    in --like, whose structure MODEL must have (docs/weights.md); `kmlc run
    --weights` and kmlc.load(OUTDIR, weights=...) run on it."""
    from .api import pack as kpack

    model, example_inputs = _model_arg(model, input_shapes)
    cal = _load_npy(calibration, "calibration data") if calibration else None
    r = kpack(model, like, output, example_inputs=example_inputs, calibration=cal,
              version=set_version)
    click.echo(f"kmlc: packed {r['name']} weights, version {r['version']}: {r['bytes']} B "
               f"({r['weight_bytes']} B of weights) -> {output}")


@cli.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--input", "input_", type=click.Path(dir_okay=False),
              help="float32 .npy of shape (N, in_elems).")
@click.option("--output", type=click.Path(dir_okay=False),
              help="Where to write float32 (N, out_elems).")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="A weight set (.kmlw, from kmlc pack) to run instead of the compiled one.")
@click.option("--arch", type=click.Choice(["arm64"]),
              help="Run the twin built for this architecture, under qemu-user (slow: for "
              "checking that it computes the same bits).")
@click.option("--goldens", is_flag=True,
              help="Instead of --input/--output: run the golden vectors (OUTDIR/goldens.npz, "
              "what KUnit and the self-test check) and compare the outputs bit for bit.")
def run(outdir, input_, output, weights, arch, goldens):
    """Run the twin in OUTDIR on every row of --input (or its golden vectors)."""
    from .api import load

    if goldens == bool(input_ or output) or bool(input_) != bool(output):
        raise click.UsageError("give --input and --output, or --goldens")
    twin = load(outdir, weights=weights, arch=arch)
    if goldens:
        from .api import check_goldens

        n = check_goldens(twin, Path(outdir))
        click.echo(f"kmlc: {n}/{n} golden vectors bit-identical ({arch or 'this machine'}'s "
                   "twin)")
        return
    x = _load_npy(input_, "input")
    if x.ndim != 2 or x.shape[1] != twin.in_elems:
        raise KmlcError(f"has shape {tuple(x.shape)}; {twin.name} takes rows of "
                        f"{twin.in_elems} values: shape (N, {twin.in_elems})", where=input_)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
            or x.dtype == np.bool_):
        raise KmlcError(f"has dtype {x.dtype}; expected float32 (or the model's integer "
                        "input type)", where=input_)
    # integer features as they are; floats as float32 (fixed point: encoded,
    # run, dequantized); outputs in the model's output type (bool, int64...)
    y = twin.run(x if twin.integer_inputs else x.astype(np.float32))
    output = output if output.endswith(".npy") else output + ".npy"   # as np.save names it
    try:
        np.save(output, y)
    except OSError as e:
        raise KmlcError(f"cannot write the outputs: {e.strerror or e}", where=output) from None
    click.echo(f"kmlc: {x.shape[0]} rows -> {output} {tuple(y.shape)}")


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", type=click.Path(dir_okay=False),
              help="Input rows (N, in_elems) .npy; default: random normal rows.")
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True)
@click.option("--atol", default=1e-5, show_default=True, help="Float: absolute tolerance.")
@click.option("--rtol", default=1e-5, show_default=True, help="Float: relative tolerance.")
@click.option("--numerics", default="float", show_default=True,
              type=click.Choice(["float", "fixed"]))
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Fixed: calibration rows .npy.")
@click.option("--weight-bits", default="auto", show_default=True, help="Fixed: as for compile.")
@click.option("--input-margin", default=0.0, show_default=True, type=float,
              help="Fixed: as for compile.")
@click.option("--headroom", type=float, help="Fixed: as for compile.")
@click.option("--min-agreement", default=99.0, show_default=True,
              help="Fixed: decision agreement with the float model, percent.")
@click.option("--min-sqnr", default=30.0, show_default=True, help="Fixed: output SQNR, dB.")
def verify(model, data, samples, seed, atol, rtol, numerics, calibration, weight_bits,
           input_margin, headroom, min_agreement, min_sqnr):
    """Compare MODEL's twin with onnxruntime; fails past the documented bounds."""
    from .verify import verify_fixed, verify_model

    x = _load_npy(data, "data") if data else None
    if numerics == "fixed":
        if calibration is None or x is None:
            raise KmlcError("verify --numerics fixed needs --calibration C.npy and --data T.npy "
                            "(held-out rows)")
        rep = verify_fixed(model, calibration=_load_npy(calibration, "calibration data"),
                           data=x, min_agreement=min_agreement, min_sqnr=min_sqnr,
                           weight_bits=weight_bits, input_margin=input_margin,
                           headroom=headroom)
        click.echo(rep.text())
        if not rep.ok:
            raise KmlcError("the fixed-point model departs from the float model beyond "
                            f"{min_agreement:g}% agreement or {min_sqnr:g} dB SQNR")
        return
    rep = verify_model(model, data=x, samples=samples, seed=seed, atol=atol, rtol=rtol)
    click.echo(rep.text())
    if not rep.ok:
        raise KmlcError(f"the twin is off on {rep.violations} element(s): beyond its arithmetic "
                        f"bound, beyond onnxruntime's own error against float64, and beyond "
                        f"atol={atol:g} + rtol={rtol:g}*|ref|"
                        if rep.violations else "the twin's argmax departs from onnxruntime's")


@cli.command()
@click.argument("outdirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--arch", default="um", show_default=True, type=click.Choice(["um", "x86_64", "arm64"]),
              help="um: gcc, no real FPU section; x86_64: modules of the debug kernel (lockdep, "
              "KASAN, UBSAN) under qemu; arm64: "
              "clang (LLVM=1) under qemu-system-aarch64 (kernel_neon_begin/end).")
@click.option("--jobs", type=int, help="Parallel build jobs (default: all cores).")
def kunit(outdirs, arch, jobs):
    """Run the KUnit suites of one or more compiled models."""
    from .targets.kunit import run as run_kunit

    res = run_kunit([Path(d) for d in outdirs], arch=arch, jobs=jobs)
    if not res["ok"]:
        raise KmlcError(f"KUnit ({arch}) failed: {res['summary']}")


@cli.command("qemu-test")
@click.argument("outdirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--kernel", type=click.Choice(["6.1", "6.12", "rt", "debug"]),
              help="The kernel to boot: Debian's 6.1 (default), 6.12 or PREEMPT_RT, or the "
                   "debug kernel kmlc builds (lockdep, KASAN, UBSAN, KFENCE).")
@click.option("--kdir", type=click.Path(file_okay=False),
              help="Or a Debian kernel build directory (its release picks the image).")
@click.option("--script", type=click.Path(dir_okay=False),
              help="Run this shell script in the guest instead of the hook's scenario; its "
                   "exit status decides (docs/hooks.md: what it finds ready).")
@click.option("--timeout", type=int,
              help="Seconds for the whole boot (default: 150 per model with a hook, 20 per "
                   "other, at least 600; on the debug kernel 450, 60, at least 1800).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="Save the serial log.")
@click.option("--weights", "weights", multiple=True, type=click.Path(dir_okay=False),
              help="A weight set (kmlc pack) to hot-swap in, repeatable: the swaps (--swaps) "
                   "cycle through them while the hook runs, each checked against the twin, "
                   "then forgeries and rollback (docs/weights.md).")
@click.option("--cycles", type=click.IntRange(1, 100000),
              help="Module unload/reload cycles under load per hooked model (default 25; 8 "
                   "on 6.12, 5 on the debug kernel and arm64); more for a soak, with --timeout.")
@click.option("--swaps", type=click.IntRange(2, 100000),
              help="Weight swaps per model given --weights (default 100; 20 on arm64).")
@click.option("--ko", type=click.Path(dir_okay=False),
              help="With one OUTDIR: boot this module, built elsewhere for the kernel booted "
                   "(by DKMS, say), instead of building OUTDIR/kernel.")
@click.option("--arch", default="x86_64", show_default=True, type=click.Choice(["x86_64", "arm64"]),
              help="arm64: Debian's arm64 6.1 kernel under qemu-system-aarch64 (TCG), the "
              "module cross-built against its headers.")
def qemu_test(outdirs, kernel, kdir, script, timeout, log_path, weights, ko, cycles, swaps,
              arch):
    """Boot a kernel in qemu, load the modules and test their hooks."""
    from .targets.qemu import run as run_qemu

    if ko and len(outdirs) != 1:
        raise KmlcError("--ko names the module of one model: give one OUTDIR with it")
    res = run_qemu([Path(d) for d in outdirs], kernel=kernel, kdir=kdir,
                   script=Path(script) if script else None, timeout=timeout,
                   log_path=Path(log_path) if log_path else None,
                   weights=[Path(w) for w in weights],
                   modules={Path(outdirs[0]): Path(ko)} if ko else None, arch=arch,
                   cycles=cycles, swaps=swaps)
    if not res["ok"]:
        raise KmlcError("qemu test failed: " + "; ".join(
            ln for ln in res["lines"] if "PASS" not in ln and "INFO" not in ln))


def _terminated(signum, frame):
    """SIGTERM unwinds like SIGINT, so a compile removes its temporary
    directory (api.compile cleans up on any BaseException)."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    # numpy's floating-point warnings never reach the user: every value that
    # matters is checked explicitly (finite constants, attributes, rows) and
    # refused with its location (docs/errors.md)
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
        cli.main(args=argv, prog_name="kmlc", standalone_mode=False)
        return 0
    except KmlcError as e:
        # one line: details (a compiler's or a kernel's output) only on request
        more = len(e.details.splitlines()) if e.details else 0
        if more and os.environ.get("KMLC_DEBUG"):
            click.echo(f"kmlc: error: {e.line()}\n{e.details}", err=True)
        else:
            hint = f" ({more} more line{'s' if more > 1 else ''} with KMLC_DEBUG=1)" if more else ""
            click.echo(f"kmlc: error: {e.line()}{hint}", err=True)
        return 1
    except click.exceptions.Abort:
        click.echo("kmlc: aborted", err=True)
        return 130
    except click.ClickException as e:     # usage: one line, exit 1 like every user error
        ctx = getattr(e, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        msg = " ".join(e.format_message().split())
        click.echo(f"kmlc: error: {where}{msg}{hint}", err=True)
        return 1
    except click.exceptions.Exit as e:
        return e.exit_code
    except Exception as e:  # a bug in kmlc
        if os.environ.get("KMLC_DEBUG"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        click.echo(f"kmlc: internal error: {type(e).__name__}: {first} (this is a kmlc bug; "
                   "set KMLC_DEBUG=1 for a traceback)", err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
