#!/usr/bin/env bash
# Where a CI run's time goes: runs .ci/run on a fresh clone of this tree's
# HEAD with make, gcc, clang and qemu wrapped by /usr/bin/time, every test's
# duration printed, then sums CPU time per tool and test time per file.
#
#   scripts/ci-profile.sh [OUT]      OUT: a directory for the logs
#                                    (default: a new one under /tmp)
#
# The wrappers add a few milliseconds per call; the tool and per-file sums
# are what to cut from (README, Tests: the CI time).  Run it on an idle
# machine: the test durations are wall times.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$(mktemp -d /tmp/kmlc-ci-profile-XXXX)}
mkdir -p "$OUT/bin"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/tools.log"
# The tool is looked up when it runs, on the PATH without the wrappers:
# on a fresh machine the setup installs clang and qemu after this point.
for t in make gcc clang qemu-system-x86_64 qemu-system-aarch64 aarch64-linux-gnu-gcc; do
	printf '#!/bin/sh\nreal=$(PATH=%s command -v %s) || exit 127\nexec /usr/bin/time -a -o %s -f "%s %%e %%U %%S" "$real" "$@"\n' \
		"$PATH" "$t" "$OUT/tools.log" "$t" >"$OUT/bin/$t"
	chmod +x "$OUT/bin/$t"
done
rm -rf "$OUT/clone"
git clone -q "$ROOT" "$OUT/clone"
start=$SECONDS
rc=0
PATH="$OUT/bin:$PATH" PYTEST_ADDOPTS="--durations=0 -p no:cacheprovider" \
	bash "$OUT/clone/.ci/run" >"$OUT/ci.log" 2>&1 || rc=$?
echo "ci: exit $rc, $(( (SECONDS - start) / 60 )) min; log $OUT/ci.log"
echo "CPU seconds per tool (calls; children included, so make counts its compilers):"
awk '$2 ~ /^[0-9.]+$/ {n[$1]++; cpu[$1] += $3 + $4}
     END {for (t in n) printf "  %-24s %6d calls %9.1f s\n", t, n[t], cpu[t]}' \
	"$OUT/tools.log" | sort -k4 -rn
echo "test seconds per file (setup, call and teardown):"
grep -E '^[0-9.]+s (call|setup|teardown) ' "$OUT/ci.log" |
	awk '{split($3, a, "::"); s[a[1]] += $1; all += $1}
	     END {for (f in s) printf "  %9.1f %s\n", s[f], f; printf "  %9.1f (all)\n", all}' |
	sort -rn
rm -rf "$OUT/clone"
exit $rc
