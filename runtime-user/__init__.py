"""Data package: C headers only the userspace twin needs."""
from pathlib import Path

DIR = Path(__file__).resolve().parent
