"""Static memory planner: one workspace for all temporaries.

Liveness: a temp buffer is live from the first kernel that touches it to the
last (inclusive), so a kernel's operands and result are always live together
and never share memory.

Placement is greedy by size, as in TFLite Micro's GreedyMemoryPlanner and
TVM USMP's greedy_by_size: buffers are placed largest first (ties broken by
first use, then by name, so a plan is reproducible), each at the lowest
aligned offset where it overlaps no already-placed buffer whose lifetime
intersects its own.

Guarantees (tests/unit/test_planner.py checks them on hand-made graphs):
  * no two buffers that are live at the same time overlap;
  * every offset is a multiple of ``align``;
  * the workspace is at most the sum of the (aligned) buffer sizes and at
    least the largest (aligned) set of simultaneously live buffers.
"""
from __future__ import annotations

from dataclasses import dataclass

from .schedule import Program

ALIGN = 16  # bytes; every buffer offset is a multiple (kernels need only 4)


@dataclass(frozen=True)
class Request:
    name: str
    size: int    # bytes, already rounded up to the alignment
    start: int   # first kernel index (inclusive)
    end: int     # last kernel index (inclusive)

    def overlaps_in_time(self, other: "Request") -> bool:
        return self.start <= other.end and other.start <= self.end


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def greedy_by_size(reqs: list[Request], align: int = ALIGN) -> dict[str, int]:
    """Offsets for ``reqs``; see the module docstring for the rule."""
    offsets: dict[str, int] = {}
    placed: list[Request] = []
    for r in sorted(reqs, key=lambda r: (-r.size, r.start, r.name)):
        conflicts = sorted((p for p in placed if p.overlaps_in_time(r)),
                           key=lambda p: (offsets[p.name], p.name))
        off = 0
        for p in conflicts:
            if off + r.size <= offsets[p.name]:
                break
            off = max(off, align_up(offsets[p.name] + p.size, align))
        offsets[r.name] = off
        placed.append(r)
    return offsets


def peak_live(reqs: list[Request]) -> int:
    """Largest total size of buffers live at the same kernel."""
    if not reqs:
        return 0
    last = max(r.end for r in reqs)
    return max(sum(r.size for r in reqs if r.start <= t <= r.end) for t in range(last + 1))


@dataclass
class MemoryPlan:
    requests: list[Request]
    offsets: dict[str, int]
    workspace_bytes: int
    peak_bytes: int
    weight_bytes: int

    def __str__(self) -> str:
        total = sum(r.size for r in self.requests)
        lines = [f"memory plan: workspace {self.workspace_bytes} B (largest live set "
                 f"{self.peak_bytes} B, sum of buffers {total} B), weights "
                 f"{self.weight_bytes} B, align {ALIGN}",
                 "  offset    size  live      buffer"]
        for r in sorted(self.requests, key=lambda r: (self.offsets[r.name], r.start)):
            lines.append(f"  {self.offsets[r.name]:6d}  {r.size:6d}  k{r.start}..k{r.end}"
                         f"{'':{max(1, 8 - len(f'k{r.start}..k{r.end}'))}}{r.name}")
        return "\n".join(lines)


def requests(prog: Program) -> list[Request]:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for i, k in enumerate(prog.kernels):
        for b in k.operands.values():
            if b.kind == "temp":
                first.setdefault(b.name, i)
                last[b.name] = i
                sizes[b.name] = align_up(b.nbytes, ALIGN)
    return [Request(n, sizes[n], first[n], last[n]) for n in first]


def plan(prog: Program) -> Program:
    reqs = requests(prog)
    offsets = greedy_by_size(reqs)
    for b in prog.buffers("temp"):
        b.offset = offsets[b.name]
    workspace = max((offsets[r.name] + r.size for r in reqs), default=0)
    prog.plan = MemoryPlan(reqs, offsets, workspace, peak_live(reqs), prog.weight_bytes)
    return prog
