# kmlc: the benchmark suite (README, "Benchmarks").  Setup and tests are
# scripts/bootstrap.sh's job; run `bash scripts/bootstrap.sh test` first.
#
#   make bench                      everything, about 4 minutes on 2 cores
#   make bench BENCH_ARGS="--models heimdall --sweep none --rounds 3"
#
# The first run installs the benchmark's extra Python packages into .venv
# (pip install -e '.[bench]': apache-tvm, matplotlib).

PYTHON ?= .venv/bin/python
BENCH_ARGS ?=

.PHONY: bench
bench: .venv/.kmlc-bench-deps
	KMLC_BENCH_COMMAND="make bench $(BENCH_ARGS)" $(PYTHON) benchmarks/bench.py $(BENCH_ARGS)

.venv/.kmlc-bench-deps: setup.py
	@test -x $(PYTHON) || { echo "no $(PYTHON): run 'bash scripts/bootstrap.sh test' first" >&2; exit 1; }
	$(PYTHON) -m pip install -q -e '.[bench]'
	@touch $@
