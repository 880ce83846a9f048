"""kmlc: a model compiler for learned storage policies in the Linux kernel.

``kmlc.compile`` turns an ONNX model into a kernel module, a userspace twin
and a KUnit suite; ``kmlc.load`` opens a compiled twin from Python.
"""
__version__ = "0.1.0"

from .api import compile, load  # noqa: E402,F401
from .errors import KmlcError  # noqa: E402,F401
