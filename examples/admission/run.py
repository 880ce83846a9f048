"""kmlc's I/O admission worked example, end to end, in one command:

    .venv/bin/python examples/admission/run.py            # 3-4 minutes on 2 cores
    .venv/bin/python examples/admission/run.py --quick    # a small run (CI)

1. traces: synthetic replicated-SSD traces (traces.py), training seeds
   1000.., evaluation seeds 0..N-1 (disjoint);
2. data: the baseline on the training traces, the features as the hook
   computes them (kmlc.features) with the history the module is compiled
   with (default: reads only, ``--hook-param history_writes=0``),
   Heimdall's period-based labels with 3-stage noise filtering
   (labeling.py), their constants chosen by a grid search on the training
   traces (search.py; ``--labels artifact``: the artifact's constants);
3. models: Heimdall's 11 -> 128 -> 16 -> 1 and a LinnOS-like 31 -> 256 -> 2,
   trained with PyTorch on the first half of each stream, tested on the
   second (train.py); exported to ONNX;
4. kmlc: ``kmlc compile heimdall.onnx --numerics fixed --calibration
   <training rows> --hooks admission --hook-param history_writes=0``,
   ``kmlc verify --numerics fixed``,
   ``kmlc build`` when kernel headers are installed; the LinnOS model
   compiled float for the simulator;
5. evaluation: every policy on every evaluation seed in a closed-loop
   simulator (sim.py), the learned policy being the compiled hook's own
   features and decisions (evaluate.py);
6. results: OUT/results.json, OUT/results.md, OUT/latency.png and the two
   models' .onnx (OUT defaults to examples/admission/results/).

Same seeds, same numbers: everything is seeded and single-threaded.
"""
from __future__ import annotations

import json
import tempfile
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from admission import evaluate, search, traces, train  # noqa: E402
from kml_common.pipeline import Fail, Parser, kmlc, machine, missing_packages  # noqa: E402

TRAIN_SEEDS = 1000


def fail(msg: str) -> None:
    print(f"run.py: {msg}", file=sys.stderr)
    sys.exit(1)


def rel(text: str) -> str:
    """Paths in the repository relative to its root (results do not depend
    on where the clone is)."""
    return text.replace(str(ROOT) + "/", "")


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small run: 2 training seeds, 4 evaluation seeds, 1 s traces")
    p.add_argument("--seeds", type=int, help="evaluation seeds (default 50; --quick: 4)")
    p.add_argument("--out", type=Path, default=HERE / "results",
                   help="results directory (default: examples/admission/results)")
    p.add_argument("--build", type=Path, help="where kmlc writes the compiled models "
                   "(default: OUT/../build, or OUT/build for --out)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--history", choices=("reads", "all"), default="reads",
                   help="what the hook's history holds: the reads completed on the primary "
                   "(default; the module's history_writes=0), or every read and write")
    p.add_argument("--labels", choices=("searched", "artifact"), default="searched",
                   help="the period labeling's constants: searched on the training traces "
                   "(default), or Heimdall's artifact's, over every I/O")
    a = p.parse_args(argv)
    if a.seeds is not None and a.seeds < 2:
        p.error("--seeds must be at least 2")
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    return a


def settings(quick: bool, seeds: int | None) -> dict:
    if quick:
        short = traces.Config(duration_s=1.0)
        return {"train_seeds": 3, "eval_seeds": seeds or 4, "epochs": 8, "verify_rows": 1000,
                "train_cfg": short, "eval_cfg": short, "grid": search.QUICK_GRID}
    return {"train_seeds": 8, "eval_seeds": seeds or 50, "epochs": 12, "verify_rows": 5000,
            "train_cfg": traces.Config(duration_s=2.0), "eval_cfg": traces.Config(duration_s=2.0),
            "grid": search.GRID}


def main(argv=None) -> int:
    a = parse_args(argv)
    if (msg := missing_packages([("lightgbm", "pip install -e '.[trees]'"),
                                 ("onnxmltools", "pip install -e '.[trees]'")])):
        raise Fail(msg)
    # one pool for the label search and the evaluation, before torch starts threads
    ex = ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) if a.jobs > 1 else None
    try:
        return pipeline(a, argv, ex.map if ex else map)
    finally:
        if ex:
            ex.shutdown()


def pipeline(a, argv, pmap) -> int:
    from kmlc import features

    S = settings(a.quick, a.seeds)
    out = a.out.resolve()
    build = (a.build or (HERE / "build" if out == HERE / "results" else out / "build")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    build.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timing = {}

    def stage(name, t0):
        timing[name] = round(time.perf_counter() - t0, 1)
        print(f"[{timing[name]:6.1f} s] {name}", flush=True)

    # 1-2. training data; the history and the labels
    t0 = time.perf_counter()
    seeds = list(range(TRAIN_SEEDS, TRAIN_SEEDS + S["train_seeds"]))
    history_writes = a.history == "all"
    heim, lin, blk, dstats = train.collect(seeds, S["train_cfg"], history_writes)
    stage("training data (baseline on the training traces, labels)", t0)
    labels = {"constants": "artifact", **search.ARTIFACT_POINT}
    if a.labels == "searched":
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            points, best = search.search(pmap, heim, heim.x, seeds, S["train_cfg"], S["grid"],
                                         S["epochs"], Path(tmp), history_writes,
                                         log=lambda m: print(m, flush=True))
        labels = {"constants": "searched", **{k: v for k, v in best.items() if k != "dir"},
                  "grid": [{k: v for k, v in g.items() if k != "dir"} for g in points]}
        heim.y, heim.keep = search.labels_of(heim, best["label_on"], search.params_of(best))
        dstats.update(train.label_stats(heim.y, heim.keep, heim.gc))
        stage(f"label search: {len(points)} settings on the training traces", t0)

    # 3. models
    t0 = time.perf_counter()
    hmodel = train.train_heimdall(heim, epochs=S["epochs"])
    # diagnostic: the same model trained on the device state instead of the labels
    truth = train.Data(heim.x, heim.gc.astype(np.int64), np.ones(len(heim.gc), bool), heim.train)
    gmodel = train.train_heimdall(truth, epochs=S["epochs"])
    lmodels = {"linnos": train.train_linnos(lin), "linnos_block": train.train_linnos(blk)}
    lgbm = train.train_lgbm(heim)
    test = ~heim.train
    p = train.predict(hmodel, heim.x[test])[:, 0]
    acc = {"heimdall_all": train.metrics(heim.y[test], p, p >= 0.5),
           "heimdall_filtered": train.metrics(heim.y[test & heim.keep], p[heim.keep[test]],
                                              p[heim.keep[test]] >= 0.5)}
    pg = train.predict(gmodel, heim.x[test])[:, 0]
    acc["heimdall_gc_vs_gc"] = train.metrics(heim.gc[test], pg, pg >= 0.5)
    acc["heimdall_vs_gc"] = train.metrics(heim.gc[test], p, p >= 0.5)
    pl = lgbm.predict_proba(heim.x[test].astype(np.float32))[:, 1]
    acc["lgbm"] = train.metrics(heim.y[test], pl, lgbm.predict(heim.x[test].astype(np.float32)))
    for name, d in (("linnos", lin), ("linnos_block", blk)):
        o = train.predict(lmodels[name], d.x[~d.train])
        acc[name] = train.metrics(d.y[~d.train], o[:, 1] - o[:, 0], o[:, 1] > o[:, 0])
        # the same reads in the same order: LinnOS's predictions against the period labels
        acc[name + "_vs_period_labels"] = train.metrics(heim.y[test], o[:, 1] - o[:, 0],
                                                        o[:, 1] > o[:, 0])
    onnx = {"heimdall": out / "heimdall.onnx", "linnos": out / "linnos.onnx",
            "linnos_block": out / "linnos_block.onnx", "heimdall_gc": build / "heimdall_gc.onnx",
            "lgbm": out / "lgbm.onnx"}
    train.export(hmodel, 11, onnx["heimdall"])
    train.export(gmodel, 11, onnx["heimdall_gc"])
    for name, m in lmodels.items():
        train.export(m, 31, onnx[name])
    train.export_lgbm(lgbm, onnx["lgbm"])
    stage("models trained and exported", t0)

    # 4. kmlc
    t0 = time.perf_counter()
    # The fixed-point calibration: 4,000 evenly spaced training rows and each
    # feature's extremes, checked in next to the model so that its module
    # compiles from a fresh clone.
    cal = out / "calibration.npy"
    held = build / "heldout.npy"
    xtrain = heim.x[heim.train]
    np.save(cal, train.calibration_rows(xtrain))
    # kmlc verify runs the reference evaluator row by row: 5,000 evenly spaced rows
    xt = heim.x[test]
    np.save(held, train.evenly_spaced(xt, S["verify_rows"]).astype(np.float32))
    dirs = {k: build / k for k in onnx}
    hdir = dirs["heimdall"]
    # the module carries the history the model was trained with
    compiled = kmlc(*search.compile_cmd(onnx["heimdall"], hdir, cal, history_writes))
    kmlc(*search.compile_cmd(onnx["heimdall_gc"], dirs["heimdall_gc"], cal, history_writes,
                             "--target", "kernel", "--target", "user"))
    kmlc(*search.compile_cmd(onnx["lgbm"], dirs["lgbm"], cal, history_writes,
                             "--target", "kernel", "--target", "user"))
    for name in lmodels:
        kmlc("compile", onnx[name], "-o", dirs[name], "--target", "user")
    verify_text = kmlc("verify", onnx["heimdall"], *search.FIXED, "--calibration", cal,
                       "--data", held)["output"]
    try:
        from kmlc.targets.kernel import find_kdir
        find_kdir()
        built = kmlc("build", hdir)["output"]
    except Exception as e:            # no kernel headers: the module is not built
        built = f"not built ({str(e).splitlines()[0]})"
    # the hook's own decision on the held-out reads (features recomputed with
    # the hook's fraction bits from the same events) vs the float model
    import kmlc as kmlc_api
    twin = kmlc_api.load(hdir)
    raw = np.concatenate([features.admission(ev, frac=twin.hook_frac).raw[~half]
                          for ev, half in zip(heim.events, heim.halves)])
    hook_dec = twin.decide(raw)
    agree = int((hook_dec == (p >= 0.5)).sum())
    acc["hook_vs_float"] = {"agree": agree, "rows": int(len(p)),
                            "percent": round(100.0 * agree / len(p), 3)}
    acc["hook"] = train.metrics(heim.y[test], p, hook_dec)
    # the LightGBM policy's hook, the same way, against LightGBM's predict
    ltwin = kmlc_api.load(dirs["lgbm"])
    lraw = np.concatenate([features.admission(ev, frac=ltwin.hook_frac).raw[~half]
                           for ev, half in zip(heim.events, heim.halves)])
    lagree = int((ltwin.decide(lraw) == lgbm.predict(xt.astype(np.float32)).astype(bool)).sum())
    acc["lgbm_hook_vs_lightgbm"] = {"agree": lagree, "rows": int(len(xt)),
                                    "percent": round(100.0 * lagree / len(xt), 3)}
    stage("kmlc compile, verify, build", t0)

    # 5. evaluation
    t0 = time.perf_counter()
    eval_seeds = list(range(S["eval_seeds"]))
    per_seed = list(pmap(evaluate.run_seed, eval_seeds, [S["eval_cfg"]] * len(eval_seeds),
                         [dirs] * len(eval_seeds)))
    agg = evaluate.aggregate(per_seed)
    stage(f"evaluation: {len(eval_seeds)} seeds x {len(evaluate.POLICIES)} policies", t0)
    ablation = mix = None
    if not a.quick:
        t0 = time.perf_counter()
        ablation = evaluate.probe_ablation(seeds, S["train_cfg"], dirs)
        stage("probe_every ablation on the training traces", t0)
        if history_writes:          # what share of the history is writes
            t0 = time.perf_counter()
            mix = evaluate.history_mix(seeds, S["train_cfg"], dirs)
            stage("the hook's history on the training traces", t0)

    # 6. results
    from admission import report

    results = evaluate.rounded({
        "command": " ".join(["python", "examples/admission/run.py", *(argv or sys.argv[1:])]),
        "settings": {"train_seeds": list(seeds), "eval_seeds": [eval_seeds[0], eval_seeds[-1]],
                     "history": a.history, "labels": labels,
                     "epochs": S["epochs"], "train_cfg": vars(S["train_cfg"]),
                     "eval_cfg": vars(S["eval_cfg"])},
        "training_data": dstats,
        "accuracy": acc,
        "kmlc": {"compile": compiled["command"],
                 "compiled": rel(compiled["output"]), "built": rel(built),
                 "verify": rel(verify_text),
                 "hook_frac": twin.hook_frac.tolist()},
        "policies": agg,
        "probe_every_on_training_traces": ablation,
        "history_on_training_traces": mix,
        "seeds": [{"trace": r["trace"][0], **{k: r[k][0] for k in evaluate.POLICIES}}
                  for r in per_seed],
    }, 5)
    report.plot(per_seed, agg, out / "latency.png")
    timing["total"] = round(time.perf_counter() - t_start, 1)
    run_info = {"machine": machine(), "timing_s": timing}
    (out / "results.json").write_text(json.dumps({**results, "run": run_info}, indent=1) + "\n")
    (out / "results.md").write_text(report.markdown(results, run_info))
    print(report.table(results))
    print(f"total {timing['total']} s; results in {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        fail(str(e))
    except OSError as e:                 # e.g. an --out that cannot be written
        fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
