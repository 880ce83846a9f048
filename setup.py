"""kmlc packaging: the package is ``kmlc`` (from compiler/), with its
frontends (frontends/) and the C runtime headers (runtime-kernel/,
runtime-user/) installed as data packages inside it."""
from setuptools import setup

setup(
    name="kmlc",
    version="0.1.0",
    description="A model compiler that puts learned storage policies into the Linux kernel",
    python_requires=">=3.10",
    packages=["kmlc", "kmlc.passes", "kmlc.codegen", "kmlc.targets", "kmlc.hooks",
              "kmlc.frontends", "kmlc.runtime_kernel", "kmlc.runtime_user"],
    package_dir={
        "kmlc": "compiler",
        "kmlc.frontends": "frontends",
        "kmlc.runtime_kernel": "runtime-kernel",
        "kmlc.runtime_user": "runtime-user",
    },
    package_data={
        "kmlc.codegen": ["templates/*.j2"],
        "kmlc.targets": ["qemu_tools/*.c"],
        "kmlc.runtime_kernel": ["*.h", "*.c"],
        "kmlc.runtime_user": ["*.h", "*.c"],
    },
    install_requires=["numpy>=1.24", "onnx>=1.15", "onnxruntime>=1.17", "jinja2>=3.1",
                      "click>=8.1"],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3.5",
                 "matplotlib>=3.5"],   # matplotlib: the examples' plots
        "torch": ["torch>=2.4", "onnxscript"],
        "tvm": ["apache-tvm>=0.27,<0.28"],
        "sklearn": ["scikit-learn>=1.3", "skl2onnx>=1.16"],
        # LightGBM and XGBoost estimators (xgboost-cpu: without the CUDA libraries)
        "trees": ["scikit-learn>=1.3", "skl2onnx>=1.16", "onnxmltools>=1.12", "lightgbm>=4",
                  "xgboost-cpu>=2"],
        "bench": ["apache-tvm>=0.27,<0.28", "matplotlib>=3.5",
                  # benchmarks/trees.py's peers
                  "treelite>=4", "tl2cgen>=1", "m2cgen>=0.10", "emlearn>=0.20",
                  "scikit-learn>=1.3", "skl2onnx>=1.16"],
    },
    entry_points={"console_scripts": ["kmlc=kmlc.cli:main"]},
)
