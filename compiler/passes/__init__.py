"""The pass pipeline.

Each pass is a function in its own module with a docstring stating what it
guarantees.  Graph passes map Graph -> Graph and the verifier runs after
each; ``lower`` maps the graph to a ``schedule.Program`` and the planner
then assigns workspace offsets.  ``print_after`` receives the printed form
after every stage, like MLIR's --mlir-print-ir-after-all.
"""
from __future__ import annotations

from typing import Callable

from ..ir import Graph, verify
from ..planner import plan
from ..schedule import Program
from .eliminate_dead import eliminate_dead
from .fold_constants import fold_constants
from .fuse_dense import fuse_dense
from .lower import lower

GRAPH_PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("fold-constants", fold_constants),
    ("eliminate-dead", eliminate_dead),
    ("fuse-dense", fuse_dense),
    ("eliminate-dead", eliminate_dead),
]


def banner(stage: str) -> str:
    return f"// -----// IR Dump After {stage} //----- //"


def run_pipeline(g: Graph, numerics: str = "float",
                 print_after: Callable[[str, str], None] | None = None) -> Program:
    emit = print_after or (lambda stage, text: None)
    emit("import", str(verify(g)))
    for name, fn in GRAPH_PASSES:
        g = verify(fn(g))
        emit(name, str(g))
    prog = lower(g, numerics)
    emit("lower", str(prog))
    prog = plan(prog)
    emit("plan-memory", str(prog.plan))
    return prog
