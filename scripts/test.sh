#!/usr/bin/env bash
# Sets everything up, then runs the test suite. CPU tests always run; CUDA tests run when a GPU is present
# and are reported as skipped otherwise. Fails when no test ran at all (pytest exit 5) or when no test
# passed, so that an empty or all-skipped run is never taken for success.
set -uo pipefail
source "$(dirname "$0")/setup.sh" || exit 1
set +e
log=$(mktemp)
python -m pytest -rs "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 5 ]; then echo "test.sh: pytest collected no tests"; exit 1; fi
if [ "$rc" -eq 0 ] && ! grep -Eq "[0-9]+ passed" "$log"; then echo "test.sh: no test passed"; exit 1; fi
exit "$rc"
