"""kmlc's I/O admission worked example (Heimdall): synthetic replicated-SSD
traces, period-based labeling, training, the compiled hook and a simulator
comparing it with baseline policies.  Run it with ``python
examples/admission/run.py``; see README.md."""
