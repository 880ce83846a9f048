"""The pass pipeline.

Each pass is a function in its own module with a docstring stating what it
guarantees.  Graph passes map Graph -> Graph and the verifier runs after
each; ``lower`` maps the graph to a ``schedule.Program`` and the planner
then assigns workspace offsets.  ``print_after`` receives the printed form
after every stage, like MLIR's --mlir-print-ir-after-all.

--numerics fixed adds, after the shared graph passes: reduce-to-dense,
fold-affine and fold-softmax-argmax (rewrites that are exact in real
arithmetic), then
calibration on the user's data, choose-widths (int8 or int16 weights per
layer, by decision agreement), quantize (float graph -> integer graph) and
bound-ranges (the overflow proof, which also fixes the integer multipliers)
and error-bound (the compiler's own bound on |fixed - float|).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import KmlcError
from ..ir import Graph, fmt_attr, verify
from ..planner import plan
from ..schedule import Program
from .bound_ranges import bound_ranges
from .choose_widths import choose_widths
from .eliminate_dead import eliminate_dead
from .error_bound import error_bound
from .fold_affine import fold_affine
from .fold_constants import fold_constants
from .fold_softmax_argmax import fold_softmax_argmax
from .forward_identity import forward_identity
from .fuse_dense import fuse_dense
from .lower import lower
from .quantize import QuantOptions, quantize
from .reduce_to_dense import reduce_to_dense

GRAPH_PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("fold-constants", fold_constants),
    ("forward-identity", forward_identity),
    ("eliminate-dead", eliminate_dead),
    ("fuse-dense", fuse_dense),
    ("eliminate-dead", eliminate_dead),
]
FIXED_GRAPH_PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("reduce-to-dense", reduce_to_dense),
    ("fold-affine", fold_affine),
    ("fuse-dense", fuse_dense),      # an activation after a folded affine op joins its layer
    ("fold-softmax-argmax", fold_softmax_argmax),
    ("eliminate-dead", eliminate_dead),
]


def banner(stage: str) -> str:
    return f"// -----// IR Dump After {stage} //----- //"


def _proof_report(g: Graph) -> str:
    lines = [str(g), "", "proven ranges:"]
    for op in g.ops:
        lo, hi = g.intervals[op.output]
        extra = ""
        if op.kind == "qdense":
            extra = f"  accumulator {op.attrs['acc']}, |acc| <= {op.attrs['acc_bound']}"
            if "wide_bound" in op.attrs:
                extra += (f" for inputs within int16; any int32 input: int64, |acc| <= "
                          f"{op.attrs['wide_bound']}")
        lines.append(f"  %{op.output.name}: [{lo}, {hi}]{extra}")
    return "\n".join(lines)


def _error_report(info) -> str:
    lines = ["error bound |fixed - float| per layer (its requantization's share, total):"]
    lines += [f"  {layer}: {req:.4g}, {total:.4g}" for _, layer, req, total in info.layer_bounds]
    for name, b in info.output_bounds.items():
        lines.append(f"  output {name}: " + (f"|error| <= {b['error_bound']:.4g}" if
                     "error_bound" in b else f"class agrees when float's top-2 gap > "
                     f"{b['gap']:.4g}"))
    return "\n".join(lines)


def run_pipeline(g: Graph, numerics: str = "float",
                 print_after: Callable[[str, str], None] | None = None,
                 calibration: np.ndarray | None = None,
                 quant: QuantOptions | None = None) -> Program:
    emit = print_after or (lambda stage, text: None)
    emit("import", str(verify(g)))
    passes = GRAPH_PASSES + (FIXED_GRAPH_PASSES if numerics == "fixed" else [])
    for name, fn in passes:
        g = verify(fn(g))
        emit(name, str(g))
    info = None
    if numerics == "fixed":
        from ..calibrate import calibrate

        if calibration is None:
            raise KmlcError("--numerics fixed needs --calibration DATA.npy: rows like `kmlc run` "
                            "input, from which kmlc learns every tensor's range")
        cal = calibrate(g, calibration)
        float_graph = g
        quant, agreement = choose_widths(g, cal, quant or QuantOptions())
        g, info = quantize(g, cal, quant)
        g = eliminate_dead(g)          # an input only tree ensembles read needs no qinput
        info.decision_agreement = agreement
        emit("choose-widths", "weight bits: " + fmt_attr(info.weight_bits) + (
            f"\ndecisions agree with float on {info.decision_agreement:.2f}% of the "
            "calibration rows" if info.decision_agreement is not None else ""))
        info.float_graph, info.calibration_rows = float_graph, cal.rows
        emit("quantize", str(verify(g)) + "\n\nweight bits: " + fmt_attr(info.weight_bits))
        g = verify(bound_ranges(g))
        info.int_graph = g
        emit("bound-ranges", _proof_report(g))
        error_bound(g, info)
        emit("error-bound", _error_report(info))
    prog = lower(g, numerics)
    prog.quant, prog.graph = info, g
    emit("lower", str(prog))
    prog = plan(prog)
    emit("plan-memory", str(prog.plan))
    return prog
