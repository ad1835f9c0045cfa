#!/usr/bin/env bash
# The probe's cost, before and after, in one call on one GPU (a machine with vLLM staged):
# the GPU timer's event record, then a plan with this tree's probe
# ("after") and the same or another plan with an older probe ("before", OLD_PROBE_DIR, e.g.
# `git archive OLD_COMMIT probe exporters`), all under one deadline.
#   benchmarks/gpu/run_device_timer_before_after.sh AFTER_PLAN AFTER_S BEFORE_PLAN BEFORE_S OLD_PROBE_DIR
# e.g. benchmarks/gpu/run_device_timer_before_after.sh benchmarks/gpu/plan_cost_crossover_ten_arms_mrv2.json 360 \
#        benchmarks/gpu/plan_cost_crossover_mrv2.json 150 .gpu-old
set -uo pipefail
cd "$(dirname "$0")/../.."
AP=$1; AS=$2; BP=$3; BS=$4; OLD=$(readlink -f "$5")
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} CPUS=${CPUS:-0-13} READER_CPUS=${READER_CPUS:-14-15}
timeout 60 python3 benchmarks/gpu/timer_record.py --json "$OUT/timer_record.json" 2>&1 | tail -20
bash benchmarks/gpu/run_device.sh "$AP" after "$AS"
HARNESS_PROBE_PATH=$OLD bash benchmarks/gpu/run_device.sh "$BP" before "$BS"
