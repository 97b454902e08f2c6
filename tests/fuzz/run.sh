#!/usr/bin/env bash
# Runs each fuzz target for SECONDS on its corpus (build/fuzz/corpus/T,
# grown from build/fuzz/seeds/T), one process per target, findings into
# build/fuzz/findings/T. Usage: run.sh SECONDS TARGET...
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=$1
shift
status=0
for t in "$@"; do
    mkdir -p "build/fuzz/corpus/$t" "build/fuzz/findings/$t"
    echo "fuzz: $t for ${secs}s" >&2
    # -rss_limit_mb: a loader asked for more than this on a small file is a finding too.
    if ! "build/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=262144 \
        -artifact_prefix="build/fuzz/findings/$t/" -close_fd_mask=2 -print_final_stats=1 \
        "build/fuzz/corpus/$t" "build/fuzz/seeds/$t" 2>&1 | tail -n 12; then
        status=1
    fi
done
found=$(find build/fuzz/findings -type f | wc -l)
echo "fuzz: $found finding(s) under build/fuzz/findings" >&2
exit $status
