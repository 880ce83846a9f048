"""``kmlc compile --guard SPEC``: the guards a hook module applies to its
model's decisions (``runtime-kernel/kml_guard.h``, docs/hooks.md "Guards").

Guarantees:

- ``check_guards`` turns the specs into the eight parameters of
  ``struct kml_guard_cfg``, each within the range its module parameter
  accepts, or refuses in one line naming the spec; a guard a hook cannot
  run (the benefit monitor where the hook measures no cost, the envelope
  where the model has no calibrated input ranges) is refused;
- ``envelope`` is the calibrated range of each encoded feature, in the
  encoding the hook hands the model (so the module compares integers);
- ``replay`` runs a trace's guard steps through the twin's
  ``kml_twin_guard()``, the module's own C, and gives what the twin
  decided beside what the module did.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import KmlcError
from .base import read_trace, trace_format

# (parameter, default when its guard is off or not given, lo, hi, zero allowed)
PARAMS = {
    "shadow": (0, 0, 1, False),
    "envelope_pct": (0, 1, 100, True),
    "envelope_events": (256, 1, 65536, False),
    "benefit_every": (0, 2, 1024, True),
    "benefit_samples": (16, 1, 65536, False),
    "benefit_margin_pct": (10, 0, 100, False),
    "benefit_periods": (4, 1, 16, False),
    "rate_ms": (0, 1, 3600000, True),
    "benefit_probe_every": (64, 2, 65536, False),
    "benefit_trial": (1, 0, 1, False),
}
# --guard NAME turns a guard on with its main parameter at this value;
# --guard NAME=V sets that parameter to V
GUARDS = {"shadow": ("shadow", 1), "envelope": ("envelope_pct", 10),
          "benefit": ("benefit_every", 8), "rate": ("rate_ms", 1000)}
WHY = ("model", "shadow", "envelope", "control", "demoted", "probe", "rate")
ARM_NONE = 2
KERNEL = -1   # KML_GUARD_KERNEL: the hook's default is what the kernel has


def defaults() -> dict[str, int]:
    return {k: v[0] for k, v in PARAMS.items()}


def check_guards(specs, hook, envelope) -> dict[str, int]:
    """The guard configuration of ``--guard`` specs (NAME, NAME=VALUE, or
    PARAMETER=VALUE; a list or a comma-separated string) for ``hook``
    (its owner; None: no hook), the model's ``envelope`` (None when it has
    none)."""
    if isinstance(specs, str):
        specs = [specs]
    items = [s.strip() for spec in specs or () for s in str(spec).split(",") if s.strip()]
    cfg = defaults()
    own = dict(getattr(hook, "benefit", None) or {})
    switches = {param for param, _ in GUARDS.values()}
    cfg.update({k: v for k, v in own.items() if k not in switches})
    if items and hook is None:
        raise KmlcError("--guard guards a hook's decisions: compile with --hooks")
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if name in GUARDS:
            param, on = GUARDS[name]
            on = own.get(param, on)
        elif name in PARAMS:
            param, on = name, None
        else:
            raise KmlcError(f"--guard {item}: unknown guard or parameter '{name}'; guards: "
                            f"{', '.join(GUARDS)}; parameters: {', '.join(PARAMS)}")
        if not eq:
            if on is None:
                raise KmlcError(f"--guard {item}: expected {name}=VALUE")
            cfg[param] = on
            continue
        _, lo, hi, zero = PARAMS[param]
        try:
            v = int(value.strip())
        except ValueError:
            v = None
        if v is None or not (lo <= v <= hi or (zero and v == 0)):
            allowed = f"0 or {lo}..{hi}" if zero else f"{lo}..{hi}"
            raise KmlcError(f"--guard {item}: {param} takes an integer in {allowed}")
        cfg[param] = v
    if cfg["benefit_every"] and hook.benefit is None:
        raise KmlcError(f"--guard benefit: the {hook.name} hook measures no cost of its "
                        "decisions to compare with the kernel's (docs/hooks.md); use shadow, "
                        "envelope or rate")
    if cfg["envelope_pct"] and envelope is None:
        raise KmlcError("--guard envelope: the envelope is the calibrated range of the "
                        "model's inputs, and this model has none: compile with --numerics "
                        "fixed and --calibration rows")
    return cfg


def envelope(prog) -> tuple[list[int], list[int]] | None:
    """The calibrated range of each encoded feature, [lo, hi] (floor and
    ceiling of the range times 2^frac, within int32), for a fixed-point
    model whose every input has one; else None."""
    q = prog.quant
    if q is None:
        return None
    ranges = q.formats.get("inputs", {})
    float_of = {iv.name: fv.name for iv, fv in q.float_of.items()}
    lo_all, hi_all = [], []
    for p in prog.inputs:
        got = ranges.get(float_of.get(p.buffer.value))
        if got is None:
            return None
        frac = q.inputs[p.buffer.value]["frac_bits"]
        for lo, hi, fb in zip(got[0], got[1], frac):
            lo_all.append(_s32(math.floor(math.ldexp(lo, fb))))
            hi_all.append(_s32(math.ceil(math.ldexp(hi, fb))))
    return lo_all, hi_all


def _s32(v: int) -> int:
    return max(-2**31, min(2**31 - 1, int(v)))


def binding(prog) -> dict:
    """What kml_binding.h says of the guards: the parameters' compiled-in
    defaults and the envelope."""
    cfg = getattr(prog, "guard", None) or defaults()
    env = envelope(prog)
    lines = []
    for row in env or ():
        chunks = [", ".join(map(str, row[i:i + 6])) for i in range(0, len(row), 6)]
        lines += [("{ " if i == 0 else "  ") + c + (" }," if i == len(chunks) - 1 else ",")
                  for i, c in enumerate(chunks)]
    return {"guard": [{"macro": f"KML_GUARD_{k.upper()}", "value": int(v)}
                      for k, v in cfg.items()],
            "envelope": env, "envelope_c": lines}


# ---- trace and replay ------------------------------------------------------------------

FIELDS = 13   # the kml_guard event's values


def parse(text: str) -> dict[int, np.ndarray]:
    """A trace's kml_guard steps: per guard id, its rows (the event's
    fields, kml_guard_trace.h's order) in step order."""
    ev = read_trace(text, trace_format("kml_guard_trace.h"), {"kml_guard": FIELDS})["kml_guard"]
    out = {}
    for gid in sorted(set(ev[:, 0].tolist())):
        rows = ev[ev[:, 0] == gid]
        out[gid] = rows[np.argsort(rows[:, 1], kind="stable")]
    return out


def replay(twin, rows: np.ndarray, cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """One guard's trace rows through the twin's guard (a fresh one, with
    ``cfg``; shadow mode as each row records it; each step under the
    weight-set generation it records, so that a swap resets the benefit
    state where the module's did): the module's {applied, why, arm, state}
    per row, and the twin's."""
    keys = {k: i for i, k in enumerate(dict.fromkeys(rows[:, 2].tolist()))}
    steps = np.stack([rows[:, 3], [keys[k] for k in rows[:, 2]], rows[:, 4], rows[:, 5],
                      np.where(rows[:, 3] == 0, rows[:, 6], rows[:, 10]), rows[:, 7],
                      rows[:, 12]], 1)
    got = twin.guard(steps, dict(cfg, shadow=0), nkeys=len(keys))
    mod = rows[:, [8, 9, 10, 11]].astype(np.int64)
    return mod, got


def replay_verdicts(module: str, tag: str, text: str, twin) -> list[str]:
    """"<module>-guard-<tag> PASS|FAIL|INFO ...": each guard's steps in the
    dump replayed through the twin from a new guard, with the compiled
    parameters (and shadow mode as the trace records it), are the
    module's, bit for bit.  A guard whose steps the dump holds from its
    first (seq 0) on is replayed; one it joins later is not (its state
    before the dump is not in the trace)."""
    try:
        guards = parse(text)
    except KmlcError as e:
        return [f"{module}-guard-{tag} FAIL {e}"]
    cfg = {**defaults(), **(twin.meta.get("guard") or {})}
    out = []
    for gid, rows in guards.items():
        name = f"{module}-guard-{tag}" + (f"-{gid}" if len(guards) > 1 else "")
        seq = rows[:, 1]
        if seq[0] != 0:
            out.append(f"{name} INFO not replayed: the dump joins guard {gid} at step {seq[0]}")
            continue
        if not np.array_equal(seq, np.arange(len(seq))):
            out.append(f"{name} FAIL steps missing from the dump ({len(seq)} of {seq[-1] + 1})")
            continue
        mod, got = replay(twin, rows, cfg)
        bad = np.flatnonzero(np.any(mod != got, axis=1))
        why = np.bincount(got[rows[:, 3] == 0, 1], minlength=len(WHY))
        counts = ", ".join(f"{n} {w}" for n, w in zip(why, WHY) if n)
        gens = len(set(rows[rows[:, 3] == 0, 12].tolist()))
        if gens > 1:
            counts += f"; decisions of {gens} weight-set generations"
        if len(bad):
            i = bad[0]
            out.append(f"{name} FAIL step {i}: module {mod[i].tolist()}, twin {got[i].tolist()} "
                       "(applied, why, arm, state)")
        else:
            out.append(f"{name} PASS {len(rows)} steps identical ({counts or 'no decisions'})")
    return out
