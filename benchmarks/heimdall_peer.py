"""kmlc against Heimdall's own integer inference, on Heimdall's published
network (device 0, 12-128-16-1, the decision `score >= 0`).

    .venv/bin/python benchmarks/heimdall_peer.py [--out benchmarks/results/heimdall_peer.md]

The peer is c/heimdall_authors.c: the authors' int64 algorithm (written
from its description; tests/unit/test_heimdall_authors.py holds it to a
numpy rewrite), with the published weights.  kmlc compiles the same
network from ONNX (tests/data/heimdall/heimdall_model.py: Cast, the
normalization, three Gemm, GreaterOrEqual) in fixed point, calibrated on
2,000 in-range rows.  Both are built with the kernel's integer flags (read
from the Kbuild command line of the module kmlc builds) and timed by
c/timing.c, per call, on the same 256 rows of the device's feature range:
kmlc on each of its paths (scalar, SSE2, AVX2: kml_simd.h), the authors'
code as it is (scalar int64).  The decisions of the two are compared too.
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

WRAPPER = r"""
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


def net_header(dev: int) -> str:
    n = hm.numbers(dev)
    arrays = {"min": "weight_0_T", "scale0": "bias_0", "w1": "weight_1_T", "b1": "bias_1",
              "w2": "weight_2_T", "b2": "bias_2", "w3": "weight_3_T", "b3": "bias_3"}
    return "".join(f"static const int64_t ha_{k}[] = {{ {', '.join(str(int(v)) for v in n[src])} }};\n"
                   for k, src in arrays.items())


def build_authors(work: Path, flags: dict, dev: int) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "net.h").write_text(net_header(dev))
    (work / "wrapper.c").write_text(WRAPPER)
    objs = []
    for src in (work / "wrapper.c", HERE / "c" / "heimdall_authors.c"):
        obj = work / (src.stem + ".o")
        bench_c.run([flags["cc"], *flags["int"], f"-I{work}", "-c", "-o", obj, src])
        objs.append(obj)
    hdr = bench_c.target_header("int authors_infer(const long long *in, unsigned char *out, "
                                "void *ws);", "long long", "12", "1", "0", "authors_infer")
    hdr += "#define BENCH_OUT_T unsigned char\n"
    return bench_c.link(work / "timing", work, objs, hdr, [])


def main(argv=None) -> int:
    import kmlc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "heimdall_peer.md")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, help="keep the builds here")
    args = ap.parse_args(argv)
    dev = 0
    with tempfile.TemporaryDirectory() as d:
        work = Path(args.work or d)
        out = work / "kmlc"
        kmlc.compile(hm.model(dev), out, name="hpub", numerics="fixed",
                     calibration=hm.rows(dev, 2000, 1), targets=["kernel", "user"])
        meta = json.loads((out / "kmlc.json").read_text())
        bench_c.build_module(out)
        cc, int_flags = bench_c.codegen_flags(
            bench_c.kbuild_command(out / "kernel" / ".hpub.o.cmd"))
        flags = {"cc": cc, "int": int_flags}
        rows = hm.rows(dev, 256, 32)
        twin = kmlc.load(out)
        exes = {}
        for p in twin.paths:
            mode = "kernel" if p == "scalar" else f"kernel-{p}"
            exes[f"kmlc, {p} path"] = bench_c.build_kmlc(out, "hpub", "fixed", mode, flags,
                                                         work / f"k_{p}")
        exes["authors' int64 C"] = build_authors(work / "authors", flags, dev)
        peak = bench_c.machine_peaks(bench_c.build_peak(work / "peak"))
        (work / "check").mkdir()
        decide = {k: bench_c.outputs(e, rows, work / "check")[:, 0] for k, e in exes.items()}
        ref = hm.authors_int64(dev, rows)
        agree = {k: float(np.mean((v != 0) == ref)) for k, v in decide.items()}
        per = {k: [] for k in exes}
        for i, (k, e) in enumerate(exes.items()):
            (work / f"t{i}").mkdir()
        for r in range(args.rounds):
            for i, (k, e) in enumerate(exes.items()):
                ticks, ovh, _ = bench_c.time_calls(e, rows, args.samples, 1000, work / f"t{i}")
                per[k].append(float(np.median(ticks - ovh)) / peak["tsc_hz"] * 1e9)
        med = {k: float(np.median(v)) for k, v in per.items()}
        base = med["authors' int64 C"]
        lines = ["# kmlc against Heimdall's own int64 inference (published network, device 0)",
                 "", f"`.venv/bin/python benchmarks/heimdall_peer.py` ({args.rounds} rounds of "
                 f"{args.samples} calls; kernel integer flags, {cc}).  kmlc: weights "
                 f"{meta['weight_bytes']} B + workspace {meta['workspace_bytes']} B, widths "
                 f"{', '.join(f'int{b}' for b in meta['fixed']['weight_bits'].values())}; the "
                 f"authors' arrays: {(12 * 2 + 128 * 12 + 128 + 16 * 128 + 16 + 16 + 1) * 8} B "
                 "of int64.", "",
                 "| system | ns per call (median of rounds) | rounds | authors / system | "
                 "decisions as the authors' (256 rows) |", "|---|---:|---|---:|---:|"]
        for k in exes:
            lines.append(f"| {k} | {med[k]:,.0f} | {min(per[k]):,.0f}-{max(per[k]):,.0f} | "
                         f"{base / med[k]:.2f}x | {agree[k]:.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
