"""Tables and plots of one benchmark run (benchmarks/bench.py).

Writes to the results directory:
  benchmarks.md     the tables (headline ratios first)
  results.json      every statistic, for scripts
  latency.png       ns per call, per model and system (log scale)
  sweep.png         the width sweep: ns per call and bytes against MACs
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# kmlc's own systems: (numerics, flags)
# ("fixed", "kernel") is the scalar path (any context); "kernel-sse2" and
# "kernel-avx2" are the SIMD paths (kml_simd.h), where the CPU has them
KMLC = [("float", "kernel"), ("fixed", "kernel"), ("fixed", "kernel-sse2"),
        ("fixed", "kernel-avx2"), ("float", "native"), ("fixed", "native")]
# The headline compares kmlc's kernel-flag twins with these.
PEERS = ["tvm", "onnxruntime", "pytorch", "torch.compile", "naive C"]
LABEL = {("float", "kernel"): "kmlc float, kernel flags",
         ("fixed", "kernel"): "kmlc fixed, kernel flags, scalar path",
         ("fixed", "kernel-sse2"): "kmlc fixed, kernel flags, SSE2 path",
         ("fixed", "kernel-avx2"): "kmlc fixed, kernel flags, AVX2 path",
         ("float", "native"): "kmlc float, -O3 -march=native",
         ("fixed", "native"): "kmlc fixed, -O3 -march=native",
         "naive C": "naive C loop, -O2", "tvm": "TVM llvm (time_evaluator)",
         "onnxruntime": "onnxruntime, 1 thread", "pytorch": "PyTorch eager, 1 thread",
         "torch.compile": "torch.compile (inductor), 1 thread"}
# Which roof each system runs against (c/peak.c measures them).
ROOF = {("float", "kernel"): "sse2_mac", ("fixed", "kernel"): "pair_mac",
        ("float", "native"): "native_mac", ("fixed", "native"): "native_mac",
        "naive C": "f32_mac"}

# Headline targets of the benchmark issue, checked on every run.
TARGETS = [
    ("readahead", ("float", "kernel"), "tvm", "ratio", 30.0,
     "readahead, float twin (kernel flags) >= 30x faster than TVM llvm"),
    ("readahead", ("float", "kernel"), "onnxruntime", "ratio", 50.0,
     "readahead, float twin (kernel flags) >= 50x faster than onnxruntime"),
    ("heimdall", ("float", "kernel"), None, "cpm", 0.3,
     "Heimdall, float (SSE2 only) <= 0.3 cycles/MAC"),
    ("heimdall", ("fixed", "kernel"), None, "cpm", 1.0,
     "Heimdall, fixed, scalar path (no SSE) <= 1.0 cycles/MAC"),
    ("heimdall", ("fixed", "kernel-avx2"), ("float", "kernel"), "ratio", 1.0,
     "Heimdall, fixed AVX2 path no slower than float (float / fixed >= 1)"),
    ("linnos", ("fixed", "kernel-avx2"), ("float", "kernel"), "ratio", 1.0,
     "LinnOS, fixed AVX2 path no slower than float (float / fixed >= 1)"),
    ("heimdall", ("fixed", "kernel-sse2"), ("float", "kernel"), "ratio", 1.0,
     "Heimdall, fixed SSE2 path no slower than float (float / fixed >= 1)"),
    ("linnos", ("fixed", "kernel-sse2"), ("float", "kernel"), "ratio", 1.0,
     "LinnOS, fixed SSE2 path no slower than float (float / fixed >= 1)"),
    # memory, from the models' memory plans (the bench's own calibration rows)
    ("heimdall", "fixed", None, "bytes", 5000,
     "Heimdall, fixed weights + workspace <= 5,000 B"),
    ("linnos", "fixed", "float", "share", 0.55,
     "LinnOS, fixed weights <= 55% of float's"),
]


def key_name(k) -> str:
    return f"kmlc {k[0]} {k[1]}" if isinstance(k, tuple) else k


def fmt_ns(v: float) -> str:
    if v >= 100_000:
        return f"{v / 1000:,.0f} us"
    if v >= 10_000:
        return f"{v / 1000:.1f} us"
    return f"{v:,.0f}"


def fmt_ratio(r: dict | None) -> str:
    if not r:
        return "n/a"
    return f"**{r['median']:.1f}x** ({r['min']:.1f}-{r['max']:.1f})"


def why(m: dict, k) -> str:
    """Why system k has no numbers, fit for a table cell."""
    text = m["unavailable"].get(k, "not run")
    return " ".join(text.replace("|", "/").split())


def write(out: Path, models: list[dict], sweep: list[dict], peaks: dict, info: dict,
          kflags: dict, cmd: str, elapsed: float, py_timer: float, plots: bool = True,
          steps: dict | None = None) -> list[Path]:
    core_ghz = peaks["tsc_hz"] * peaks["core_per_tsc"] / 1e9
    bursts = [c * peaks["tsc_hz"] / 1e9 for m in models + sweep for c in m.get("clocks", [])]
    L = []
    L.append("# kmlc benchmark: kmlc against TVM, onnxruntime, PyTorch and the roofline\n")
    L.append(f"Command: `{cmd}` ({elapsed / 60:.1f} min, one run).  ")
    L.append(f"Machine: {info['cpu']} ({info['hypervisor']} guest), {info['cores']} cores, "
             f"{info['os']}, Linux {info['kernel']}, gcc {info['gcc']}, "
             f"Python {info['python']}.  ")
    vers = {}
    for m in models:
        vers.update(m.get("versions", {}))
    if vers:
        L.append("Peers: " + ", ".join(f"{k} {v}" for k, v in sorted(vers.items())) + ".  ")
    clock = (f"; before each timed burst, median {np.median(bursts):.2f} GHz "
             f"(range {min(bursts):.2f}-{max(bursts):.2f})" if bursts else "")
    L.append(f"Clocks: TSC {peaks['tsc_hz'] / 1e9:.3f} GHz; core {core_ghz:.2f} GHz at the "
             f"start{clock} (measured: a chain of dependent register adds against the TSC).\n")
    L.append("Single-sample calls, one thread.  C systems: per-call rdtsc samples in a C "
             "loop (timer cost subtracted); onnxruntime and PyTorch: perf_counter_ns "
             f"per call from Python (timer cost, {py_timer:.0f} ns, subtracted); TVM: its "
             "own time_evaluator, one call per repeat.  Each round visits every system of "
             "a model in turn; medians and p99 pool all rounds.\n")

    # -- headline ------------------------------------------------------------
    L.append("## Headline: how many times faster kmlc is per call\n")
    L.append("Peer median / kmlc median, taken per round, median over rounds (min-max over "
             "rounds in parentheses).  kmlc is the twin built with the kernel's "
             "code-generation flags, i.e. what the module runs.\n")
    cols = PEERS
    L.append("| model | shape | MACs | kmlc | " + " | ".join(f"vs {c}" for c in cols) + " |")
    L.append("|---|---|---:|---|" + "---|" * len(cols))
    for m in models:
        for base in (("float", "kernel"), ("fixed", "kernel")):
            cells = []
            for c in cols:
                r = m.get("ratios", {}).get((base, c))
                cells.append(fmt_ratio(r) if r else f"n/a: {why(m, c)}")
            L.append(f"| {m['spec'].name} | {m['shape']} | {m['macs']:,} | {base[0]} | "
                     + " | ".join(cells) + " |")
    L.append("")

    # -- targets ---------------------------------------------------------------
    L.append("## Targets\n")
    L.append("| target | measured | met |")
    L.append("|---|---|---|")
    for model, base, peer, kind, goal, text in TARGETS:
        m = next((x for x in models if x["spec"].name == model), None)
        if m is not None and kind in ("bytes", "share"):
            size = m["sizes"][base]
            if kind == "bytes":
                got = size["weights"] + size["workspace"]
                ok, shown = got <= goal, (f"{got:,} B ({size['weights']:,} B weights, "
                                          f"{size['workspace']:,} B workspace)")
            else:
                got = size["weights"] / m["sizes"][peer]["weights"]
                ok, shown = got <= goal, (f"{100 * got:.1f}% ({size['weights']:,} B against "
                                          f"{m['sizes'][peer]['weights']:,} B)")
            L.append(f"| {text} | {shown} | {'yes' if ok else '**no**'} |")
            continue
        if m is None or base not in m.get("stats", {}):
            L.append(f"| {text} | not measured in this run | - |")
            continue
        if kind == "ratio":
            r = m["ratios"].get((base, peer))
            if not r:
                L.append(f"| {text} | {peer} not run: {why(m, peer)} | - |")
                continue
            ok = r["median"] >= goal
            L.append(f"| {text} | {r['median']:.1f}x (rounds {r['min']:.1f}-{r['max']:.1f}x) "
                     f"| {'yes' if ok else '**no**'} |")
        else:
            cpm = m["stats"][base]["cycles_per_mac"]
            ok = cpm <= goal
            tsc = cpm / (m["stats"][base]["core_ghz"] * 1e9 / peaks["tsc_hz"])
            L.append(f"| {text} | {cpm:.3f} core cycles/MAC ({tsc:.3f} TSC ticks/MAC) "
                     f"| {'yes' if ok else '**no**'} |")
    L.append("")

    # -- latency ---------------------------------------------------------------
    L.append("## ns per call\n")
    L.append("Cycles per MAC are core cycles: median ns x the core clock measured before "
             "that system's bursts / MACs; \"% of roof\" compares MACs per cycle with the "
             "measured peak of the unit that system may use (below).\n")
    L.append("| model | system | median ns | p99 ns | round medians | cycles/MAC | % of roof |")
    L.append("|---|---|---:|---:|---|---:|---:|")
    order = KMLC + ["naive C", "tvm", "onnxruntime", "pytorch", "torch.compile"]
    for m in models:
        for k in order:
            st = m.get("stats", {}).get(k)
            if st is None:
                L.append(f"| {m['spec'].name} | {LABEL[k]} | - | - | not run: {why(m, k)} "
                         "| - | - |")
                continue
            roof = f"{st['pct_roof']:.1f}% of {st['roof'].replace('_mac', '')}" \
                if "pct_roof" in st else ""
            L.append(f"| {m['spec'].name} | {LABEL[k]} | {fmt_ns(st['median'])} | "
                     f"{fmt_ns(st['p99'])} | {fmt_ns(st['round_min'])}-"
                     f"{fmt_ns(st['round_max'])} | {st['cycles_per_mac']:.2f} | {roof} |")
    L.append("")

    # -- roofline ---------------------------------------------------------------
    L.append("## The roofline\n")
    L.append("Peak multiply-accumulates per core cycle, measured by `benchmarks/c/peak.c` "
             "(independent mul + add chains, operands in registers; the compute roof, no "
             "loads):\n")
    L.append("| unit | used by | MAC/cycle |")
    L.append("|---|---|---:|")
    L.append(f"| scalar integer (imul r64 + add) | fixed point, one output per accumulator | "
             f"{peaks['int_mac']:.2f} |")
    L.append(f"| paired integer (two MACs per 64-bit multiply, at the rate above) | "
             f"fixed point, kernel flags (no SSE), layers whose sums fit int32 | "
             f"{peaks['pair_mac']:.2f} |")
    L.append(f"| scalar float (mulss + addss) | the naive loop (a dot product cannot be "
             f"vectorized without reassociating) | {peaks['f32_mac']:.2f} |")
    L.append(f"| SSE2 float (mulps + addps, 4 lanes) | float twin, kernel flags | "
             f"{peaks['sse2_mac']:.2f} |")
    if "native_mac" in peaks:
        L.append(f"| {peaks['native_isa']} float (vmulps + vaddps) | -O3 -march=native builds | "
                 f"{peaks['native_mac']:.2f} |")
    L.append("\nNo FMA anywhere: kmlc builds with -ffp-contract=off (docs/numerics.md).  "
             "The TSC runs at a fixed rate; the core clock is measured by timing a chain "
             "of dependent register-to-register adds (one per cycle on any x86-64 core; add-immediate chains are folded at rename on recent Intel cores) against the TSC.\n")

    # -- memory ----------------------------------------------------------------
    L.append("## Bytes and compile time\n")
    L.append("Weights and workspace from the memory plan (kmlc.json); peak stack is the "
             "deepest path from `kml_<name>_infer` through the model's own functions, from "
             "the module build's `-fstack-usage`/`-fcallgraph-info` (kernel_fpu_begin/end "
             "not included); .ko sizes are `size` of the module (text includes the "
             "weights in .rodata, data includes the load-time self-test vectors); compile "
             "time is the wall time of `kmlc compile` (all targets, with the twin's build "
             "and Python start-up).\n")
    L.append("| model | numerics | weights B | workspace B | peak stack B | .ko text | "
             ".ko data | .ko bss | kmlc compile s |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for m in models:
        for numerics in ("float", "fixed"):
            s = m["sizes"].get(numerics)
            if not s:
                continue
            ko = s.get("ko")
            kc = [f"{ko['text']:,}", f"{ko['data']:,}", f"{ko['bss']:,}"] \
                if isinstance(ko, dict) else [str(ko), "-", "-"]
            L.append(f"| {m['spec'].name} | {numerics} | {s['weights']:,} | "
                     f"{s['workspace']:,} | {s.get('stack', '-')} | " + " | ".join(kc)
                     + f" | {s['compile_s']:.2f} |")
    pc = [(m["spec"].name, k, v) for m in models
          for k, v in m["sizes"].get("peer_compile_s", {}).items()]
    if pc:
        L.append("\nPeers' compile times, for comparison: " + "; ".join(
            f"{n} {k} {v:.2f} s" for n, k, v in pc) + ".")
    L.append("")

    # -- checks ----------------------------------------------------------------
    L.append("## Output check\n")
    L.append("Max abs difference from a float64 evaluation of the model on 16 rows (a "
             "wiring check, not an accuracy claim; fixed point is quantized).  Every timed "
             "build of kmlc's C (kernel flags, -O3 -march=native) gave the twin's exact "
             "outputs on the same rows, or the run would have stopped.\n")
    cols = [("float", "twin"), ("fixed", "twin"), *PEERS]
    L.append("| model | " + " | ".join(key_name(k) for k in cols) + " |")
    L.append("|---|" + "---:|" * len(cols))
    for m in models:
        c = m["check"]
        L.append(f"| {m['spec'].name} | " + " | ".join(
            f"{c[k]:.1e}" if k in c else "-" for k in cols) + " |")
    L.append("")

    # -- sweep -----------------------------------------------------------------
    if sweep:
        L.append("## Hidden-width sweep: 32-H-H-8, ReLU\n")
        L.append("ns per call (median) and bytes (weights + workspace) against MACs.  The "
                 "cost model: time ~ a + MACs x cycles/MAC / f, bytes ~ MACs x bytes per "
                 "weight.\n")
        L.append("| H | MACs | float kernel ns | fixed kernel ns | float native ns | "
                 "fixed native ns | float cyc/MAC | fixed cyc/MAC | float B | fixed B |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for pt in sweep:
            st = pt["stats"]
            g = lambda k: fmt_ns(st[k]["median"]) if k in st else "-"  # noqa: E731
            c = lambda k: f"{st[k]['cycles_per_mac']:.2f}" if k in st else "-"  # noqa: E731
            b = lambda n: f"{pt['sizes'][n]['weights'] + pt['sizes'][n]['workspace']:,}"  # noqa
            L.append(f"| {pt['h']} | {pt['macs']:,} | {g(('float', 'kernel'))} | "
                     f"{g(('fixed', 'kernel'))} | {g(('float', 'native'))} | "
                     f"{g(('fixed', 'native'))} | {c(('float', 'kernel'))} | "
                     f"{c(('fixed', 'kernel'))} | {b('float')} | {b('fixed')} |")
        L.append("")

    if steps:
        L.append("## Hook feature steps and guards\n")
        L.append("What a hook's handler computes for one event, without its table lookup "
                 "and lock: the readahead window step (kml_ra_step) and the NFS one "
                 "(kml_nfs_step), from kml_features.h through the twin's feature library, "
                 "on synthetic streams (benchmarks/c/features.c: 64 files, half read "
                 "sequentially, 64-event windows; 4 mounts, READs, dones and page adds, 1 s "
                 "windows); and one guarded decision with its cost (kml_guard.h: the "
                 "envelope check of 5 features, kml_guard_decide, kml_guard_cost; 64 keys), "
                 "every guard on (envelope, benefit 1 in 8, rate) and every guard off.  "
                 "Instructions from callgrind.\n")
        L.append("| step | ns per event (median) | instructions per event | events |")
        L.append("|---|---:|---:|---:|")
        for name, r in steps.items():
            ins = r.get("instructions_per_event")
            L.append(f"| {name} | {r['ns_per_event']:.2f} | "
                     f"{f'{ins:.1f}' if ins is not None else '-'} | {r['events']:,} |")
        L.append("")

    if kflags:
        L.append("## Kernel flags used\n")
        L.append(f"Read from the Kbuild command lines of the modules built above ({kflags['cc']}"
                 "), plus -mnop-mcount and -mstack-protector-guard=global (see "
                 "benchmarks/bench_c.py):\n")
        L.append(f"* float TU: `{' '.join(kflags['fp'])}`")
        L.append(f"* integer files (fixed point): `{' '.join(kflags['int'])}`\n")

    written = []
    md = out / "benchmarks.md"
    md.write_text("\n".join(L) + "\n")
    written.append(md)
    js = out / "results.json"
    js.write_text(json.dumps(to_json(models, sweep, peaks, info, cmd, elapsed) | {
        "feature_steps": steps or {}}, indent=1) + "\n")
    written.append(js)
    if plots:
        written += plot(out, models, sweep, peaks)
    return written


def to_json(models, sweep, peaks, info, cmd, elapsed) -> dict:
    def stats(m):
        return {key_name(k): {kk: vv for kk, vv in v.items() if kk != "per_round"}
                | {"per_round": v["per_round"]} for k, v in m.get("stats", {}).items()}

    def ratios(m):
        return {f"{key_name(b)} vs {key_name(p)}": v for (b, p), v in m.get("ratios", {}).items()}

    return {"command": cmd, "elapsed_s": elapsed, "machine": info, "peaks": peaks,
            "models": [{"name": m["spec"].name, "shape": m["shape"], "macs": m["macs"],
                        "stats": stats(m), "ratios": ratios(m), "sizes": m["sizes"],
                        "unavailable": {key_name(k): v for k, v in m["unavailable"].items()},
                        "check": {key_name(k): v for k, v in m["check"].items()}}
                       for m in models],
            "sweep": [{"h": p["h"], "macs": p["macs"], "stats": stats(p), "sizes": p["sizes"]}
                      for p in sweep]}


def _loglog(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Log-log axes of the sweep plot, gridded, with their labels and legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)


def plot(out: Path, models, sweep, peaks) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    order = KMLC[:4] + ["naive C", "tvm", "onnxruntime", "pytorch", "torch.compile"] + KMLC[4:]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    n = len(order)
    width = 0.8 / n
    cmap = plt.get_cmap("tab10")
    for i, k in enumerate(order):
        xs, ys, errs = [], [], []
        for j, m in enumerate(models):
            st = m.get("stats", {}).get(k)
            if st:
                xs.append(j + (i - n / 2 + 0.5) * width)
                ys.append(st["median"])
                errs.append(st["p99"] - st["median"])
        if xs:
            ax.bar(xs, ys, width, label=LABEL[k], color=cmap(i % 10),
                   yerr=[np.zeros(len(errs)), errs], error_kw={"elinewidth": 0.6, "capsize": 1})
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m['spec'].name}\n{m['shape']}\n{m['macs']:,} MACs" for m in models])
    ax.set_ylabel("ns per single-sample call (median; whisker: p99)")
    ax.set_title("Single-sample inference latency, one thread")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7.5, ncol=3, loc="upper left")
    fig.tight_layout()
    p = out / "latency.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    if sweep:
        clocks = [c for p_ in sweep for c in p_.get("clocks", [])] or [peaks["core_per_tsc"]]
        core_hz = peaks["tsc_hz"] * float(np.median(clocks))
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
        macs = np.array([p["macs"] for p in sweep], dtype=float)
        styles = {("float", "kernel"): ("C0", "-o"), ("fixed", "kernel"): ("C1", "-s"),
                  ("float", "native"): ("C0", ":o"), ("fixed", "native"): ("C1", ":s")}
        for k, (col, st) in styles.items():
            ys = [p["stats"][k]["median"] if k in p.get("stats", {}) else np.nan for p in sweep]
            a1.plot(macs, ys, st, color=col, label=LABEL[k], mfc="none")
        for roof, col, lab in (("pair_mac", "C1", "paired int roof"),
                               ("sse2_mac", "C0", "SSE2 float roof")):
            a1.plot(macs, macs / peaks[roof] / core_hz * 1e9, "--", color=col, alpha=0.5,
                    label=f"{lab} ({peaks[roof]:.2f} MAC/cycle)")
        _loglog(a1, "MACs per inference (32-H-H-8, H = 16 ... 1024)", "ns per call (median)",
                "Time against work")
        for numerics, col, st in (("float", "C0", "-o"), ("fixed", "C1", "-s")):
            ys = [p["sizes"][numerics]["weights"] + p["sizes"][numerics]["workspace"]
                  for p in sweep]
            a2.plot(macs, ys, st, color=col, label=f"kmlc {numerics}: weights + workspace",
                    mfc="none")
        _loglog(a2, "MACs per inference", "bytes", "Memory against work")
        for p_, x in zip(sweep, macs):
            a2.annotate(f"H={p_['h']}", (x, p_["sizes"]["float"]["weights"]), fontsize=7,
                        textcoords="offset points", xytext=(-10, 6))
        fig.tight_layout()
        p = out / "sweep.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written
