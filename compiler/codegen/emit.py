"""Codegen: renders a planned ``schedule.Program`` into C and build files.

Everything here is presentation.  Buffer offsets, loop orders, strides,
weight layouts and names were all decided by the passes and the planner;
the helpers below only spell them as C (index expressions, float literals,
activation calls, loop nests) for the Jinja2 templates in ``templates/``.
"""
from __future__ import annotations

import functools
import hashlib
import textwrap
from pathlib import Path

import jinja2
import numpy as np

from .. import __version__
from ..ir import c_identifier, c_text
from ..schedule import SIMD_ISAS, Buffer, Kernel, Program
from ..weightset import blob_bytes, corruption_cases, dense_layers, f32_members, \
    member_offsets, members_end, pinned_members, structure_hash
from ..weightset import pack as pack_blob
from ..passes.quantize import layer_names

TEMPLATES = Path(__file__).resolve().parent / "templates"
LINE = 90  # wrap initializers before checkpatch's 100 columns
SELFTEST_VECTORS = 8  # golden vectors a module checks when it loads


def cfloat(v) -> str:
    """A C float literal that reads back as exactly ``np.float32(v)``."""
    f = np.float32(v)
    if not np.isfinite(f):
        raise ValueError(f"non-finite constant {f}")
    # the shortest digits that round-trip to this f32, without an exponent
    # (checkpatch --strict reads the '-' of 1e-05 as an operator)
    return np.format_float_positional(f, unique=True, trim="0") + "f"


def positional(v) -> str:
    """A double as C text without an exponent (the shortest that round-trips)."""
    return np.format_float_positional(float(v), unique=True, trim="0")


def cint(v) -> str:
    return str(int(v))


def idx(terms, zero=(), offset: int = 0) -> str:
    """An index expression ``7 + i * 15 - j`` from (loop variable, stride)
    terms after ``offset``; variables in ``zero`` are fixed at 0 and drop
    out.  A negative stride is subtracted (a reversed slice, whose offset
    keeps every index it reaches in range)."""
    out = str(offset) if offset else ""
    for v, s in terms:
        if s == 0 or v in zero:
            continue
        t = v if abs(s) == 1 else f"{v} * {abs(s)}"
        assert s > 0 or out, "a negative stride after nothing"
        out = f"{out} {'+' if s > 0 else '-'} {t}" if out else t
    return out or "0"


def cref(buf: Buffer) -> str:
    """How a kernel names buffer ``buf``: a constant is a member of the
    weight set the kernel is given (``W``), anything else its parameter."""
    return f"W->{buf.name}" if buf.kind == "const" else buf.name


def at(role: str, buf: Buffer, terms, zero=(), offset: int = 0) -> str:
    """How a kernel spells element ``terms`` (after ``offset``) of operand
    ``role``."""
    if buf.kind == "const" and buf.data.ndim == 2:
        assert not offset
        live = [(v, s) for v, s in terms if s != 0]
        (rv, rs), (cv, cs) = live
        assert rs == buf.data.shape[1] and cs == 1, (buf.name, terms)
        return f"{cref(buf)}[{'0' if rv in zero else rv}][{'0' if cv in zero else cv}]"
    return f"{cref(buf) if buf.kind == 'const' else role}[{idx(terms, zero, offset)}]"


def act_call(act: str, params: dict, e: str, lanes: str = "") -> str:
    """The float activation ACT applied to the C expression E; LANES "_x4"
    calls kml_math.h's four-lane twin."""
    if act == "none":
        return e
    if act == "leaky_relu":
        return f"kml_leaky_reluf{lanes}({e}, {cfloat(params['alpha'])})"
    if act == "clip":
        return f"kml_clipf{lanes}({e}, {cfloat(params['min'])}, {cfloat(params['max'])})"
    return f"kml_{act}f{lanes}({e})"


def nest(body: str, loops, depth: int = 1) -> str:
    """Wrap ``body`` (C statements, tab-indented relative to 0) in ``for``
    loops over ``loops`` = [(var, extent)], kernel style: braces only around
    bodies of more than one line."""
    lines = body.strip("\n").split("\n")
    for var, extent in reversed(list(loops)):
        head = f"for ({var} = 0; {var} < {extent}; {var}++)"
        if len(lines) == 1:
            lines = [head, "\t" + lines[0]]
        else:
            lines = [head + " {"] + ["\t" + ln if ln else ln for ln in lines] + ["}"]
    return "\n".join("\t" * depth + ln if ln else ln for ln in lines)


def width(line: str) -> int:
    return len(line.expandtabs(8))


def ccomment(text: str, limit: int = 100) -> str:
    """``text`` as a C comment: ``/* text */`` when that fits in ``limit``
    columns, else a block comment wrapped at word boundaries."""
    if width(f"/* {text} */") <= limit:
        return f"/* {text} */"
    lines = textwrap.wrap(text, limit - 6, break_long_words=False, break_on_hyphens=False)
    return "\n".join(["/*"] + [f" * {ln}" for ln in lines] + [" */"])


def cwrap(line: str, limit: int = 100) -> str:
    """Break a long one-line C declaration or call after its commas, each
    continuation line aligned to the parenthesis its comma is in (kernel
    style: checkpatch --strict checks that alignment)."""
    if width(line) <= limit or "(" not in line:
        return line
    cuts, opens = [], []  # (index of a ", ", column after its innermost "(")
    for i, ch in enumerate(line):
        if ch == "(":
            opens.append(width(line[:i]) + 1)
        elif ch == ")" and opens:
            opens.pop()
        elif ch == "," and line[i + 1:i + 2] == " " and opens:
            cuts.append((i, opens[-1]))
    out, cur, prev, col = [], "", 0, 0
    for i, next_col in cuts + [(len(line) - 1, 0)]:
        piece = line[prev:i + 1]
        if cur and width(cur + piece) > limit:
            out.append(cur)
            cur = "\t" * (col // 8) + " " * (col % 8) + piece.lstrip()
        else:
            cur += piece
        prev, col = i + 1, next_col
    out.append(cur)
    head = line[:line.index("(")].rstrip()
    if max(map(width, out)) > limit and " " in head and "=" not in head:
        # a declaration whose parameters do not fit: its return
        # type on a line of its own, as kernel style allows; for names too
        # long even for that, the parameters on lines of their own
        cut = head.rindex(" ")
        rest = cwrap(line[cut + 1:], limit)
        if max(map(width, rest.split("\n"))) > limit:
            at = line.index("(")
            lines, cur = [line[cut + 1:at + 1]], "\t"
            for piece in line[at + 1:].split(", "):
                if cur != "\t" and width(cur + ", " + piece) > limit:
                    lines.append(cur + ",")
                    cur = "\t" + piece
                else:
                    cur += (", " if cur != "\t" else "") + piece
            rest = "\n".join(lines + [cur])
        return line[:cut] + "\n" + rest
    return "\n".join(out)


def declbreak(line: str, limit: int = 100) -> str:
    """A declaration too long for one line: the name on a line of its own."""
    if width(line) <= limit:
        return line
    decl = line.split("=")[0].rstrip()
    cut = decl.rindex(" ")
    return line[:cut] + "\n" + line[cut + 1:]


def params(k: Kernel, weights: str) -> str:
    """The kernel function's parameters: the weight set (``weights``, the
    struct's C type) if it reads constants, then its runtime operands, by
    role."""
    out = [f"const {weights} *restrict W"] if reads_consts(k) else []
    for role, b in k.operands.items():
        if b.kind == "const":
            continue
        c = b.dtype.ctype
        out.append(f"{c} *restrict {role}" if role == "y" else f"const {c} *restrict {role}")
    return ", ".join(out)


def reads_consts(k: Kernel) -> bool:
    return any(b.kind == "const" for b in k.operands.values())


def arg(b: Buffer) -> str:
    """How ``forward`` passes buffer ``b`` to a kernel."""
    base = {"input": "in", "output": "out", "temp": b.name}[b.kind]
    return f"{base} + {b.offset}" if b.kind in ("input", "output") and b.offset else base


def ewise_expr(k: Kernel, vars: list[str]) -> tuple[str, str]:
    """An elementwise kernel's statement for loop variables ``vars``, and
    its expression on the operands' names, for the comment."""
    roles = [r for r in k.operands if r != "y"]
    terms = {r: [(var, st[i]) for var, (_, st) in zip(vars, k.params["dims"])]
             for i, r in enumerate(roles + ["y"])}
    e = k.params["expr"].format(**{r: at(r, k.operands[r], terms[r]) for r in roles})
    shown = k.params["expr"].format(**{r: (k.operands[r].name if k.operands[r].kind == "const"
                                           else r) for r in roles})
    return f"{at('y', k.operands['y'], terms['y'])} = {e};", shown


def move_view(k: Kernel) -> tuple[list[str], list[tuple[list, str]]]:
    """A move kernel's loop variables, and per operand its loops and its
    copy statement."""
    names, parts = set(), []
    for part in k.params["parts"]:
        vars = loop_vars(part["dims"])
        names |= set(vars) if part["dims"] else set()
        terms = lambda i: [(v, st[i]) for v, (_, st) in zip(vars, part["dims"])]  # noqa: E731
        stmt = (f"{at('y', k.operands['y'], terms(1), offset=part['oy'])} = "
                f"{at(part['role'], k.operands[part['role']], terms(0), offset=part['ox'])};")
        parts.append((list(zip(vars, [e for e, _ in part["dims"]])), stmt))
    return sorted(names), parts


def reduce_view(k: Kernel) -> dict:
    """A reduce kernel's loops (kept axes outside, reduced inside) and the
    spellings of its element, first element and result."""
    p = k.params
    ov = loop_vars(p["outer"])
    rv = loop_vars(p["inner"], "r")
    xo = [(v, st[0]) for v, (_, st) in zip(ov, p["outer"])]
    xr = [(v, st[0]) for v, (_, st) in zip(rv, p["inner"])]
    yo = [(v, st[1]) for v, (_, st) in zip(ov, p["outer"])]
    x = k.operands["x"]
    return {"outer": list(zip(ov, [e for e, _ in p["outer"]])) if p["outer"] else [],
            "inner": list(zip(rv, [e for e, _ in p["inner"]])) if p["inner"] else [],
            "vars": (ov if p["outer"] else []) + (rv if p["inner"] else []),
            "X": at("x", x, xo + xr), "X0": at("x", x, xo), "Y": at("y", k.operands["y"], yo)}


def gather_view(k: Kernel) -> dict:
    """A gather kernel's loops (outer rows o, indices q, inner run r; those
    of extent 1 dropped) and the spellings of its index, element (row j of
    x, j the index read) and result."""
    p = k.params
    n, inner = p["n"], p["inner"]
    zero = {v for v, e in (("o", p["outer"]), ("q", p["q"]), ("r", inner)) if e == 1}
    return {"loops": [(v, e) for v, e in (("o", p["outer"]), ("q", p["q"])) if v not in zero],
            "vars": [v for v in ("o", "q", "r") if v not in zero],
            "I": at("idx", k.operands["idx"], [("q", 1)], zero),
            "X": at("x", k.operands["x"], [("o", n * inner), ("j", inner), ("r", 1)], zero),
            "Y": at("y", k.operands["y"], [("o", p["q"] * inner), ("q", inner), ("r", 1)], zero),
            "inner": [] if "r" in zero else [("r", inner)]}


def matmul_view(k: Kernel) -> dict:
    """Spellings of A(i,k), B(k,j), C(i,j), Y(i,j) for the matmul template."""
    p, ops = k.params, k.operands
    batch = [(f"p{d}", e, st) for d, (e, st) in enumerate(p["batch"])]
    outer = [(v, e) for v, e, _ in batch] + ([("i", p["m"])] if p["m"] > 1 else [])
    zero = set() if p["m"] > 1 else {"i"}
    if p["n"] == 1:
        zero.add("j")
    bt = lambda i: [(v, st[i]) for v, _, st in batch]  # noqa: E731
    a_terms = bt(0) + [("i", p["a"][0]), ("k", p["a"][1])]
    b_terms = bt(1) + [("k", p["b"][0]), ("j", p["b"][1])]
    y_terms = bt(2) + [("i", p["n"]), ("j", 1)]
    v = {
        "outer": outer,
        "cols": [] if p["n"] == 1 else [("j", p["n"])],
        "A0": at("a", ops["a"], a_terms, zero | {"k"}),
        "A": at("a", ops["a"], a_terms, zero),
        "Y": at("y", ops["y"], y_terms, zero),
        "vars": [x for x, _ in outer] + (["j"] if p["n"] > 1 else [])
        + (["k"] if p["k"] > 1 else []),
    }
    if "b" in ops:  # tiled weights ("w", "w_tail") are spelled by the template
        v["B0"] = at("b", ops["b"], b_terms, zero | {"k"})
        v["B"] = at("b", ops["b"], b_terms, zero)
    name = lambda r: ops[r].name if ops[r].kind == "const" else r  # noqa: E731
    c = None
    if "c" in ops:
        assert p.get("order") != "tiles" or p["c"][1] == 1, "tiled epilogue needs contiguous C"
        c = at("c", ops["c"], [("i", p["c"][0]), ("j", p["c"][1])], zero)

    def epilogue(e: str) -> str:
        if p["alpha"] is not None:
            e = f"{cfloat(p['alpha'])} * {e}"
        if c is not None:
            e = f"{e} + {cfloat(p['beta'])} * {c}" if p["beta"] is not None else f"{e} + {c}"
        return act_call(p["act"], p["act_params"], e)

    def pre_x4(e: str) -> str:
        """The epilogue before the activation on four lanes, outputs j..j+3
        (tiled kernels: m = 1, and C, if any, contiguous along j)."""
        if p["alpha"] is not None:
            e = f"{cfloat(p['alpha'])} * {e}"
        if c is not None:
            cv = f"kml_f32x4_load({cref(ops['c']) if ops['c'].kind == 'const' else 'c'} + j)"
            e = f"{e} + {cfloat(p['beta'])} * {cv}" if p["beta"] is not None else f"{e} + {cv}"
        return e

    v["epilogue"] = epilogue
    v["pre_x4"] = pre_x4
    v["act_x4"] = lambda e: act_call(p["act"], p["act_params"], e, "_x4")  # noqa: E731
    wname = name("b") if "b" in ops else (ops.get("w") or ops["w_tail"]).name
    e = f"{name('a')} @ {wname}"
    if p["alpha"] is not None:
        e = f"{cfloat(p['alpha'])} * {e}"
    if c is not None:
        e += f" + {cfloat(p['beta'])} * {name('c')}" if p["beta"] is not None else f" + {name('c')}"
    e = e if p["act"] == "none" else f"{p['act']}({e})"
    v["summary"] = (f"y = {e}, for a {p['m']}x{p['k']}, y {p['m']}x{p['n']}"
                    + (f" ({len(p['batch'])} batch loops)" if p["batch"] else "")
                    + ";\n * each sum runs over k = 0, 1, ... in order")
    v["has_epilogue"] = c is not None or p["alpha"] is not None or p["act"] != "none"
    return v


def requant_call(acc: str, mult: str, shift: str) -> str:
    return f"kml_requant({acc}, {mult}, {shift})"


def q_requant(p: dict, v: str, mult: str, shift: str) -> str:
    """A fixed-point kernel's requantization of accumulator ``v``."""
    return (f"kml_requant_relu({v}, {mult}, {shift})" if p.get("requant") == "relu"
            else f"kml_requant_wide({v}, {mult}, {shift})"
            if p.get("requant") == "wide" else requant_call(v, mult, shift))


def q_output(p: dict, v: str, mult: str, shift: str, raw: bool = False) -> str:
    """The output stage of a fixed-point kernel: requantize ``v`` (unless
    ``raw``: already requantized), then clamp (with a zero point) or look up
    the nonlinearity."""
    r = v if raw else q_requant(p, v, mult, shift)
    if p["mode"] == "lut":
        return f"kml_{p['fn']}_q15(kml_sat_s32({r}))"
    zp = p.get("zp", 0)
    if p.get("requant") == "relu" and p["lo"] == zp:
        # r >= 0: the floor holds by itself (kml_relu_out)
        if p.get("counts") and p["hi"] == 32767:
            return f"kml_relu_out_n({r}, {zp}, {p['hi']}, &sat)"
        return f"kml_relu_out({r}, {zp}, {p['hi']})"
    r = f"{r} + {zp}" if zp > 0 else (f"{r} - {-zp}" if zp < 0 else r)
    if p.get("counts"):
        # leaving the int16 encoding is a saturation; a ReLU's or Clip's
        # own bound inside it is the op (float clamps there too)
        fn = {(True, True): "kml_count16", (False, True): "kml_count_above",
              (True, False): "kml_count_below"}.get((p["lo"] == -32768 and not p.get("relu"),
                                                     p["hi"] == 32767))
        r = f"{fn}({r}, &sat)" if fn else r
    return f"kml_clamp({r}, {p['lo']}, {p['hi']})"


def loops_zero(p: dict) -> set[str]:
    """Softmax/argmax loop variables that have no loop (extent 1)."""
    return ({"o"} if p["outer"] == 1 else set()) | ({"q"} if p["inner"] == 1 else set())


def loop_vars(dims, prefix: str = "i") -> list[str]:
    return [prefix] if len(dims) == 1 else [f"{prefix}{d}" for d in range(len(dims))]


def cvalue(x) -> str:
    """A C literal for one array element: exact floats, plain integers."""
    return cfloat(x) if isinstance(x, (float, np.floating)) else str(int(x))


def initializer(data: np.ndarray, indent: int = 1) -> str:
    """Lines of a C initializer for ``data`` (any rank), wrapped."""
    pad = "\t" * indent
    if data.ndim == 1:
        text = ", ".join(cvalue(x) for x in data) + ","
        return "\n".join(pad + ln for ln in textwrap.wrap(text, LINE - 8 * indent))
    if data.ndim > 2:
        return "\n".join(f"{pad}{{\n{initializer(sub, indent + 1)}\n{pad}}}," for sub in data)
    rows = []
    for row in data:
        text = ", ".join(cvalue(x) for x in row)
        parts = textwrap.wrap(text, LINE - 8 * (indent + 1))
        if len(parts) == 1:
            rows.append(f"{pad}{{ {parts[0]} }},")
        else:
            rows.append(pad + "{")
            rows.extend(pad + "\t" + ln for ln in parts)
            rows.append(pad + "},")
    return "\n".join(rows)


BITS = {1: ("u8", np.uint8), 4: ("u32", np.uint32), 8: ("u64", np.uint64)}


def bits_hex(values: np.ndarray, dtype) -> list[str]:
    """Bit patterns of values of element type ``dtype`` (an in[] or out[]
    carrier), for golden vectors: the C needs no FPU to hold them."""
    a = np.ascontiguousarray(np.asarray(values).astype(dtype.np))
    return [f"0x{int(u):0{2 * dtype.size}x}" for u in a.view(BITS[dtype.size][1]).reshape(-1)]


def macro_init(values) -> str:
    """``{ a, b, ... }`` for a #define, continued with backslashes if long
    (the closing brace on the last values' line: checkpatch reads a line of
    its own as the end of a function)."""
    text = ", ".join(str(int(v)) for v in values)
    lines = textwrap.wrap(text, LINE - 16)
    if len(lines) == 1:
        return "{ " + lines[0] + " }"
    return "{ \\\n" + "".join("\t" + ln + " \\\n" for ln in lines[:-1]) + "\t" + lines[-1] + " }"


def const_layout(b: Buffer) -> str:
    if b.layout:
        return b.layout
    rows, cols = b.data.shape
    if b.dtype.name == "f32":
        return f"{rows} inputs x {cols} outputs, row k holds input k's weights"
    return f"{rows} outputs x {cols} inputs, row n holds output n's weights"


def wrap_list(items: list[str], indent: int) -> str:
    pad = "\t" * indent
    text = ", ".join(items) + ","
    return "\n".join(pad + ln for ln in textwrap.wrap(text, LINE - 8 * indent))


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment, made once per process: Jinja compiles
    each template once and keeps it (compiling them took most of a small
    model's compile).  Nothing in it changes per model; what a template
    needs of the model comes from the render context (``params`` reads
    ``weights_t`` there), so that renders cannot see each other's state."""
    options = dict(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                   undefined=jinja2.StrictUndefined)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             bytecode_cache=_TemplateCache(options), **options)
    env.filters.update(nest=nest, cfloat=cfloat, wrap_list=wrap_list, cwrap=cwrap,
                       macro_init=macro_init, positional=positional, ctext=c_text,
                       ccomment=ccomment, cref=cref, declbreak=declbreak)
    env.globals.update(cfloat=cfloat, idx=idx, at=at, act_call=act_call, reads_consts=reads_consts,
                       arg=arg, matmul_view=matmul_view, move_view=move_view,
                       reduce_view=reduce_view, gather_view=gather_view, ewise_expr=ewise_expr, q_requant=q_requant, loop_vars=loop_vars, loops_zero=loops_zero,
                       initializer=initializer, bits_hex=bits_hex, version=__version__,
                       const_layout=const_layout, macro=macro, q_output=q_output,
                       zip=zip, enumerate=enumerate, dict=dict, params=_params)
    return env


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept across processes (each ``kmlc`` command
    would compile them again, most of a small model's compile), in
    ``~/.cache/kmlc/templates``: one directory per Jinja version and
    environment options, an entry per template source (Jinja checks its
    checksum).  A cache that cannot be written is only slower."""

    def __init__(self, options: dict):
        from ..targets.kunit import cache_dir

        tag = hashlib.sha256(repr(sorted(options.items())).encode()).hexdigest()[:12]
        where = cache_dir() / "templates" / f"jinja-{jinja2.__version__}-{tag}"
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        super().__init__(str(where), "%s.cache")

    def load_bytecode(self, bucket) -> None:
        # a bad entry's magic, checksum or code Jinja itself resets; a
        # read that fails is a miss
        try:
            super().load_bytecode(bucket)
        except OSError:
            bucket.reset()

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


@jinja2.pass_context
def _params(tctx, k: Kernel) -> str:
    return params(k, tctx["weights_t"])


# --------------------------------------------------------------------------
# Files per target
# --------------------------------------------------------------------------

def macro(name: str) -> str:
    """A source tensor name as part of a C macro name (at most 24
    characters of it; port_macros keeps them distinct)."""
    return c_identifier(name, "T").upper()[:24].rstrip("_")


# What model.h defines after KML_<NAME>_ besides the ports' offsets
HEADER_MACROS = {"IN_ELEMS", "OUT_ELEMS", "WORKSPACE_BYTES", "WORKSPACE_ALIGN", "WEIGHT_BYTES",
                 "IN_FRAC_BITS", "SIMD_MACS"}


def port_macros(prog: Program) -> dict[str, list[str]]:
    """Each port's macro, KML_<NAME>_ + IN_<port> or OUT_<port>, in port
    order: distinct from each other and from every other macro model.h
    defines (an output's _ZERO_POINT and _SCALE included), so that ports
    whose names spell the same macro (``y`` and ``Y``, ``é`` and ``ü``, an
    output listed twice, an input named ``ELEMS``) get _2, _3... in order."""
    taken, out = set(HEADER_MACROS), {"in": [], "out": []}
    for role, ports, extra in (("in", prog.inputs, ()),
                               ("out", prog.outputs, ("_ZERO_POINT", "_SCALE"))):
        for p in ports:
            base = f"{role.upper()}_{macro(p.name)}"
            m, i = base, 1
            while {m, *(m + e for e in extra)} & taken:
                i += 1
                m = f"{base}_{i}"
            taken |= {m, *(m + e for e in extra)}
            out[role].append(m)
    return out


def core_name(prog: Program) -> str:
    """The model's math translation unit: <name>_fp (float) or <name>_fx."""
    return f"{prog.name}_{'fp' if prog.numerics == 'float' else 'fx'}"


def fixed_interface(prog: Program) -> dict | None:
    """The fixed-point encoding of inputs and outputs, in port order."""
    q = prog.quant
    if q is None:
        return None
    enc = {"frac_bits": [], "outputs": [],
           "weight_bits": dict(q.weight_bits), "decision_agreement": q.decision_agreement}
    for p in prog.inputs:
        enc["frac_bits"] += q.inputs[p.buffer.value]["frac_bits"]
    # what kmlc pack pins for a retrained model (QuantOptions.pinned)
    dense = [op for op in prog.graph.ops if op.kind == "qdense"]
    enc["formats"] = dict(q.formats, dense={
        n: [op.attrs["acc"], "wide_bound" in op.attrs] for op, n in zip(dense, layer_names(dense))})
    for p, m in zip(prog.outputs, port_macros(prog)["out"]):
        enc["outputs"].append(dict(q.outputs[p.buffer.value], **q.output_bounds.get(
            p.buffer.value, {}), name=p.name, macro=m))
    return enc


# the version of the weight set the KUnit suite validates (a pack of the compiled set)
KUNIT_SET_VERSION = 7


def context(prog: Program, source: str, sha256: str, user_cflags: str) -> dict:
    name = prog.name
    fixed = prog.numerics == "fixed"
    luts = sorted({f"KML_LUT_{k.params['fn'].upper()}" for k in prog.kernels
                   if k.params.get("mode") == "lut"}
                  | ({"KML_LUT_EXP"} if any(k.kind == "qsoftmax" for k in prog.kernels)
                     else set()))
    return {
        "prog": prog, "name": name, "NAME": name.upper(), "module": f"kml_{name}",
        "source": c_text(source), "sha256": sha256, "plan": prog.plan,
        "temps": sorted(prog.buffers("temp"), key=lambda b: b.offset),
        "consts": prog.weight_set(),
        "live": {r.name: (r.start, r.end) for r in prog.plan.requests},
        "user_cflags": user_cflags, "fixed": fixed, "core": core_name(prog),
        "weights_t": f"struct kml_{core_name(prog)}_weights",
        "structure_hash": np.frombuffer(structure_hash(prog), np.uint8),
        # what kml_set_check() re-proves of a new weight set (kml_weights.h)
        "set_dense": dense_layers(prog), "blob_bytes": blob_bytes(prog),
        "set_offsets": member_offsets(prog),
        "set_end": members_end(prog),
        "set_pinned": pinned_members(prog),
        "set_f32": [] if fixed else f32_members(prog),
        "in_t": prog.in_dtype.ctype, "out_t": prog.out_dtype.ctype,
        "in_bits": BITS[prog.in_dtype.size][0], "out_bits": BITS[prog.out_dtype.size][0],
        "luts": luts, "counting": any(k.params.get("counts") for k in prog.kernels),
        "ports": port_macros(prog), "encoding": fixed_interface(prog),
        "hooks": list(getattr(prog, "hooks", ()) or ()), **binding_context(prog),
        **simd_context(prog),
    }


def simd_context(prog: Program) -> dict:
    """The kernels with SIMD paths (paired dense layers with full tiles or
    outputs narrower than a tile, passes/lower.py; then the input encoding)
    and the multiply-adds those paths take per call."""
    ks = [k for k in prog.kernels if k.kind == "qdense" and k.params["tiles"].get("simd")]
    macs = sum(k.params["k"] * (t["count"] * t["width"] + (t["tail"] if t["narrow"] else 0))
               for k in ks for t in [k.params["tiles"]])
    # ... and, in a model that has them, its input encoding (s32 inputs,
    # not saturated: kml_centre4_*) four inputs at a time
    enc = [k for k in prog.kernels if ks and k.kind == "qinput" and not k.params["saturate"]
           and k.operands["x"].dtype.ctype == "s32" and k.params["n"] >= 4]
    return {"simd_kernels": [k.fn for k in enc + ks], "simd_macs": macs, "isas": SIMD_ISAS,
            "simd": bool(ks)}


def hook_owner(prog: Program):
    """The owner of the model's hook (kmlc.hooks), or None."""
    from ..hooks import owner

    hooks = list(getattr(prog, "hooks", ()) or ())
    return owner(hooks[0]) if hooks else None


def binding_context(prog: Program) -> dict:
    """What kml_binding.h says: the hook's decision and its parameters'
    compiled-in defaults, as C."""
    from ..hooks import guard
    from ..hooks.base import c_value, doc_value

    hook = hook_owner(prog)
    needs = []          # a float model's FPU section: fpu_flags.mk.j2 checks (x86-64 or arm64)
    if hook is not None:
        needs += [n for n in hook.kconfig if n not in needs]
    if hook is None:
        return {"hook": None, "kconfig_needs": needs}
    values = getattr(prog, "hook_params", None) or hook.defaults()
    return {"hook": hook, "binding": hook.binding(prog), "kconfig_needs": needs,
            "guard": guard.binding(prog),
            "hook_objects": [s[:-2] + ".o" for s in hook.kernel_sources],
            "hook_params": [{"macro": f"KML_{hook.stem.upper()}_{k.upper()}",
                             "value": c_value(v), "doc": doc_value(v)}
                            for k, v in values.items()]}


def runtime_sources(target: str, names: list[str]) -> dict[str, str]:
    """The hook's hand-written C, from runtime-kernel/ or runtime-user/,
    copied as it is into a target directory."""
    from .. import runtime_kernel, runtime_user

    def path(f):
        return runtime_user.DIR / f if (runtime_user.DIR / f).is_file() else runtime_kernel.DIR / f
    return {f"{target}/{f}": path(f).read_text() for f in names}


def model_sources(env, ctx) -> dict[str, str]:
    """The model itself: the same files go into every target."""
    n = ctx["name"]
    return {
        f"{n}.h": env.get_template("model.h.j2").render(ctx),
        f"{n}.c": env.get_template("model.c.j2").render(ctx),
        f"{ctx['core']}.c": env.get_template("model_core.c.j2").render(ctx),
    }


def render(prog: Program, targets: list[str], *, source: str, sha256: str,
           user_cflags: str, goldens: tuple[np.ndarray, np.ndarray] | None = None
           ) -> dict[str, str]:
    """All generated text files, keyed by path relative to OUTDIR."""
    env = environment()
    ctx = context(prog, source, sha256, user_cflags)
    n = ctx["name"]
    model = model_sources(env, ctx)
    files: dict[str, str] = {}
    if "kernel" in targets:
        assert goldens is not None
        kctx = dict(ctx, goldens=list(zip(*goldens))[:SELFTEST_VECTORS])
        files.update({f"kernel/{k}": v for k, v in model.items()})
        files["kernel/Kbuild"] = env.get_template("Kbuild.j2").render(ctx)
        files["kernel/Makefile"] = env.get_template("Makefile.kernel.j2").render(ctx)
        files["kernel/Kconfig"] = env.get_template("Kconfig.module.j2").render(ctx)
        files[f"kernel/{n}_mod.c"] = env.get_template("module.c.j2").render(kctx)
        files.update(runtime_sources("kernel", ["kml_swap.c"]))
        # the self-test's inputs, as bit patterns: debugfs "goldens" runs them
        # on the running weight set; the twin must print the same
        files["kernel/selftest_inputs.txt"] = "".join(
            " ".join(bits_hex(x, prog.in_dtype)) + "\n" for x, _, _ in kctx["goldens"])
        if ctx["hook"] is not None:
            files["kernel/kml_binding.h"] = env.get_template("binding.h.j2").render(ctx)
            files.update(runtime_sources("kernel", ctx["hook"].kernel_files))
    if "user" in targets:
        files.update({f"user/{k}": v for k, v in model.items()})
        files["user/Makefile"] = env.get_template("Makefile.user.j2").render(ctx)
        files[f"user/{n}_twin.c"] = env.get_template("twin.c.j2").render(ctx)
        if ctx["hook"] is not None:
            files["user/kml_binding.h"] = env.get_template("binding.h.j2").render(ctx)
            files.update(runtime_sources("user", ctx["hook"].user_files))
    if "kunit" in targets:
        assert goldens is not None
        files.update({f"kunit/{k}": v for k, v in model.items()})
        kctx = dict(ctx, goldens=list(zip(*goldens)),
                    blob=np.frombuffer(pack_blob(prog, KUNIT_SET_VERSION), np.uint8),
                    blob_cases=corruption_cases(prog), blob_version=KUNIT_SET_VERSION)
        files["kunit/Kconfig"] = env.get_template("Kconfig.j2").render(kctx)
        files["kunit/Makefile"] = env.get_template("Makefile.kunit.j2").render(kctx)
        files["kunit/.kunitconfig"] = env.get_template("kunitconfig.j2").render(kctx)
        files[f"kunit/{n}_kunit.c"] = env.get_template("kunit_test.c.j2").render(kctx)
    return files
