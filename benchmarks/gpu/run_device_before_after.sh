#!/usr/bin/env bash
# The same plan at the same time on two GPUs: GPU 0 with this tree's probe ("after"),
# GPU 1 with an older copy of the probe (DIR, e.g. `git archive COMMIT probe exporters`).
#   benchmarks/gpu/run_device_before_after.sh PLAN OLD_PROBE_DIR SECONDS
set -uo pipefail
cd "$(dirname "$0")/../.."
PLAN=$1; OLD=$(readlink -f "$2"); SECS=${3:-400}
CUDA_VISIBLE_DEVICES=0 CPUS=0-11 READER_CPUS=12-13 bash benchmarks/gpu/run_device.sh "$PLAN" after "$SECS" > /tmp/after.out 2>&1 &
a=$!
HARNESS_PROBE_PATH=$OLD CUDA_VISIBLE_DEVICES=1 CPUS=16-27 READER_CPUS=28-29 bash benchmarks/gpu/run_device.sh "$PLAN" before "$SECS" > /tmp/before.out 2>&1 &
b=$!
wait $a; wait $b
grep -h "stepwise\|ready in\|stopping\|failed" /tmp/after.out /tmp/before.out
tail -n 3 /tmp/after.out /tmp/before.out
