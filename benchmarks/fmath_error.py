"""Measure kml_math.h's error exhaustively (every finite float32 input).

    python benchmarks/fmath_error.py        # about a minute per function

Compiles benchmarks/fmath_error.c against runtime-kernel/kml_math.h with the
twin's determinism flags and prints the largest ulp error of each function;
docs/numerics.md quotes its output.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "fmath_error"
        subprocess.run(["cc", "-O2", "-ffp-contract=off", "-fno-fast-math",
                        f"-I{ROOT / 'runtime-kernel'}", "-o", str(exe),
                        str(ROOT / "benchmarks" / "fmath_error.c"), "-lm"], check=True)
        return subprocess.run([str(exe)]).returncode


if __name__ == "__main__":
    sys.exit(main())
