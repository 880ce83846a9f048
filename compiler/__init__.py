"""kmlc: a model compiler for learned storage policies in the Linux kernel.

``kmlc.compile`` turns an ONNX model into a kernel module, a userspace twin
and a KUnit suite; ``kmlc.load`` opens a compiled twin from Python;
``kmlc.pack`` writes a retrained model's weights for a compiled one.
"""
__version__ = "0.1.0"

from .api import compile, load, pack  # noqa: E402,F401
from .errors import KmlcError  # noqa: E402,F401
