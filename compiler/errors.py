"""The one way a user-facing failure is raised.

Every problem a user can cause (a malformed model, an op kmlc cannot lower,
a model over the kernel budget, a missing toolchain) raises ``KmlcError``
with a message that names the file, node or tensor involved.  The CLI prints
it as a single line and exits non-zero; anything else that escapes is a bug
in kmlc and is reported as an internal error.
"""


class KmlcError(Exception):
    """A problem with the user's input or environment, worded for the user:
    ``message`` (with ``where``) is the one line the CLI prints, control
    characters in it (a name holding a newline) escaped; ``details`` (a
    compiler's or a kernel's output) are shown with KMLC_DEBUG=1."""

    def __init__(self, message: str, *, where: str | None = None, details: str | None = None):
        self.where, self.details = where, details
        self.summary = f"{where}: {message}" if where else message
        super().__init__(self.summary + (f"\n{details}" if details else ""))

    def line(self) -> str:
        """The summary as one line of printable text."""
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in self.summary)


def node_ref(op_type: str, name: str) -> str:
    """How errors refer to an ONNX node: its op type and its name."""
    return f"node '{name}' ({op_type})" if name else f"unnamed {op_type} node"
