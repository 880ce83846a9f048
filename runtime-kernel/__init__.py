"""Data package: the C runtime headers every generated model includes.

``kml_types.h`` (types and errno for both builds), ``kml_math.h`` (the one
definition of float exp/sigmoid/tanh), ``kml_fpu.h`` (the FPU section).
"""
from pathlib import Path

DIR = Path(__file__).resolve().parent
