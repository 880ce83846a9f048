"""Tree ensembles: kmlc against onnxruntime, treelite (compiled by
tl2cgen), m2cgen's C and emlearn's C, per call on the same rows.

    .venv/bin/python benchmarks/trees.py [--out benchmarks/results/trees.md]

Models, trained here with fixed seeds on 11 integer Heimdall-like features
(tests/conformance/test_trees.py's): a single depth-10 tree (a one-tree
RandomForestClassifier on every row and feature, which treelite imports
where it refuses a DecisionTreeClassifier) and a 100-tree depth-6
RandomForestClassifier.  kmlc compiles each in float
and fixed point; every C system (kmlc's model C and the peers' generated C)
is built with the kernel's float flags read from the module kmlc builds
(benchmarks/bench_c.py: -O2, SSE2, no red zone, ...; kmlc's fixed point
with the integer flags) and timed by c/timing.c, one row per call, on the
same 8,192 rows (enough that no branch predictor learns their order: a
loop over 256 rows favours branch code, whose every branch it then
predicts).  onnxruntime is timed from Python, one row per
InferenceSession.run on one thread, as a caller of it would use it.  Every
system's class decisions are compared with scikit-learn's predict.  Bytes
per node: kmlc's weight set (thresholds, tables, leaf values) over the
ensemble's nodes, branches and leaves.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
sys.path.insert(0, str(ROOT / "tests"))

import bench_c  # noqa: E402

PEER_WRAPPER = {
    # treelite's predict() over its Entry union (doubles), margin off
    "tl2cgen": r"""
#include "header.h"
int peer_infer(const float *in, float *out, void *ws);
int peer_infer(const float *in, float *out, void *ws)
{
	union Entry e[NF];
	double r[2] = { 0, 0 };
	int i;

	for (i = 0; i < NF; i++)
		e[i].fvalue = in[i];
	predict(e, 0, r);
	out[0] = r[MAX_N_CLASS > 1 ? 1 : 0] > 0.5;
	return 0;
}
""",
    # m2cgen's score(double *input, double *output): class probabilities
    "m2cgen": r"""
void score(double *input, double *output);
int peer_infer(const float *in, float *out, void *ws);
int peer_infer(const float *in, float *out, void *ws)
{
	double x[NF], p[2];
	int i;

	for (i = 0; i < NF; i++)
		x[i] = in[i];
	score(x, p);
	out[0] = p[1] > p[0];
	return 0;
}
""",
    # emlearn's inline trees: its predict over float features
    "emlearn": r"""
#include "eml.h"
int peer_infer(const float *in, float *out, void *ws);
int peer_infer(const float *in, float *out, void *ws)
{
	out[0] = eml_predict(in, NF);
	return 0;
}
""",
}


def models():
    from sklearn.ensemble import RandomForestClassifier

    # the single tree as a one-tree forest on all rows and features: a
    # DecisionTreeClassifier that treelite's importer takes
    return {"a single depth-10 tree": RandomForestClassifier(
                n_estimators=1, bootstrap=False, max_features=None, max_depth=10,
                random_state=0),
            "a 100-tree depth-6 RandomForestClassifier":
                RandomForestClassifier(n_estimators=100, max_depth=6, random_state=0)}


def nodes_of(est) -> int:
    trees = getattr(est, "estimators_", [est])
    return int(sum(t.tree_.node_count for t in trees))


def peer_sources(est, work: Path) -> tuple[dict, dict]:
    """Each peer's generated C, {peer: (sources, include dirs)}, and why any
    peer did not run {peer: reason}."""
    out, skipped = {}, {}

    def tl2cgen(d):
        import tl2cgen
        import treelite

        tl2cgen.generate_c_code(treelite.sklearn.import_model(est), str(d), params={})
        return [d / "main.c"]

    def m2cgen(d):
        import m2cgen

        d.mkdir(parents=True)
        (d / "model.c").write_text(m2cgen.export_to_c(est))
        return [d / "model.c"]

    def emlearn(d):
        import emlearn

        d.mkdir(parents=True)
        emlearn.convert(est, method="inline", dtype="float").save(file=str(d / "eml.h"),
                                                                 name="eml")
        return []

    for name, gen in (("tl2cgen", tl2cgen), ("m2cgen", m2cgen), ("emlearn", emlearn)):
        mods = ("tl2cgen", "treelite") if name == "tl2cgen" else (name,)
        missing = [m for m in mods if importlib.util.find_spec(m) is None]
        if missing:
            skipped[name] = (f"not run: {', '.join(missing)} not installed "
                             "(pip install -e '.[bench]')")
            continue
        out[name] = (gen(work / name), [work / name])
    return out, skipped


def build_peer(peer: str, srcs, incs, nf: int, work: Path, flags: dict) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "wrapper.c").write_text(PEER_WRAPPER[peer])
    objs = []
    for src in [work / "wrapper.c", *srcs]:
        obj = work / (src.stem + f"_{peer}.o")
        bench_c.run([flags["cc"], *flags["fp"], f"-DNF={nf}", *[f"-I{i}" for i in incs],
                     "-Wno-error", "-w", "-c", "-o", obj, src])
        objs.append(obj)
    hdr = bench_c.target_header("int peer_infer(const float *in, float *out, void *ws);",
                                "float", str(nf), "1", "0", "peer_infer")
    return bench_c.link(work / "timing", work, objs, hdr, [], libs=["-lm"])


def ort_ns(onnx_model, rows: np.ndarray, calls: int) -> tuple[float, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(onnx_model.SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    one = [rows[i:i + 1] for i in range(len(rows))]
    for r in one[:200]:
        s.run(None, {name: r})
    times = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        s.run(None, {name: one[i % len(one)]})
        times.append(time.perf_counter_ns() - t0)
    labels = s.run(None, {name: rows})[0].reshape(-1)
    return float(statistics.median(times)), labels


def run_model(title: str, est, x, rows, work: Path, peak: dict, args) -> list[str]:
    import kmlc
    from kmlc.frontends import sklearn as sk

    work.mkdir(parents=True)
    want = est.predict(rows)
    exes, inputs = {}, {}
    flags = None
    for numerics in ("float", "fixed"):
        out = work / f"kmlc_{numerics}"
        kmlc.compile(est, x[:5], out, name="tree", numerics=numerics,
                     calibration=x if numerics == "fixed" else None, targets=["kernel", "user"])
        bench_c.build_module(out)
        obj = "tree_fx" if numerics == "fixed" else "tree_fp"
        cc, fl = bench_c.codegen_flags(bench_c.kbuild_command(out / "kernel" / f".{obj}.o.cmd"))
        flags = flags or {}
        flags["cc"] = cc
        flags["int" if numerics == "fixed" else "fp"] = fl
        twin = kmlc.load(out)
        meta = json.loads((out / "kmlc.json").read_text())
        key = f"kmlc, {numerics}"
        exes[key] = bench_c.build_kmlc(out, "tree", numerics, "kernel", flags, work / key)
        inputs[key] = twin.encode(rows) if numerics == "fixed" else rows
        if numerics == "float":
            weight_bytes = meta["weight_bytes"]
    peers, skipped = peer_sources(est, work / "peers")
    for peer, (srcs, incs) in peers.items():
        exes[peer] = build_peer(peer, srcs, incs, rows.shape[1], work / f"p_{peer}", flags)
        inputs[peer] = rows
    agree, per = bench_c.compare_and_time(exes, inputs, lambda k, y: y[:, 0], want, work, peak,
                                          args.rounds, args.samples)
    m, _ = sk.convert(est, x)
    ort_med, ort_labels = ort_ns(m, rows, args.samples // 4)
    med = {k: float(np.median(v)) for k, v in per.items()}
    nodes = nodes_of(est)
    lines = [f"## {title}", "",
             f"{nodes:,} nodes; kmlc's float weight set {weight_bytes:,} B "
             f"({weight_bytes / nodes:.1f} B per node).", "",
             "| system | ns per call (median of rounds) | rounds | onnxruntime / system | "
             f"decisions as scikit-learn's ({len(rows)} rows) |", "|---|---:|---|---:|---:|"]
    for k in exes:
        lines.append(f"| {k} | {med[k]:,.1f} | {min(per[k]):,.1f}-{max(per[k]):,.1f} | "
                     f"{ort_med / max(med[k], 0.1):,.0f}x | {agree[k]:.1%} |")
    for k, why in skipped.items():
        lines.append(f"| {k} | {why} | - | - | - |")
    lines.append(f"| onnxruntime {__import__('onnxruntime').__version__} (Python, one row "
                 f"per run, 1 thread) | {ort_med:,.0f} | - | 1x | "
                 f"{np.mean(ort_labels == want):.1%} |")
    return lines + [""]


def main(argv=None) -> int:
    from test_trees import heimdall_like

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "trees.md")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--work", type=Path, help="keep the builds here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    x, y, _ = heimdall_like(3000, 1)
    # rows enough that no branch predictor learns their sequence
    rows, _, _ = heimdall_like(args.rows, 32)
    lines = ["# Tree ensembles: kmlc against onnxruntime, treelite, m2cgen and emlearn", "",
             f"`.venv/bin/python benchmarks/trees.py` ({args.rounds} rounds of "
             f"{args.samples:,} calls per C system; the kernel's flags).  Times are medians "
             "of per-call TSC differences less the empty call's: where the TSC advances in "
             "steps (26 ticks, 10 ns, on the KVM guest these were measured on) a single tree's "
             "times are good to a step.", ""]
    with tempfile.TemporaryDirectory() as d:
        work = Path(args.work or d)
        peak = bench_c.machine_peaks(bench_c.build_peak(work / "peak"))
        for i, (title, est) in enumerate(models().items()):
            lines += run_model(title, est.fit(x, y), x, rows, work / f"m{i}", peak, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
