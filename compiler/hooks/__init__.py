"""Kernel hooks: what attaches a compiled model to a stock kernel.

Each kind of hook has one owner in this package, which holds everything
about it in one spelling: its name, its module parameters and their
ranges, the model interface it needs, its C (``runtime-kernel/kml_<stem>.c``
and ``kml_<stem>_trace.h`` in the module, ``runtime-user/kml_<stem>_twin.c``
in the twin), its trace events and their replay, and its qemu scenario:

    admission   Heimdall's read admission: a device-mapper mirror whose
                reads the model balances (admission.py)
    readahead   KML's readahead, per file (readahead.py)
    nfs-rsize   KML's NFS read size, per mount (nfs_rsize.py)

``kmlc compile --hooks NAME`` checks the model against the owner, renders
``kml_binding.h`` (the model's decision and the parameters' compiled-in
defaults: the only generated hook C) and copies the runtime C.
"""
from __future__ import annotations

from ..errors import KmlcError
from .admission import HOOK as _ADMISSION
from .base import Hook, Param
from .nfs_rsize import HOOK as _NFS
from .readahead import HOOK as _READAHEAD

HOOKS: dict[str, Hook] = {h.name: h for h in (_ADMISSION, _READAHEAD, _NFS)}

__all__ = ["HOOKS", "Hook", "Param", "owner", "check_hooks", "check_hook_params"]


def owner(name: str) -> Hook:
    try:
        return HOOKS[name]
    except KeyError:
        raise KmlcError(f"unknown hook '{name}'; available: {', '.join(HOOKS)}") from None


def check_hooks(prog, hooks, targets) -> list[str]:
    """Validate --hooks against the model: each hook fixes the model's
    interface (the features it feeds, the decision it reads)."""
    if isinstance(hooks, str):
        hooks = [hooks]
    out = [h.strip() for item in hooks for h in str(item).split(",") if h.strip()]
    for h in out:
        owner(h)
    if out and "kernel" not in targets:
        raise KmlcError("--hooks generate kernel code: compile with --target kernel (or all)")
    if len(out) > 1:
        raise KmlcError("one hook per model: compile the model once per hook")
    for h in out:
        if prog.in_dtype.name not in ("f32", "i32", "i64"):
            raise KmlcError(f"the {h} hook feeds integer features; this model takes "
                            f"{prog.in_dtype} inputs (float32, int32 or int64 ones work)")
        owner(h).check(prog)
    return out


def check_hook_params(hooks: list[str], params) -> dict:
    """The hook's module parameters with --hook-param's defaults applied
    (``params``: a dict, or NAME=VALUE strings), each checked against the
    hook's table."""
    if isinstance(params, str):
        params = [params]
    if not isinstance(params, dict):
        pairs = {}
        for item in params or ():
            name, eq, value = str(item).partition("=")
            if not eq or not name.strip():
                raise KmlcError(f"--hook-param '{item}': expected NAME=VALUE")
            pairs[name.strip()] = value.strip()
        params = pairs
    if params and not hooks:
        raise KmlcError("--hook-param sets a hook's module parameter: compile with --hooks")
    hook = owner(hooks[0]) if hooks else None
    out = hook.defaults() if hook else {}
    for name, value in params.items():
        if name not in hook.params:
            raise KmlcError(f"the {hook.name} hook has no parameter '{name}'; it has "
                            f"{', '.join(hook.params)}")
        out[name] = hook.params[name].check(name, value)
    return out
