#!/usr/bin/env bash
# A fuzzing campaign: both targets, one after the other, each for SECONDS (default 1800),
# then their figures: executions, executions per second, coverage, and any crashers.
#
#   fuzz/campaign.sh 3600                    # an hour per target
#   fuzz/campaign.sh 600 decode              # ten minutes of one target
#
# The committed seed corpora (fuzz/corpus/<target>) are read, never written: what a campaign
# finds goes to a scratch corpus under $CAMPAIGN_DIR (default target/fuzz-campaign), crashers
# to fuzz/artifacts/<target>/. Every crasher becomes a named regression test in tests/
# (docs/design.md §12). Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the stable
# toolchain runs it with RUSTC_BOOTSTRAP=1. Sanitizers: none by default (safe Rust above
# redb; set SANITIZER=address for a slower run under AddressSanitizer).
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-1800}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(crash_recovery decode)
sanitizer=${SANITIZER:-none}
campaign=${CAMPAIGN_DIR:-../target/fuzz-campaign}
export RUSTC_BOOTSTRAP=1
mkdir -p "$campaign"

declare -A max_len=([crash_recovery]=128 [decode]=4096)
# As .ci/run: no comparison tracing for crash_recovery (no magic values in its input), nor
# the entropic schedule (its bookkeeping over this target's many features cost half the run).
declare -A build_flags=([crash_recovery]=--no-trace-compares [decode]=)
declare -A run_flags=([crash_recovery]=-entropic=0 [decode]=)
# crash_recovery's allocator is mimalloc, except under a sanitizer: its allocator must see
# every allocation.
features=()
[[ $sanitizer == none ]] || features=(--no-default-features)
for target in "${targets[@]}"; do
    corpus="$campaign/$target"
    mkdir -p "$corpus"
    log="$campaign/$target.log"
    echo "== $target: ${seconds} s, sanitizer $sanitizer, log $log"
    cargo fuzz run --sanitizer "$sanitizer" --release ${build_flags[$target]} "${features[@]}" \
        "$target" \
        "$corpus" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len="${max_len[$target]}" -len_control=0 -timeout=10 \
        -rss_limit_mb=4096 ${run_flags[$target]} \
        -print_final_stats=1 >"$log" 2>&1 || echo "   $target stopped with a finding (see below)"
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 || true)
    echo "   executions: ${execs:-?}, per second: ${rate:-?}, last ${cov:-coverage: ?}"
    echo "   corpus: $(ls "$corpus" | wc -l) inputs"
    grep -h 'crash_recovery report' "$log" | tail -n 1 | sed 's/^/   /' || true
    crashers=$(ls "artifacts/$target" 2>/dev/null | grep -E '^(crash|oom|timeout|leak)-' || true)
    if [[ -n $crashers ]]; then
        echo "   crashers in fuzz/artifacts/$target:"
        echo "$crashers" | sed 's/^/     /'
    else
        echo "   crashers: none"
    fi
done
