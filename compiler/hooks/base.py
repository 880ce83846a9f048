"""What every hook owner shares: the ``Hook`` description, module
parameters checked against their ranges, and the reader of the trace
events a hook module defines.

A hook's trace events are defined once, in its C header
(``runtime-kernel/kml_<stem>_trace.h``): ``trace_format`` reads each event's
field names from its ``TP_printk`` format, and ``read_trace`` turns the text
of ``/sys/kernel/tracing/trace`` (or ``trace-cmd report``) into records with
those fields.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import KmlcError

if TYPE_CHECKING:
    from ..targets.kernels import Loops


def runtime_kernel_dir() -> Path:
    from .. import runtime_kernel

    return runtime_kernel.DIR


@dataclass(frozen=True)
class Param:
    """A hook's module parameter: its compiled-in default (an int, a bool,
    or a tuple with one value per class), its range and what it is."""
    default: object
    lo: int
    hi: int
    doc: str

    def check(self, name: str, value):
        """``value`` (as given to --hook-param NAME=VALUE, or a Python value)
        checked against the range; raises KmlcError naming it."""
        if isinstance(self.default, bool):
            v = value if isinstance(value, bool) else BOOLS.get(str(value).strip().lower())
            if v is None:
                raise KmlcError(f"--hook-param {name}={value}: expected 0 or 1 (or y/n)")
            return v
        if isinstance(self.default, tuple):
            items = value.split(",") if isinstance(value, str) else list(value)
            v = tuple(_int_in(x, self.lo, self.hi) for x in items)
            if len(v) != len(self.default) or None in v:
                shown = value if isinstance(value, str) else ",".join(map(str, value))
                raise KmlcError(f"--hook-param {name}={shown}: expected {len(self.default)} "
                                f"comma-separated integers in {self.lo}..{self.hi}, one per class")
            return v
        v = _int_in(value, self.lo, self.hi)
        if v is None:
            raise KmlcError(f"--hook-param {name}={value}: expected an integer in "
                            f"{self.lo}..{self.hi}")
        return v


BOOLS = {"1": True, "y": True, "yes": True, "true": True, "on": True,
         "0": False, "n": False, "no": False, "false": False, "off": False}


def _int_in(value, lo: int, hi: int) -> int | None:
    """``value`` as an integer in lo..hi, else None (bools are not integers)."""
    try:
        v = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        return None
    return v if v is not None and lo <= v <= hi else None


def c_value(v) -> str:
    """A parameter value as C: an initializer for a tuple."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "{ " + ", ".join(map(str, v)) + " }"
    return str(int(v))


def doc_value(v) -> str:
    """A parameter value as modinfo and sysfs show it."""
    if isinstance(v, bool):
        return "Y" if v else "N"
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return str(int(v))


# ---- trace events ------------------------------------------------------------------

_EVENT = re.compile(r"TRACE_EVENT\((\w+),.*?TP_printk\(\s*\"([^\"]*)\"", re.S)


def trace_format(header: str) -> dict[str, list[str]]:
    """Each event of a hook's trace header, with its fields in the order
    its TP_printk prints them (``name=%fmt`` pairs)."""
    text = (runtime_kernel_dir() / header).read_text()
    out = {}
    for name, fmt in _EVENT.findall(text):
        out[name] = re.findall(r"(\w+)=%", fmt)
    if not out:
        raise KmlcError("no TRACE_EVENT with a TP_printk format", where=header)
    return out


_LINE = re.compile(r"\s(\w+):\s+((?:\w+=\S+\s*)+)$")


def read_trace(text: str, formats: dict[str, list[str]],
               widths: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """The events of ``formats`` in a trace's text, one int64 array per
    event, a row per record and a column per field (a field printed as
    "a,b,c" spans as many columns; ``widths`` gives each event's number of
    columns, checked), in the order the text lists them.  Other lines
    (headers, other events) are skipped."""
    rows: dict[str, list[list[int]]] = {name: [] for name in formats}
    for ln in text.splitlines():
        m = _LINE.search(ln)
        if not m or m.group(1) not in formats:
            continue
        vals = dict(kv.split("=", 1) for kv in m.group(2).split())
        try:
            row = [int(x) for f in formats[m.group(1)] for x in vals[f].split(",")]
        except (KeyError, ValueError):
            raise KmlcError(f"trace line does not match the {m.group(1)} event's format "
                            f"({', '.join(formats[m.group(1)])}): {ln.strip()[:200]}") from None
        rows[m.group(1)].append(row)
    out = {}
    for name, r in rows.items():
        w = (widths or {}).get(name)
        a = np.array(r, dtype=np.int64).reshape(len(r), -1) if r else np.zeros((0, w or 0),
                                                                               np.int64)
        if w is not None and a.shape[1] != w:
            raise KmlcError(f"the {name} events have {a.shape[1]} values, not {w}")
        out[name] = a
    return out


def lost_events(text: str) -> int:
    """Records the ring buffer dropped, from the trace file's header
    ("entries-in-buffer/entries-written: N/M"), summed over its CPUs."""
    m = re.search(r"entries-in-buffer/entries-written:\s*(\d+)/(\d+)", text)
    return int(m.group(2)) - int(m.group(1)) if m else 0


@dataclass
class Replay:
    """A trace replayed through the twin: the module's features and
    decisions beside the twin's, row for row."""
    features: np.ndarray          # the module's, one row per window or read
    twin_features: np.ndarray
    decisions: np.ndarray         # the module's
    twin_decisions: np.ndarray
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    info: dict = field(default_factory=dict)   # the owner's parsed trace, for about()

    @property
    def identical(self) -> bool:
        return (self.features.shape == self.twin_features.shape
                and np.array_equal(self.features, self.twin_features)
                and self.decisions.shape == self.twin_decisions.shape
                and np.array_equal(self.decisions, self.twin_decisions))

    def summary(self) -> str:
        return (f"features {_same_rows(self.features, self.twin_features)}/"
                f"{len(self.features)} rows identical, decisions "
                f"{_same_rows(self.decisions, self.twin_decisions)}/{len(self.decisions)} "
                "identical")


def _same_rows(a: np.ndarray, b: np.ndarray) -> int:
    """Rows of a equal to the same row of b (0 when the shapes differ)."""
    if a.shape != b.shape or not len(a):
        return 0
    return int(np.sum(np.all(a.reshape(len(a), -1) == b.reshape(len(b), -1), axis=1)))


class Hook:
    """One kind of hook.  Subclasses set the class attributes and implement
    ``check`` (the model's interface), ``binding`` (what the generated
    kml_binding.h says of the decision), ``replay`` and the qemu parts."""
    name = ""                    # --hooks NAME
    stem = ""                    # kml_<stem>.c, kml_<stem>_trace.h, kml_<stem>_twin.c
    params: dict[str, Param] = {}
    # Kernel options the hook's C needs, each with what needs it (Kbuild, Kconfig);
    # "A|B": either.
    kconfig: list[tuple[str, str]] = []
    kbuild = ""                  # more checks for the module's Kbuild
    # The replay rows' kinds (their first column), named for the verdict
    # line; the first ``required_kinds`` must each occur for a PASS.
    row_kinds: tuple[str, ...] = ()
    required_kinds = 0
    # None: the hook measures no cost of its decisions (--guard benefit is
    # refused); else it reports each guarded decision's cost, and this holds
    # its own values of the benefit guard's parameters (benefit_every: the
    # one --guard benefit sets; the rest: kmlc.hooks.guard.PARAMS's defaults)
    benefit: dict[str, int] | None = None

    @property
    def kernel_sources(self) -> list[str]:
        """The runtime-kernel C compiled into the module, besides the model."""
        return ["kml_hook.c", "kml_guard.c", f"kml_{self.stem}.c"]

    @property
    def kernel_files(self) -> list[str]:
        """Everything of the runtime the module's directory needs for the hook."""
        return [*self.kernel_sources, "kml_hook.h", "kml_features.h", "kml_guard.h",
                "kml_guard_trace.h", self.trace_header]

    @property
    def user_sources(self) -> list[str]:
        """The runtime-user C compiled into the twin, besides the model."""
        return ["kml_hook_twin.c", f"kml_{self.stem}_twin.c"]

    @property
    def user_files(self) -> list[str]:
        return [*self.user_sources, "kml_features.h", "kml_guard.h"]

    @property
    def trace_header(self) -> str:
        return f"kml_{self.stem}_trace.h"

    def trace_events(self) -> dict[str, list[str]]:
        return trace_format(self.trace_header)

    def check(self, prog) -> None:
        raise NotImplementedError

    def binding(self, prog) -> dict:
        raise NotImplementedError

    def defaults(self) -> dict:
        return {k: p.default for k, p in self.params.items()}

    # ---- qemu (targets/qemu.py) ------------------------------------------------------
    steps: tuple[str, ...] = ()  # the scenario's results, KMLC-RESULT <module>-<step>
    needs: list[str] = []        # the kernel's modules the scenario loads
    tools: list[str] = []        # targets/qemu_tools programs it runs

    def files(self) -> dict:
        """Files the scenario needs in the initramfs: {guest path: host path}."""
        return {}

    def setup(self, module: str) -> str:
        """Shell: what a user's --script finds ready (exported KML_* names)."""
        return ""

    def teardown(self, module: str) -> str:
        """Shell: after a user's --script, undo the setup so that the module unloads."""
        return ""

    def scenario(self, module: str, ko: str, loops: Loops) -> str:
        """Shell: the hook's own scenario, printing KMLC-RESULT lines, with
        the kernel's ``loops`` (targets/kernels.py): its reload cycles and
        the volume of data its steps move."""
        raise NotImplementedError

    # a shell loop body that makes the hook decide, in the setup's
    # environment: the swap scenario runs it in the background
    load = ""

    def load_start(self) -> str:
        """Shell: start ``load`` in a loop in the background."""
        return ("touch /tmp/kml_busy\n( while [ -e /tmp/kml_busy ]; do "
                f"{self.load.strip()}; done ) &\nkml_busy=$!\n")

    def load_stop(self) -> str:
        return "rm -f /tmp/kml_busy; wait $kml_busy\n"

    def inferences(self, module: str) -> str:
        """Shell: print the number of inferences the hook has run."""
        return f"awk '$1 == \"inferences\" {{print $2}}' /sys/kernel/debug/{module}/stats"

    def verdicts(self, module: str, dumps: dict[str, str], twin) -> list[str]:
        """Host-side verdicts on the scenario's trace dumps ({tag: text}):
        lines "NAME PASS|FAIL|INFO DETAIL": each dump replayed through the
        twin (``replay_verdict``), and what the hook adds (``about``)."""
        from .guard import replay_verdicts

        out = []
        for tag, text in dumps.items():
            line, rep = self.replay_verdict(module, tag, text, twin)
            out.append(line)
            out += replay_verdicts(module, tag, text, twin)
            if rep is not None:
                out += self.about(module, tag, rep)
        return out

    def replay_verdict(self, module: str, tag: str, text: str, twin):
        """"<module>-replay-<tag> PASS|FAIL ...": the dump has every event
        (none lost), and the module's features and decisions are the
        twin's, bit for bit; and the Replay (None when events were lost)."""
        lost = lost_events(text)
        if lost:
            return f"{module}-replay-{tag} FAIL the trace lost {lost} events", None
        rep = self.replay(twin, text)
        ok = rep.identical and len(rep.features) > 0
        counts = ""
        if self.row_kinds:
            kinds = rep.rows[:, 0] if len(rep.rows) else np.zeros(0, np.int64)
            n = np.bincount(kinds, minlength=len(self.row_kinds))
            ok = ok and bool(np.all(n[:self.required_kinds]))
            counts = "; " + ", ".join(f"{c} {k}" for c, k in zip(n, self.row_kinds))
            counts += " in the history"
        verdict = "PASS" if ok else "FAIL"
        return f"{module}-replay-{tag} {verdict} {rep.summary()}{counts}", rep

    def about(self, module: str, tag: str, rep: Replay) -> list[str]:
        """More lines on a replayed dump: what the policy did (INFO)."""
        return []


class ClassHook(Hook):
    """A hook whose model picks one of KML's four classes from ``features``
    features (readahead, nfs-rsize); a float model is handed them with the
    fraction bits ``float_frac`` (a kml_features.h macro)."""
    classes = ("readrandom", "readrandomwriterandom", "readseq", "readreverse")
    features = 0
    what = ""                    # the features, for the error message
    float_frac = ""

    def check(self, prog) -> None:
        if (prog.in_elems != self.features or prog.out_elems != len(self.classes)
                or len(prog.outputs) != 1
                or prog.outputs[0].type.dtype.name not in ("f32", "i16", "i32")):
            raise KmlcError(f"the {self.name} hook feeds {self.what} and reads "
                            f"{len(self.classes)} class scores; this model takes "
                            f"{prog.in_elems} and gives {prog.out_elems}")

    def binding(self, prog) -> dict:
        return {"decide": "class", "float_frac": self.float_frac,
                "classes": ", ".join(self.classes)}


def arch_need(hook: str) -> tuple[str, str]:
    """The architectures a hook is built and tested on, as a ``kconfig``
    entry: x86-64 and arm64 (docs/targets.md)."""
    return ("X86_64|ARM64", f"the {hook} hook (built and tested on x86-64 and arm64)")
