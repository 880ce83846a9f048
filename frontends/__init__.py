"""Frontends: each turns a model from some framework into kmlc graph IR.

``onnx`` is the reference route; the PyTorch and TVM frontends go through it
or produce the same IR.
"""
