"""The admission hook's guards, measured: the learned model and a
deliberately wrong one, each with and without ``--guard``, on the
evaluation seeds, in the same closed-loop simulator as run.py.

    .venv/bin/python examples/admission/guards.py            # 50 seeds, about 4 minutes
    .venv/bin/python examples/admission/guards.py --seeds 4  # a small run (CI)

The models are run.py's checked-in ``results/heimdall.onnx`` (the learned
one) and the same network with its last layer negated (``inverted``: its
output is 1 - the learned one's, so it declines the reads the learned
model admits and admits the ones it declines), both compiled as run.py
compiles the learned one (fixed point, ``results/calibration.npy``,
``--hooks admission --hook-param history_writes=0``), with and without
``GUARDS``.  In the simulator the module's guard, one for both mirrors,
is the module's own C (``twin.guard_session``: kml_guard.h), its
decisions the twin's.

Writes OUT/guards.json and OUT/guards.md (OUT: examples/admission/results).
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from admission import evaluate, search, sim, traces  # noqa: E402
from kml_common.pipeline import Parser, kmlc, run_record, script, write_results  # noqa: E402

GUARDS = ["--guard", "benefit"]
MODELS = ("learned", "learned_guarded", "inverted", "inverted_guarded")
LABELS = {"learned": "learned", "learned_guarded": "learned, guarded",
          "inverted": "inverted (wrong)", "inverted_guarded": "inverted (wrong), guarded"}


def inverted(src: Path, dst: Path) -> None:
    """The model with its last Gemm's weights and bias negated: sigmoid(-z)
    = 1 - sigmoid(z), every decision the other way."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(src)
    last = [n for n in m.graph.node if n.op_type == "Gemm"][-1]
    for init in m.graph.initializer:
        if init.name in last.input[1:]:
            init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    onnx.save(m, dst)


def run_seed(seed: int, cfg: traces.Config, dirs: dict) -> dict:
    """Average read latency (us) of the baseline and each model on one
    trace, and the guarded models' counters."""
    tr = traces.generate(seed, cfg)
    # the reads arriving in the trace's second half: where a policy ends
    t_read = np.array([t for t, w in zip(tr.t, tr.write) if not w])
    late = t_read >= cfg.duration_s * 1e9 / 2
    base = sim.simulate(tr, sim.Policy()).latency_ns
    out = {"baseline": {"avg": float(base.mean() / 1e3), "avg_late": float(base[late].mean() / 1e3)}}
    for name in MODELS:
        res = sim.simulate(tr, sim.heimdall(tr.size, **evaluate.hooked(dirs[name])))
        out[name] = {"avg": float(res.latency_ns.mean() / 1e3),
                     "avg_late": float(res.latency_ns[late].mean() / 1e3),
                     "reroute": float(res.rerouted.mean()),
                     **{k: int(v) for k, v in res.counters.items() if k.startswith("guard_")}}
    return out


def summary(per_seed: list[dict]) -> dict:
    base = np.array([r["baseline"]["avg"] for r in per_seed])
    out = {"baseline": {"avg": float(base.mean()), "avg_sd": float(base.std(ddof=1))}}
    late = np.array([r["baseline"]["avg_late"] for r in per_seed])
    for name in MODELS:
        a = np.array([r[name]["avg"] for r in per_seed])
        ratio = a / base
        ratio_late = np.array([r[name]["avg_late"] for r in per_seed]) / late
        s = {"avg": float(a.mean()), "avg_sd": float(a.std(ddof=1)),
             "ratio_mean": float(ratio.mean()), "ratio_max": float(ratio.max()),
             "late_ratio_mean": float(ratio_late.mean()),
             "late_ratio_max": float(ratio_late.max()),
             "seeds_at_or_below_baseline": int((a <= base).sum()),
             "reroute": float(np.mean([r[name]["reroute"] for r in per_seed]))}
        if name.endswith("_guarded"):
            s["demoted_seeds"] = int(sum(r[name]["guard_demotions"] > 0 for r in per_seed))
            for k in ("demotions", "promotions", "periods"):
                s[k] = int(sum(r[name][f"guard_{k}"] for r in per_seed))
        out[name] = s
    return out


def markdown(res: dict) -> str:
    s, n, g = res["summary"], res["settings"]["seeds"], res["settings"]["guard"]
    L = [f"# The admission hook's guards on {n} evaluation seeds\n",
         f"`{res['command']}` on {res['run']['machine']}, {res['run']['seconds']} s.  "
         f"Guards: `{' '.join(res['settings']['guards'])}` (docs/hooks.md, \"Guards\"; "
         f"the compiled parameters: of the reads the model declines, one in "
         f"{g['benefit_every']} is kept on the primary as the control; periods of "
         f"{g['benefit_samples']} latencies per arm; the model is demoted when, over the last "
         f"{g['benefit_periods']} periods, the reads it sent to the other leg were more than "
         f"{g['benefit_margin_pct']}% slower than the declined reads kept, and trusted again "
         f"when they were {g['benefit_margin_pct']}% faster; demoted, one decline in "
         f"{g['benefit_probe_every']} still goes to the other leg).  Read latency "
         "in us, each seed's average; the ratio is to the baseline's (every read to its "
         "primary) on the same seed; the second half: the reads arriving in the last "
         "second of each 2-second trace.\n",
         "| policy | avg (us), mean ± sd | ratio to baseline, mean | worst seed | "
         "seeds at or below baseline | second half: ratio, mean | worst seed | reroute rate | "
         "seeds demoted |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
         f"| baseline | {s['baseline']['avg']:.1f} ± {s['baseline']['avg_sd']:.1f} | 1.000 | "
         f"1.000 | {n}/{n} | 1.000 | 1.000 | 0.0% | |"]
    for name in MODELS:
        r = s[name]
        dem = f"{r['demoted_seeds']}/{n}" if "demoted_seeds" in r else ""
        L.append(f"| {LABELS[name]} | {r['avg']:.1f} ± {r['avg_sd']:.1f} | "
                 f"{r['ratio_mean']:.3f} | {r['ratio_max']:.3f} | "
                 f"{r['seeds_at_or_below_baseline']}/{n} | {r['late_ratio_mean']:.3f} | "
                 f"{r['late_ratio_max']:.3f} | {100 * r['reroute']:.1f}% | {dem} |")
    L += ["", "The guardrails issue's targets for admission:", ""]
    L += [f"* {text}: {'yes' if ok else 'no'}" for text, ok in targets(s, n)]
    L.append("")
    return "\n".join(L)


def targets(s: dict, n: int) -> list[tuple[str, bool]]:
    """The guardrails issue's admission targets, each (text, met)."""
    good, bad = s["learned_guarded"], s["inverted_guarded"]
    return [
        (f"the learned model, guarded, at or below the baseline on every seed "
         f"({good['seeds_at_or_below_baseline']}/{n})", good["seeds_at_or_below_baseline"] == n),
        (f"the wrong model demoted on every seed ({bad['demoted_seeds']}/{n})",
         bad["demoted_seeds"] == n),
        (f"the wrong model, guarded, within 2% of the baseline on average "
         f"({bad['ratio_mean']:.3f})", bad["ratio_mean"] <= 1.02),
        (f"... and where each run ends, every seed's second half "
         f"(worst {bad['late_ratio_max']:.3f})", bad["late_ratio_max"] <= 1.02),
        (f"... and over every seed's whole run, its first demotion's cost included "
         f"(worst {bad['ratio_max']:.3f})", bad["ratio_max"] <= 1.02),
    ]


def main(argv=None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=50, help="evaluation seeds (default 50)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--build", type=Path, default=HERE / "build" / "guards")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--guard", action="append", help="a --guard SPEC instead of GUARDS's "
                   "(repeatable)")
    a = p.parse_args(argv)
    guards = [x for g in a.guard for x in ("--guard", g)] if a.guard else GUARDS
    if a.seeds < 2:
        p.error("--seeds must be at least 2")
    t0 = time.perf_counter()
    src, cal = HERE / "results" / "heimdall.onnx", HERE / "results" / "calibration.npy"
    build = a.build.resolve()
    build.mkdir(parents=True, exist_ok=True)
    onnx = {"learned": src, "inverted": build / "inverted.onnx"}
    inverted(src, onnx["inverted"])
    dirs = {}
    for name in MODELS:
        base = name.removesuffix("_guarded")
        dirs[name] = build / name
        kmlc(*search.compile_cmd(onnx[base], dirs[name], cal, False, "--target", "kernel",
                                 "--target", "user", *(guards if name != base else [])))
    # the guard's parameters as compiled (--guard and the hook's defaults)
    guard_cfg = json.loads((dirs["learned_guarded"] / "kmlc.json").read_text())["guard"]
    cfg = traces.Config(duration_s=2.0)
    seeds = list(range(a.seeds))
    ctx = get_context("spawn")
    with ProcessPoolExecutor(a.jobs, mp_context=ctx) as ex:
        per_seed = list(ex.map(run_seed, seeds, [cfg] * len(seeds), [dirs] * len(seeds)))
    res = {"command": " ".join(["python", "examples/admission/guards.py", *(argv or sys.argv[1:])]),
           "settings": {"seeds": a.seeds, "guards": guards, "guard": guard_cfg, "models": {
               "learned": "examples/admission/results/heimdall.onnx",
               "inverted": "the same, last layer negated"}},
           "summary": evaluate.rounded(summary(per_seed), 5),
           "seeds": [evaluate.rounded(r, 5) for r in per_seed],
           "run": run_record(t0)}
    write_results(a.out, "guards", res, markdown(res))
    return 0


if __name__ == "__main__":
    script(main)
