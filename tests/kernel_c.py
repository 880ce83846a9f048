"""Checks of generated C that hold for every numerics mode: kernel
standards a reviewer would otherwise check by eye."""
import re
import subprocess
from pathlib import Path

from kmlc.targets import user


def check_no_libm_allocation_or_mutable_globals(outdir: Path, name: str) -> None:
    so = outdir / "user" / f"libkml_{name}.so"
    und = subprocess.run(["nm", "-uD", so], capture_output=True, text=True).stdout
    bad = re.findall(r"\b(exp|expf|tanh|tanhf|log|pow|malloc|calloc|realloc|free)\b", und)
    assert not bad, bad
    for src in user.sources(outdir / "kernel", name)[:2]:
        text = (outdir / "kernel" / src).read_text()
        assert not re.search(r"\b\w*alloc\s*\(|<math\.h>|\bfree\s*\(", text), src
        # file-scope objects must be const: no shared mutable scratch (the
        # SIMD paths' two settings, kml_<name>_forced and _simd_min_macs,
        # are configuration an administrator writes and calls READ_ONCE)
        for ln in text.splitlines():
            if re.match(r"^(static\s+)?(float|int|u\d+|s\d+|unsigned|char)\b[^(]*(=|;)", ln) \
                    and not re.search(rf"\bkml_{name}_(forced|simd_min_macs) =", ln):
                raise AssertionError(f"mutable file-scope object in {src}: {ln}")


def check_stack_and_no_recursion(outdir: Path, name: str, tmp: Path) -> None:
    """Every generated function has a bounded frame of at most 512 bytes, and
    the call graph (gcc's own, -fcallgraph-info) has no cycle."""
    for src in user.sources(outdir / "user", name)[:2]:
        stem = src[:-2]
        subprocess.run(["gcc", *user.CFLAGS, "-O0", "-mno-red-zone", "-fstack-usage",
                        "-fcallgraph-info", "-c", "-o", tmp / f"{stem}.o",
                        outdir / "user" / src], check=True, cwd=tmp)
        su = (tmp / f"{stem}.su").read_text().splitlines()
        assert su
        for ln in su:
            fn, size, kind = ln.rsplit("\t", 2)
            # "dynamic,bounded": a SIMD function realigning its frame for
            # 32-byte vectors (the kernel's stack is 8-byte aligned), bounded
            assert int(size) <= 512 and kind in ("static", "dynamic,bounded"), ln
        graph = (tmp / f"{stem}.ci").read_text()
        edges = re.findall(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"', graph)
        succ: dict[str, set[str]] = {}
        for a, b in edges:
            succ.setdefault(a, set()).add(b)
        seen, done = set(), set()

        def visit(v):
            assert v not in seen or v in done, f"recursion through {v} in {src}"
            if v in seen:
                return
            seen.add(v)
            for w in succ.get(v, ()):
                visit(w)
            done.add(v)
        for v in list(succ):
            visit(v)


_CLEAN: set[tuple[str, str, bool]] = set()   # (name, sha256 of the text, strict) found clean


def check_checkpatch_clean(directory: Path, strict: bool = False) -> None:
    """checkpatch.pl --no-tree -f (with --strict: no check either) on every
    generated .c/.h in a directory, run from inside it with relative names
    (as for files in a tree).  A file whose name and bytes this process
    already found clean is not checked again (the runtime's headers are
    copied into every model's directory); the rest go to one checkpatch
    run, whose report has a "total:" line per file, in order."""
    import hashlib

    from conftest import kernel_tree

    checkpatch = kernel_tree() / "scripts" / "checkpatch.pl"
    files = sorted(p.name for p in Path(directory).iterdir()
                   if p.suffix in (".c", ".h") and not p.name.endswith(".mod.c"))
    assert files
    keys = {f: (f, hashlib.sha256((Path(directory) / f).read_bytes()).hexdigest(), strict)
            for f in files}
    todo = [f for f in files if keys[f] not in _CLEAN]
    if not todo:
        return
    want = "total: 0 errors, 0 warnings, 0 checks" if strict else "total: 0 errors, 0 warnings"
    res = subprocess.run(["perl", checkpatch, "--no-tree", "-f",
                          *(["--strict"] if strict else []), *todo], cwd=directory,
                         capture_output=True, text=True)
    totals = re.findall(r"^total: .*$", res.stdout, re.M)
    assert len(totals) == len(todo), res.stdout + res.stderr
    for f, total in zip(todo, totals):
        assert total.startswith(want), f + "\n" + res.stdout
        _CLEAN.add(keys[f])


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "{name}.h"

int main(int argc, char **argv)
{{
	static {in_t} in[KML_{NAME}_IN_ELEMS];
	static {out_t} out[KML_{NAME}_OUT_ELEMS];
	static unsigned long long ws[KML_{NAME}_WORKSPACE_BYTES / 8 + 1];
	FILE *fi = fopen(argv[1], "rb"), *fo = fopen(argv[2], "wb");
{force}
	while (fread(in, sizeof(in), 1, fi) == 1) {{
		if (kml_{name}_infer(in, out, ws) < 0)
			return 3;
		fwrite(out, sizeof(out), 1, fo);
	}}
	fclose(fo);
	return 0;
}}
"""


def infer_driver(name: str, in_t: str = "s32", out_t: str = "s32", path_arg: bool = False) -> str:
    """A C program that runs model ``name``'s entry point on every row of a
    binary file of in[] arrays, writing out[] arrays: for the sanitizers.
    ``path_arg``: a third argument forces the SIMD path (kml_simd.h)."""
    force = (f"\n\tif (argc > 3 && kml_{name}_set_path(atoi(argv[3])))\n\t\treturn 4;\n"
             if path_arg else "")
    return DRIVER.format(name=name, NAME=name.upper(), in_t=in_t, out_t=out_t, force=force)
