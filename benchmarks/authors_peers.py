"""kmlc against the authors' own integer inference: Heimdall's published
network (device 0, 12-128-16-1, decline when `score >= 0`) and a
LinnOS-shaped network (31-256-2, the benchmark's weights; reject when
`s[0] < s[1]`).

    .venv/bin/python benchmarks/authors_peers.py [--out benchmarks/results/authors_peers.md]

The peers are c/heimdall_authors.c (Heimdall's int64 algorithm, written
from its description; tests/unit/test_heimdall_authors.py holds it to a
numpy rewrite) with the published weights, and c/linnos_authors.c
(LinnOS's int64 loop as the Heimdall repository's module runs it, zero
products skipped) with the benchmark's LinnOS weights scaled by 10^3.  kmlc
compiles the same networks from ONNX in fixed point (Heimdall's from
tests/data/heimdall/heimdall_model.py: Cast, normalization, three Gemm,
GreaterOrEqual).  Everything is built with the kernel's integer flags (the
Kbuild command line of the module kmlc builds) and timed by c/timing.c, per
call, on the same 256 rows: kmlc on each of its paths (scalar, SSE2, AVX2:
kml_simd.h), the authors' code as it is.  Decisions are compared too.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "data" / "heimdall"))

import bench_c  # noqa: E402
import heimdall_model as hm  # noqa: E402

import bench_models  # noqa: E402

HEIMDALL_WRAPPER = r"""
#include <stdint.h>
#include "net.h"

struct heimdall_net {
	const int64_t *min, *scale0, *w1, *b1, *w2, *b2, *w3, *b3;
};

int heimdall_authors_decide(const struct heimdall_net *net, const int64_t *x);

static const struct heimdall_net net = { ha_min, ha_scale0, ha_w1, ha_b1, ha_w2, ha_b2,
					 ha_w3, ha_b3 };

int authors_infer(const long long *in, unsigned char *out, void *ws);

int authors_infer(const long long *in, unsigned char *out, void *ws)
{
	out[0] = heimdall_authors_decide(&net, (const int64_t *)in);
	return 0;
}
"""

LINNOS_WRAPPER = r"""
#include <stdint.h>
#include "net.h"

struct linnos_net {
	const int64_t *w0, *b0, *w1, *b1;
};

int linnos_authors_decide(const struct linnos_net *net, const char *x);

static const struct linnos_net net = { la_w0, la_b0, la_w1, la_b1 };

int authors_infer(const char *in, unsigned char *out, void *ws);

int authors_infer(const char *in, unsigned char *out, void *ws)
{
	out[0] = linnos_authors_decide(&net, in);
	return 0;
}
"""


def c_arrays(prefix: str, arrays: dict) -> str:
    return "".join(f"static const int64_t {prefix}_{k}[] = "
                   f"{{ {', '.join(str(int(v)) for v in np.ravel(a))} }};\n"
                   for k, a in arrays.items())


def heimdall_case(dev: int = 0) -> dict:
    n = hm.numbers(dev)
    names = {"min": "weight_0_T", "scale0": "bias_0", "w1": "weight_1_T", "b1": "bias_1",
             "w2": "weight_2_T", "b2": "bias_2", "w3": "weight_3_T", "b3": "bias_3"}
    arrays = {k: np.array(n[v], np.int64) for k, v in names.items()}
    rows = hm.rows(dev, 256, 32)
    return {"title": f"Heimdall, published network (device {dev}), 12-128-16-1",
            "onnx": hm.model(dev), "cal": hm.rows(dev, 2000, 1), "rows": rows,
            "peer_rows": rows.astype(np.int64), "peer_t": "long long", "in": 12,
            "header": c_arrays("ha", arrays), "wrapper": HEIMDALL_WRAPPER,
            "source": "heimdall_authors.c", "ref": hm.authors_int64(dev, rows),
            "decide": lambda y: y[:, 0] != 0,
            "peer_bytes": sum(a.size for a in arrays.values()) * 8}


def linnos_case() -> dict:
    spec = bench_models.spec("linnos")
    w0, w1 = spec.weights
    b0, b1 = spec.biases
    arrays = {"w0": np.round(w0 * 1e3), "b0": np.round(b0 * 1e3), "w1": np.round(w1 * 1e3),
              "b1": np.round(b1 * 1e6)}
    rows = spec.rows(256, seed=32)
    x = rows.astype(np.int64)
    h = np.maximum(x @ arrays["w0"].astype(np.int64).T + arrays["b0"].astype(np.int64), 0)
    sc = h @ arrays["w1"].astype(np.int64).T + arrays["b1"].astype(np.int64)
    return {"title": "LinnOS shape, 31-256-2 (the benchmark's weights)",
            "onnx": spec.onnx_model(), "cal": spec.rows(2000, seed=31), "rows": rows,
            "peer_rows": rows.astype(np.int8), "peer_t": "char", "in": 31,
            "header": c_arrays("la", arrays), "wrapper": LINNOS_WRAPPER,
            "source": "linnos_authors.c", "ref": sc[:, 0] < sc[:, 1],
            "decide": lambda y: y[:, 0] < y[:, 1],
            "peer_bytes": sum(a.size for a in arrays.values()) * 8}


def build_authors(case: dict, work: Path, flags: dict) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "net.h").write_text(case["header"])
    (work / "wrapper.c").write_text(case["wrapper"])
    objs = []
    for src in (work / "wrapper.c", HERE / "c" / case["source"]):
        obj = work / (src.stem + ".o")
        bench_c.run([flags["cc"], *flags["int"], f"-I{work}", "-c", "-o", obj, src])
        objs.append(obj)
    t = case["peer_t"]
    hdr = bench_c.target_header(f"int authors_infer(const {t} *in, unsigned char *out, "
                                "void *ws);", t, str(case["in"]), "1", "0", "authors_infer")
    hdr += "#define BENCH_OUT_T unsigned char\n"
    return bench_c.link(work / "timing", work, objs, hdr, [])


def run_case(case: dict, work: Path, peak: dict, args) -> list[str]:
    import kmlc

    out = work / "kmlc"
    kmlc.compile(case["onnx"], out, name="peer", numerics="fixed", calibration=case["cal"],
                 targets=["kernel", "user"])
    meta = json.loads((out / "kmlc.json").read_text())
    bench_c.build_module(out)
    cc, int_flags = bench_c.codegen_flags(bench_c.kbuild_command(out / "kernel" / ".peer.o.cmd"))
    flags = {"cc": cc, "int": int_flags}
    twin = kmlc.load(out)
    raw = twin.encode(case["rows"])
    exes, inputs = {}, {}
    for p in twin.paths:
        mode = "kernel" if p == "scalar" else f"kernel-{p}"
        exes[f"kmlc, {p} path"] = bench_c.build_kmlc(out, "peer", "fixed", mode, flags,
                                                     work / f"k_{p}")
        inputs[f"kmlc, {p} path"] = raw
    exes["authors' int64 C"] = build_authors(case, work / "authors", flags)
    inputs["authors' int64 C"] = case["peer_rows"]
    agree, per = bench_c.compare_and_time(
        exes, inputs, lambda k, y: y[:, 0] != 0 if k.startswith("authors") else case["decide"](y),
        case["ref"], work, peak, args.rounds, args.samples)
    med = {k: float(np.median(v)) for k, v in per.items()}
    base = med["authors' int64 C"]
    widths = ", ".join(f"int{b}" for b in meta["fixed"]["weight_bits"].values())
    lines = [f"## {case['title']}", "",
             f"kmlc: weights {meta['weight_bytes']:,} B + workspace {meta['workspace_bytes']} B "
             f"({widths}); the authors' arrays: {case['peer_bytes']:,} B of int64.", "",
             "| system | ns per call (median of rounds) | rounds | authors / system | "
             f"decisions as the int64 reference ({len(case['rows'])} rows) |",
             "|---|---:|---|---:|---:|"]
    for k in exes:
        lines.append(f"| {k} | {med[k]:,.0f} | {min(per[k]):,.0f}-{max(per[k]):,.0f} | "
                     f"{base / med[k]:.2f}x | {agree[k]:.1%} |")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "authors_peers.md")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, help="keep the builds here")
    args = ap.parse_args(argv)
    lines = ["# kmlc against the authors' own int64 inference", "",
             f"`.venv/bin/python benchmarks/authors_peers.py` ({args.rounds} rounds of "
             f"{args.samples:,} calls per system; the kernel's integer flags).", ""]
    with tempfile.TemporaryDirectory() as d:
        work = Path(args.work or d)
        peak = bench_c.machine_peaks(bench_c.build_peak(work / "peak"))
        for name, case in (("heimdall", heimdall_case()), ("linnos", linnos_case())):
            lines += run_case(case, work / name, peak, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
