"""The results table (markdown) and the latency plot."""
from __future__ import annotations

import numpy as np

from .evaluate import PCTS, POLICIES

LABEL = {"baseline": "baseline (always primary)", "random": "random",
         "hedging": "hedging at p98", "c3": "C3", "linnos_block": "LinnOS-like, block-layer view",
         "linnos": "LinnOS-like, behind the kmlc hook",
         "heimdall": "**learned** (kmlc hook, fixed point)",
         "lgbm": "LightGBM, 200 trees (kmlc hook, fixed point)",
         "heimdall_gc": "diagnostic: the same, trained on the simulator's GC state",
         "oracle": "oracle: declines during the primary's GC (not a policy)"}
COLOR = {"baseline": "#555555", "random": "#9467bd", "hedging": "#ff7f0e", "c3": "#2ca02c",
         "linnos_block": "#17becf", "linnos": "#1f77b4", "heimdall": "#d62728",
         "lgbm": "#8c564b", "heimdall_gc": "#e377c2", "oracle": "#bbbbbb"}


def table(res: dict) -> str:
    n = len(res["seeds"])
    pc = " | ".join(f"p{p:g}" for p in PCTS)
    lines = [f"| policy | avg (us), mean ± sd over {n} seeds | {pc} | reroute rate | "
             "... of reads during / outside the primary's GC | "
             "learned has the lower avg on | learned avg / policy avg |",
             "|---|---:|" + "---:|" * len(PCTS) + "---:|---:|---:|---:|"]
    for name in POLICIES:
        a = res["policies"][name]
        pcts = " | ".join(f"{a[f'p{p:g}']:.0f}" for p in PCTS)
        rer = f"{100 * a['reroute']:.1f}%"
        if name == "hedging":
            rer = f"{100 * a['hedged']:.1f}% hedged"
        wins = f"{a['heimdall_lower_on']}/{n}" if name != "heimdall" else ""
        ratio = f"{a['heimdall_ratio']:.3f}" if name != "heimdall" else ""
        split = f"{100 * a['moved_in_gc']:.1f}% / {100 * a['moved_outside_gc']:.1f}%"
        lines.append(f"| {LABEL[name]} | {a['avg']:.1f} ± {a['avg_sd']:.1f} | {pcts} | {rer} | "
                     f"{split} | {wins} | {ratio} |")
    return "\n".join(lines)


def pooled_table(res: dict) -> str:
    pc = " | ".join(f"p{p:g}" for p in PCTS)
    lines = [f"| policy | avg | {pc} |", "|---|---:|" + "---:|" * len(PCTS)]
    for name in POLICIES:
        a = res["policies"][name]["pooled"]
        lines.append(f"| {LABEL[name]} | {a['avg']:.1f} | "
                     + " | ".join(f"{a[f'p{p:g}']:.0f}" for p in PCTS) + " |")
    return "\n".join(lines)


def ablation_table(res: dict) -> str:
    lines = ["| probe_every | learned avg / baseline avg | LinnOS-like (hook) avg / baseline avg "
             "| learned reroute rate | LinnOS-like reroute rate |", "|---:|---:|---:|---:|---:|"]
    for v, a in res["probe_every_on_training_traces"].items():
        lines.append(f"| {v} | {a['heimdall_vs_baseline']:.3f} | {a['linnos_vs_baseline']:.3f} | "
                     f"{100 * a['heimdall_reroute']:.1f}% | {100 * a['linnos_reroute']:.1f}% |")
    return "\n".join(lines)


def history_table(res: dict) -> str:
    lines = ["| hook decisions | write completions in the history, reads during GC | "
             "... outside GC | reads declined during GC | ... outside GC |",
             "|---|---:|---:|---:|---:|"]
    for name, a in res["history_on_training_traces"].items():
        label = "always admit (baseline: the training data)" if name == "baseline" else \
            "the learned model"
        lines.append(f"| {label} | {100 * a['writes_in_history_in_gc']:.1f}% | "
                     f"{100 * a['writes_in_history_outside_gc']:.1f}% | "
                     f"{100 * a['declined_in_gc']:.1f}% | {100 * a['declined_outside_gc']:.1f}% |")
    return "\n".join(lines)


def search_table(lab: dict) -> str:
    lines = ["| drop | future | short | labels over | slow reads | avg (us) |",
             "|---:|---:|---:|---|---:|---:|"]
    for g in lab["grid"]:
        lines.append(f"| {g['drop']} | {g['future']} | {g['short']} | {g['label_on']} "
                     f"| {100 * g['slow']:.1f}% | {g['avg']:.1f} |")
    return "\n".join(lines)


def markdown(res: dict, run: dict) -> str:
    acc, k, d = res["accuracy"], res["kmlc"], res["training_data"]

    def m(x):
        return (f"{x['rows']} reads, {100 * x['slow']:.1f}% slow: accuracy {x['accuracy']:.3f}, "
                f"ROC-AUC {x['roc_auc']:.3f}, FPR {x['fpr']:.3f}, FNR {x['fnr']:.3f}")

    def pct(a, b):
        return f"{100 * a / b:.1f}%"

    hv, lv = acc["hook_vs_float"], acc["lgbm_hook_vs_lightgbm"]
    lab = res["settings"]["labels"]
    over = ("every I/O on the primary, writes included" if lab["label_on"] == "all"
            else "the reads alone")
    consts = (f"throughput drop {lab['drop']}, {lab['future']} fast I/Os end a period, slow "
              f"runs of up to {lab['short']} are noise")
    chosen = (f"constants searched on the training traces ({len(lab['grid'])} settings, "
              f"below): {consts}" if lab["constants"] == "searched"
              else f"the artifact's constants: {consts}")
    history = ("every read and write completed on the primary (the module's "
               "history_writes=1)" if res["settings"]["history"] == "all" else
               "the reads completed on the primary, writes still in the queue length (the "
               "module's history_writes=0, compiled in)")
    normal = d["reads"] - d["gc_reads"]
    ts = res["settings"]["train_seeds"]
    return "\n".join([
        "# Admission example: results",
        "",
        f"Command: `{res['command']}`  ",
        f"Machine: {run['machine']}  ",
        f"Run time: {run['timing_s']['total']:.0f} s "
        f"({'; '.join(f'{k2}: {v} s' for k2, v in run['timing_s'].items() if k2 != 'total')})",
        "",
        f"Read latency in us per policy.  Each seed's trace is simulated under every policy; "
        f"the columns are the mean over the {len(res['seeds'])} evaluation seeds of each "
        "seed's average and percentiles (Heimdall §6.1's \"average percentile\"), with the "
        "standard deviation over seeds of the average.  The last two columns pair the learned "
        "policy with each other policy seed by seed.",
        "",
        table(res),
        "",
        "Pooled over all reads of all seeds:",
        "",
        pooled_table(res),
        "",
        "![latency](latency.png)",
        "",
        "## Training data and labels",
        "",
        f"* {d['reads']} reads of the baseline on training seeds {ts[0]}-{ts[-1]}; "
        f"{pct(d['gc_reads'], d['reads'])} of them arrived while their primary collected "
        "garbage.",
        f"* The features' history of the last three completions: {history}.",
        f"* Period-based labels (over {over}; the reads' labels; {chosen}): "
        f"{pct(d['slow'], d['reads'])} slow; "
        f"{pct(d['slow_in_gc'], d['gc_reads'])} of the reads during GC and "
        f"{pct(d['slow_outside_gc'], normal)} of the others; "
        f"{pct(d['reads'] - d['kept'], d['reads'])} removed as noise.",
        f"* LinnOS's latency-cutoff labels (cutoffs {min(d['linnos_cutoff_us']):.0f}-"
        f"{max(d['linnos_cutoff_us']):.0f} us): {pct(d['linnos_slow'], d['reads'])} slow; "
        f"{pct(d['linnos_slow_in_gc'], d['gc_reads'])} during GC, "
        f"{pct(d['linnos_slow_outside_gc'], normal)} otherwise.",
        "",
        "## Models",
        "",
        f"* Heimdall model, held-out second halves, all reads: {m(acc['heimdall_all'])}.",
        f"* The same, noise-filtered reads (as the paper reports): "
        f"{m(acc['heimdall_filtered'])}.",
        f"* Against the device state instead (was the primary collecting garbage?), the same "
        f"predictions: {m(acc['heimdall_vs_gc'])}; the diagnostic model trained on that state "
        f"(same features, shape and training): {m(acc['heimdall_gc_vs_gc'])}.",
        f"* The compiled hook's decisions on the held-out reads (features by kmlc.features "
        f"with the hook's fraction bits, decision by `twin.decide`): {m(acc['hook'])}; equal to "
        f"the float PyTorch model's on {hv['agree']}/{hv['rows']} reads ({hv['percent']}%).",
        f"* LightGBM (200 trees of depth 4, the same rows and labels), held out: "
        f"{m(acc['lgbm'])}; its compiled hook's decisions (fixed point, the same features) "
        f"equal LightGBM's own on {lv['agree']}/{lv['rows']} reads ({lv['percent']}%).",
        *[f"* {LABEL[n]}, held out, against its own latency-cutoff labels: {m(acc[n])}; "
          f"against the period labels: {m(acc[n + '_vs_period_labels'])}."
          for n in ("linnos", "linnos_block")],
        "",
        *(["The hook's `probe_every` (default 64, used above) on the training traces:", "",
            ablation_table(res), ""] if res.get("probe_every_on_training_traces") else []),
        *(["What the hook's history (the last three completions on the primary) holds when "
           "a read arrives, on the training traces:", "", history_table(res), ""]
          if res.get("history_on_training_traces") else []),
        *(["The label search on the training traces (closed-loop average read latency of "
           "the learned policy, mean over the training seeds):", "", search_table(lab), ""]
          if lab["constants"] == "searched" else []),
        "## kmlc",
        "",
        f"`{k['compile']}`:",
        "",
        "```",
        k["compiled"],
        k["built"],
        "```",
        "",
        "`kmlc verify --numerics fixed` on evenly spaced held-out rows:",
        "",
        "```",
        k["verify"],
        "```",
        "",
    ])


def plot(per_seed: list, agg: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in POLICIES:
        lat = np.sort(np.concatenate([r[name][1] for r in per_seed]).astype(np.float64))
        tail = 1.0 - np.arange(len(lat)) / len(lat)
        step = max(1, len(lat) // 4000)
        ls = "--" if name in ("oracle", "heimdall_gc") else "-"
        ax[0].loglog(lat[::step], tail[::step], ls, color=COLOR[name], label=name)
        ys = [agg[name][f"p{p:g}"] for p in PCTS]
        ax[1].plot(range(len(PCTS)), ys, "o" + ls, color=COLOR[name], label=name)
    ax[0].set_xlabel("read latency (us), all reads of all seeds")
    ax[0].set_ylabel("fraction of reads slower (1 - CDF)")
    ax[0].set_ylim(1e-5, 1.05)
    ax[0].legend(fontsize=8)
    ax[1].set_xticks(range(len(PCTS)), [f"p{p:g}" for p in PCTS])
    ax[1].set_yscale("log")
    ax[1].set_ylabel("read latency (us), mean over seeds")
    others = [n for n in POLICIES if n != "baseline"]
    ratio = [[r[n][0]["avg"] / r["baseline"][0]["avg"] for r in per_seed] for n in others]
    box = ax[2].boxplot(ratio, patch_artist=True, widths=0.6)
    for patch, n in zip(box["boxes"], others):
        patch.set_facecolor(COLOR[n])
    ax[2].axhline(1.0, color=COLOR["baseline"], lw=1)
    ax[2].set_xticks(range(1, len(others) + 1), others, rotation=20, fontsize=8)
    ax[2].set_ylabel("average read latency / baseline's, per seed")
    fig.suptitle(f"Read latency over {len(per_seed)} trace seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
