#!/usr/bin/env bash
# Two harness plans at once on a two-GPU machine, one GPU and one disjoint CPU set each
# (engine cores, then two cores for the probe's reader), so they do not compete:
#   benchmarks/gpu/run_device_pair.sh PLAN0 NAME0 PLAN1 NAME1 SECONDS
set -uo pipefail
cd "$(dirname "$0")/../.."
P0=$1; N0=$2; P1=$3; N1=$4; SECS=${5:-480}
nproc; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv,noheader
CUDA_VISIBLE_DEVICES=0 CPUS=0-11 READER_CPUS=12-13 bash benchmarks/gpu/run_device.sh "$P0" "$N0" "$SECS" > "/tmp/$N0.out" 2>&1 &
a=$!
CUDA_VISIBLE_DEVICES=1 CPUS=16-27 READER_CPUS=28-29 bash benchmarks/gpu/run_device.sh "$P1" "$N1" "$SECS" > "/tmp/$N1.out" 2>&1 &
b=$!
wait $a; wait $b
cat "/tmp/$N0.out" "/tmp/$N1.out"
