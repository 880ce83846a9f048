#!/usr/bin/env bash
# kmlc's two entry points (see README.md):
#
#   scripts/bootstrap.sh demo   set up, then compile a bundled example model
#                               into a kernel module, a twin and a KUnit suite
#   scripts/bootstrap.sh test   set up, then run the whole test suite
#                               (unit, ONNX conformance, module builds, KUnit)
#
# Setup is idempotent and quick the second time: Debian packages are
# installed only when missing, the virtualenv (.venv) is kept, pip runs only
# when setup.py changed, and kernel trees and builds are cached under
# ~/.cache/kmlc at fixed paths.  Setup prints one line per step; apt's and
# pip's own output is in build/setup.log, shown when a step fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=${1:-}
case "$MODE" in
demo|test) ;;
*) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

# One line per step, with its time; what a step prints (apt, pip, venv)
# goes to LOG, whose last lines are shown if the step fails.
LOG="$ROOT/build/setup.log"
mkdir -p "$ROOT/build"
: >"$LOG"
B="" N=""
[ -t 1 ] && B=$'\033[1m' N=$'\033[0m'
say() { printf '%s==> %s%s\n' "$B" "$*" "$N"; }
step() {	# step WHAT CMD...: CMD's output into LOG, one line with its time
	local what=$1 t=$SECONDS rc=0
	shift
	printf '%s==> %s ...%s ' "$B" "$what" "$N"
	printf '\n==> %s: %s\n' "$what" "$*" >>"$LOG"
	"$@" >>"$LOG" 2>&1 </dev/null || rc=$?
	if ((rc)); then
		printf 'failed (exit %d)\n' "$rc"
		printf '%s\n' "--- the last 30 lines of $LOG:" >&2
		tail -n 30 "$LOG" >&2
		printf '%s\n' "--- (the whole log: $LOG)" >&2
		exit "$rc"
	fi
	printf 'done, %ds\n' $((SECONDS - t))
}

# --- Debian packages --------------------------------------------------------
# compilers and Kbuild, 6.1 headers and source (module builds, KUnit, the
# debug kernel), the PREEMPT_RT headers, 6.12's source (the NFS hook's
# tracepoint prototypes are checked against it), qemu (KUnit on x86_64,
# the hooks in real kernels), clang (second compiler for the twin),
# e2fsprogs (the admission hook's ext4 test), dkms (kmlc package: the .deb
# is installed and DKMS builds it for each kernel), the arm64 cross compiler,
# qemu-user and qemu-system-arm (kmlc build/run/kunit/qemu-test --arch arm64;
# Debian's arm64 kernel, headers and busybox are fetched with apt-get
# download, so arm64 is added as a dpkg architecture)
PACKAGES=(build-essential bc bison flex libelf-dev libssl-dev kmod cpio xz-utils perl
	python3 python3-venv python3-dev linux-headers-amd64 linux-headers-rt-amd64
	linux-source-6.1 linux-source-6.12 qemu-system-x86 clang libclang-rt-dev lld llvm
	dwarves e2fsprogs dkms gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
	qemu-system-arm)
missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
# The newest Linux 6.12 headers Debian 12 offers: the second column of the
# build matrix (the tests build every module against each installed kernel).
have612=$(ls -d /usr/src/linux-headers-6.12.*-amd64 2>/dev/null | head -1 || true)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
arm64=yes
dpkg --print-foreign-architectures | grep -qx arm64 || arm64=""
if [ -z "$arm64" ]; then
	step "adding arm64 as a dpkg architecture (its kernel headers)" \
		$SUDO dpkg --add-architecture arm64
fi
if ((${#missing[@]})) || [ -z "$have612" ] || [ -z "$arm64" ]; then
	step "updating the Debian package lists" $SUDO apt-get update -q
fi
if [ -z "$have612" ]; then
	h612=$(apt-cache search --names-only '^linux-headers-6\.12\.[0-9]+\+deb12-amd64$' |
		awk '{print $1}' | sort -V | tail -1)
	[ -n "$h612" ] && missing+=("$h612")
fi
if ((${#missing[@]})); then
	step "installing ${#missing[@]} Debian packages (${missing[*]})" \
		$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
	say "Debian packages: all ${#PACKAGES[@]} installed"
fi

# --- Python -----------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
	step "creating .venv" python3 -m venv .venv
fi
EXTRAS=""
[ "$MODE" = test ] && EXTRAS="[test,torch,tvm,sklearn,trees]"
stamp=".venv/.kmlc-installed-pyc$(echo "$EXTRAS" | tr -dc 'a-z')"
# uv installs from its own wheel cache (~/.cache/uv, hard links into .venv):
# pip keeps no cache of this index's wheels, and fetched PyTorch's 4 GB again
# on every fresh clone (142 s of a CI run).  --compile-bytecode: the .pyc of
# every installed module, written once (35 s): where PYTHONDONTWRITEBYTECODE
# is set, as on our machines, Python writes none, so without them every
# process compiled numpy, onnx and the rest again (0.7 s of a kmlc command's
# 1.4 s; half of the fuzzer's time)
pip_install() {
	.venv/bin/python -m pip install --progress-bar off "uv>=0.5" &&
		.venv/bin/python -m uv pip install --python .venv/bin/python --compile-bytecode \
			-e ".$EXTRAS"
}
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
	step "installing kmlc into .venv (uv pip install -e .$EXTRAS)" pip_install
	touch "$stamp"
else
	say ".venv: kmlc$EXTRAS installed, setup.py unchanged"
fi
# Python uses the bytecode it finds even where PYTHONDONTWRITEBYTECODE stops it
# writing any: kmlc's compiled once here, not again in every kmlc process
.venv/bin/python -m compileall -q -j 0 compiler frontends runtime-kernel runtime-user tests \
	examples >/dev/null 2>&1 || true

# --- the job ----------------------------------------------------------------
if [ "$MODE" = demo ]; then
	OUT=build/readahead
	say "compiling examples/models/readahead.onnx -> $OUT"
	.venv/bin/kmlc compile examples/models/readahead.onnx -o "$OUT"
	say "building the kernel module (W=1)"
	.venv/bin/kmlc build "$OUT"
	say "running the twin on sample features"
	.venv/bin/python - "$OUT" <<'EOF'
import sys
import numpy as np
sys.path.insert(0, "examples/models")
import seed_models
np.save(sys.argv[1] + "/sample_inputs.npy", seed_models.sample_inputs("readahead", 8, seed=0))
EOF
	.venv/bin/kmlc run "$OUT" --input "$OUT/sample_inputs.npy" --output "$OUT/sample_outputs.npy"
	say "checking the twin against onnxruntime"
	.venv/bin/kmlc verify examples/models/readahead.onnx --data "$OUT/sample_inputs.npy"
	cat <<EOF

kmlc demo done.  In $OUT/:
  kernel/  $(cd "$OUT/kernel" && ls *.ko) and its sources (Kbuild, readahead_fp.c, ...)
  user/    libkml_readahead.so, the userspace twin (Python: kmlc.load("$OUT"))
  kunit/   the golden-vector KUnit suite: .venv/bin/kmlc kunit $OUT
  report.txt  the lowered schedule and memory plan
EOF
else
	# one pytest worker per core, at most 4: the longest tests boot qemu
	# (TCG, one host thread each) or run a compiler, and spread over the
	# cores they finish in about half the time on two (README, Tests)
	jobs=${KMLC_TEST_JOBS:-$(nproc)}
	[ "$jobs" -gt 4 ] && jobs=4
	say "running the test suite ($jobs workers)"
	.venv/bin/python -m pytest -q -ra -n "$jobs" --dist worksteal tests
fi
