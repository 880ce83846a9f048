# kmlc: the benchmark suite (README, "Benchmarks").  Setup and tests are
# scripts/bootstrap.sh's job; run `bash scripts/bootstrap.sh test` first.
#
#   make bench                      everything, about 7 minutes on 2 cores:
#                                   benchmarks/results/{benchmarks,authors_peers,fpu_cost,trees}.md
#   make bench BENCH_ARGS="--models heimdall --sweep none --rounds 3"
#   make fuzz                       5,000 fuzz cases, about an hour on 2 cores
#
# The first run installs the benchmark's extra Python packages into .venv
# (pip install -e '.[bench]': apache-tvm, matplotlib, and the tree peers:
# treelite with tl2cgen, m2cgen, emlearn).

PYTHON ?= .venv/bin/python
BENCH_ARGS ?=
# make fuzz: the fuzzer's long campaign (tests/fuzz/kmlfuzz.py), stopped
# after FUZZ_BUDGET seconds; prints a table per class, exit 1 on any defect.
FUZZ_CASES ?= 5000
FUZZ_SEED ?= 1
FUZZ_BUDGET ?= 5400
FUZZ_ARGS ?=

.PHONY: bench fuzz
bench: .venv/.kmlc-bench-deps
	KMLC_BENCH_COMMAND="make bench $(BENCH_ARGS)" $(PYTHON) benchmarks/bench.py $(BENCH_ARGS)
	$(PYTHON) benchmarks/authors_peers.py
	$(PYTHON) benchmarks/fpu_cost.py
	$(PYTHON) benchmarks/trees.py

.venv/.kmlc-bench-deps: setup.py
	@test -x $(PYTHON) || { echo "no $(PYTHON): run 'bash scripts/bootstrap.sh test' first" >&2; exit 1; }
	$(PYTHON) -m pip install -q -e '.[bench]'
	@touch $@

fuzz:
	@test -x $(PYTHON) || { echo "no $(PYTHON): run 'bash scripts/bootstrap.sh test' first" >&2; exit 1; }
	$(PYTHON) tests/fuzz/kmlfuzz.py --seed $(FUZZ_SEED) --cases $(FUZZ_CASES) \
		--budget $(FUZZ_BUDGET) --kernel-every 100 --json fuzz-results.json $(FUZZ_ARGS)
