"""Data package: C only the userspace twin needs (kml_user_fpu.h), and the
hooks' feature extractors as a library for simulators
(kml_features_twin.c, loaded by kmlc.features)."""
from pathlib import Path

DIR = Path(__file__).resolve().parent
