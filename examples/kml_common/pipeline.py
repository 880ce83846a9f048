"""The plumbing of the examples' one-command pipelines (run.py): the command
line and its one-line errors, worker processes, step timing, the kmlc
command line, the machine's description, and the README's results block."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


class Fail(Exception):
    """A pipeline step failed: run.py prints it as one line and exits 1."""


class Parser(argparse.ArgumentParser):
    def error(self, message):            # one line, no usage dump
        print(f"{self.prog}: {message}", file=sys.stderr)
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


def script(main) -> None:
    """Runs a script's ``main()`` and exits with its status; a Fail is one
    line on stderr, the script's name first, and status 1."""
    try:
        sys.exit(main())
    except Fail as e:
        print(f"{Path(sys.argv[0]).name}: {e}", file=sys.stderr)
        sys.exit(1)


def script_parser(doc: str, here: Path, name: str) -> Parser:
    """The command line of an example's measuring script: --quick, --jobs,
    --workdir (default HERE/build/NAME) and --out."""
    p = Parser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=here / "build" / name)
    p.add_argument("--out", type=Path)
    return p


def script_dirs(a, here: Path) -> tuple[Path, Path]:
    """(work, out) of a measuring script's arguments, created: out is
    --out, else the workdir with --quick, else HERE/results."""
    work = a.workdir.resolve()
    out = (a.out or (work if a.quick else here / "results")).resolve()
    for d in (work, out):
        d.mkdir(parents=True, exist_ok=True)
    return work, out


def run_record(t0: float) -> dict:
    """What a measuring script's results say of its run: the machine, and
    the seconds since ``t0`` (time.perf_counter())."""
    return {"machine": machine(), "seconds": round(time.perf_counter() - t0, 1)}


def write_results(out: Path, stem: str, res: dict, md: str) -> None:
    """OUT/STEM.json (``res``) and OUT/STEM.md (``md``, also printed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(md)


def pool(jobs: int):
    """A fork pool of ``jobs`` workers (None for one job); make it before
    torch starts any thread."""
    if jobs <= 1:
        return None
    import multiprocessing as mp
    return mp.get_context("fork").Pool(jobs)


def example_main(argv, doc: str, here: Path, pipeline) -> int:
    """The command line of a trained example (readahead, nfs_rsize): parses
    it, checks the packages, runs ``pipeline(args)``; every failure is one
    line on stderr and exit status 1 (2 for a bad argument)."""
    ex = f"examples/{here.name}"
    ap = Parser(description=doc.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small database and training, for tests (writes only under --workdir)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--workdir", type=Path, default=here / "build",
                    help=f"compiled models and training data (default {ex}/build)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"results directory (default {ex}/results, or WORKDIR/results "
                         "with --quick)")
    ap.add_argument("--no-build", action="store_true", help="do not build the kernel modules")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if (missing := missing_packages()):
        print(f"run.py: {missing}", file=sys.stderr)
        return 1
    try:
        return pipeline(args)
    except (Fail, OSError) as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 1


@contextmanager
def workers(jobs: int):
    """Yields a map over ``jobs`` worker processes (the builtin map for one),
    made before torch starts any thread; torch runs single-threaded and
    deterministic; a kmlc error inside becomes a Fail."""
    p = pool(jobs)
    import torch

    from kmlc.errors import KmlcError

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield p.imap if p else map
    except KmlcError as e:
        raise Fail(str(e)) from None
    finally:
        if p:
            p.close()
            p.join()


class Steps:
    """Wall-clock seconds of each pipeline step, printed as it ends; a step
    runs from the end of the one before."""

    def __init__(self):
        self.seconds: dict = {}
        self.start = self.last = time.time()

    def done(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(now - self.last, 1)
        self.last = now
        print(f"[{self.seconds[name]:6.1f}s] {name}", flush=True)

    def total(self) -> dict:
        self.seconds["total"] = round(time.time() - self.start, 1)
        return self.seconds


def example_paths(args, here: Path) -> tuple[Path, Path, Path, Path]:
    """(work, out, onnx, calibration) of a trained example, the first two
    created: a --quick run writes only under --workdir; a full run writes
    the model, its calibration rows and the results next to run.py."""
    work = args.workdir.resolve()
    home = work if args.quick else here
    out = (args.out or home / "results").resolve()
    for d in (work, out):
        d.mkdir(parents=True, exist_ok=True)
    return (work, out, home / f"{here.name}.onnx",
            work / "train_x.npy" if args.quick else here / "calibration.npy")


def train_and_export(train, x, y, classes, seed: int, epochs: int, work: Path, cal_path: Path,
                     onnx_path: Path, steps: "Steps"):
    """Saves the training rows (also the fixed-point calibration), runs
    10-fold cross-validation, fits on all rows and exports the ONNX model
    with the example's ``train`` module.  Returns the model and the
    training summary of results.json."""
    np.save(work / "train_x.npy", x)
    np.save(work / "train_y.npy", y)
    np.save(cal_path, x)
    steps.done("training traces")
    accs, conf = train.cross_validate(x, y, seed, k=10, epochs=epochs)
    # classes 0 and 1 (readrandom, readrandomwriterandom) share their setting
    merged = conf[:2, :2].sum() + np.trace(conf[2:, 2:])
    steps.done("10-fold cross-validation")
    model = train.fit(x, y, seed, epochs)
    train.export(model, onnx_path)
    steps.done("train on all rows, export")
    return model, {
        "rows_per_class": dict(zip(classes, np.bincount(y, minlength=len(classes)).tolist())),
        "feature_mean": x.mean(0).tolist(), "feature_std": x.std(0).tolist(),
        "cv_accuracy": accs, "cv_mean": float(np.mean(accs)), "cv_std": float(np.std(accs)),
        "cv_confusion": conf.tolist(),
        "cv_accuracy_random_classes_merged": float(merged / conf.sum()),
    }


def agreement(outdirs: dict, traces: dict, windows, predict) -> dict:
    """Decisions of the fixed and float twins in OUTDIRS, each with its own
    feature encoding (``windows(events, frac)``, the example's kmlc.features
    extractor) from the same event traces, and of the PyTorch model
    (``predict(float_features)``), per trace key and in all."""
    import kmlc

    fx, fl = kmlc.load(outdirs["fixed"]), kmlc.load(outdirs["float"])
    out, tot = {}, np.zeros(3, dtype=np.int64)
    for key, ev in sorted(traces.items()):
        wq, wf = windows(ev, fx.hook_frac), windows(ev, fl.hook_frac)
        assert np.array_equal(wq.closed_by, wf.closed_by)
        dq, df = fx.decide(wq.raw), fl.decide(wf.raw)
        dt = predict(wf.values.astype(np.float32))
        n = len(dq)
        out["/".join(key)] = {"windows": n, "fixed_vs_float": int((dq == df).sum()),
                              "float_vs_torch": int((df == dt).sum())}
        tot += [n, (dq == df).sum(), (df == dt).sum()]
    out["all"] = {"windows": int(tot[0]), "fixed_vs_float": int(tot[1]),
                  "float_vs_torch": int(tot[2])}
    return out


def compile_both(onnx_path: Path, cal_path: Path, hooks: str, work: Path, build: bool,
                 options=()):
    """``kmlc compile --hooks HOOKS [OPTIONS]`` fixed point (calibrated on
    CAL_PATH) and float into WORK/fixed and WORK/float, and ``kmlc build``
    both when BUILD and kernel headers are installed.  Returns (dirs,
    compiled, built), each keyed by "fixed" and "float"."""
    dirs = {"fixed": work / "fixed", "float": work / "float"}
    compiled = {
        "fixed": kmlc("compile", onnx_path, "-o", dirs["fixed"], "--numerics", "fixed",
                      "--calibration", cal_path, "--hooks", hooks, *options),
        "float": kmlc("compile", onnx_path, "-o", dirs["float"], "--hooks", hooks, *options),
    }
    built = {k: kmlc("build", d) for k, d in dirs.items()} if build and have_headers() else {}
    return dirs, compiled, built


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


def report_head(r: dict, timing: dict, *, training: str, paper_cv: float, tuned: str,
                axis: str, caption: str, digits: int, classes, policies) -> list:
    """The first lines of a trained example's results.md: the command, the
    cross-validation paragraph and confusion matrix, the fixed-vs-float
    agreement and the throughput of every policy relative to the first.
    ``training``: what the model was trained on; ``tuned``: the setting the
    classes choose; ``axis``: the results' outer key (its column's name);
    ``digits``: decimals of percentages and base throughputs."""
    t, a, col = r["training"], r["agreement"]["all"], axis
    lines = [f"Command: `{r['command']}`, {timing['total']:.0f} s on {machine()}.", ""]
    lines += [f"**Training** ({training}): "
              + ", ".join(f"{c} {n}" for c, n in t["rows_per_class"].items()) + " windows.  "
              f"10-fold cross-validation accuracy {100 * t['cv_mean']:.1f}% "
              f"± {100 * t['cv_std']:.1f}% (paper: {paper_cv}%); "
              f"{100 * t['cv_accuracy_random_classes_merged']:.{digits}f}% counting readrandom "
              f"and readrandomwriterandom (same {tuned}) as one class.", "",
              "| true \\ predicted | " + " | ".join(classes) + " |",
              "|---|" + "---|" * len(classes)]
    for c, row in zip(classes, t["cv_confusion"]):
        lines.append(f"| {c} | " + " | ".join(map(str, row)) + " |")
    lines += ["", f"**Fixed vs float**: the two compiled twins take the same decision on "
              f"{a['fixed_vs_float']} of {a['windows']} held-out windows "
              f"({100 * a['fixed_vs_float'] / max(1, a['windows']):.2f}%, all five workloads, "
              f"in every {col}); the float twin agrees with PyTorch on {a['float_vs_torch']}.", ""]
    lines += [caption, "", f"| {col} | workload | default MB/s | " + " | ".join(policies[1:])
              + " |", "|---|---|---|" + "---|" * (len(policies) - 1)]
    for k, per_w in r["results"].items():
        for w, per_p in per_w.items():
            base = per_p["default"]["throughput_mb_s"]
            lines.append(f"| {k} | {w} | {base:.{digits}f} | " + " | ".join(
                f"{per_p[p]['throughput_mb_s'] / base:.3f}" for p in policies[1:]) + " |")
    return lines


def classes_chosen(r: dict, policy: str, classes_of="learned-fixed") -> list:
    """Per outer key, the classes ``classes_of`` chose in each workload."""
    lines = []
    for k, per_w in r["results"].items():
        lines += [f"Classes the learned ({policy}) policy chose while measuring, {k}: "
                  + "; ".join(f"{w}: " + ", ".join(
                      f"{c} {n}" for c, n in per_p[classes_of]["decisions"].items() if n)
                      for w, per_p in per_w.items()) + ".", ""]
    return lines


def publish_run(out: Path, here: Path, args, results: dict, timing: dict, report, plot,
                png: str) -> int:
    """The end of a trained example's run: OUT/results.json, timing.json
    (with the machine), results.md (``report(results, timing)``) and the
    plot OUT/PNG; the README's results section too for a full run into the
    default directory."""
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "timing.json").write_text(json.dumps({"machine": machine(), "seconds": timing},
                                                indent=1) + "\n")
    md = report(results, timing)
    (out / "results.md").write_text(md)
    plot(results["results"], out / png)
    if not args.quick and args.out is None:
        update_readme(here / "README.md", md)
    print(f"results: {out}/results.md ({timing['total']:.0f} s)")
    return 0


def update_readme(readme: Path, md: str) -> None:
    """Puts ``md`` between the README's results markers."""
    if not readme.is_file():
        return
    text = readme.read_text()
    new = re.sub(r"(<!-- results:begin -->\n).*?(<!-- results:end -->)",
                 lambda m: m.group(1) + md + m.group(2), text, flags=re.S)
    readme.write_text(new)
