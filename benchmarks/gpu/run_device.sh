#!/usr/bin/env bash
# Runs a harness plan on a GPU machine with vLLM importable, then the ground-truth
# analysis, and packs what comes back into $OUT (at most a few files).
#   benchmarks/gpu/run_device.sh PLAN NAME SECONDS
# Optional: CPUS / READER_CPUS (e.g. 0-11 / 12-13) pin the engines and the probe's readers;
# MAIN_CPU (one of CPUS) puts each engine's main thread alone on that CPU's core after
# start-up; CUDA_VISIBLE_DEVICES picks the GPU.
set -uo pipefail
PLAN=$1; NAME=$2; SECS=${3:-480}
OUT=${OUT:-/tmp/out}; W=/tmp/$NAME
rm -rf "$W"  # a fresh folder: a recording left by an earlier run of NAME stops the reader
mkdir -p "$W" "$OUT"
cd "$(dirname "$0")/../.."
# Preflight, before the deadline starts: a machine that went back between two calls comes
# back bare (the staged vLLM in /tmp/site is gone), and the engine's start would fail
# minutes later with a traceback instead.
[ -f "$PLAN" ] || { echo "run_device: no plan file $PLAN" >&2; exit 2; }
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
  echo "run_device: vLLM is not importable (PYTHONPATH=${PYTHONPATH:-}); on the staged GPU" \
       "machine this one is bare: stage and install again (../shared/gpu/NOTES.md)" >&2
  exit 3
fi
ls probe/engine/accel/_accel*.so >/dev/null 2>&1 || \
  echo "run_device: warning: probe.engine.accel._accel is not built here, so the runs take the pure-Python" \
       "hot path (python3 setup.py build_ext --inplace builds it)" >&2
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
DEADLINE=$(( $(date +%s) + SECS ))
timeout -k 10 $(( SECS + 30 )) python3 benchmarks/gpu/harness.py suite --plan "$PLAN" --out "$W" \
  --deadline "$DEADLINE" ${CPUS:+--cpus "$CPUS"} ${READER_CPUS:+--reader-cpus "$READER_CPUS"} ${MAIN_CPU:+--main-cpu "$MAIN_CPU"} \
  2> "$W/suite.log"
echo "suite rc=$?"; tail -40 "$W/suite.log"
if [ -f "$W/groundtruth.trace.json" ]; then
  # the window and the recording of the experiment that profiled (kind groundtruth/overhead)
  read -r rec win < <(python3 -c "
import json;r=json.load(open('$W/results.json'))
e=[e for e in r['experiments'] if 'groundtruth' in e.get('result',{})][0]
print(e['result'].get('recording', e['scenario']+'.probe.db'), *e['result']['groundtruth']['window_boottime'])")
  rec="$W/$rec"
  python3 benchmarks/gpu/groundtruth.py --trace "$W/groundtruth.trace.json" --recording "$rec" \
    --window $win --out "$W/groundtruth.json" --trimmed "$W/groundtruth.trimmed.json.gz" \
    2>&1 | tail -30
  rm -f "$W/groundtruth.trace.json"
fi
cp "$W/results.json" "$OUT/$NAME-results.json" 2>/dev/null
cp "$W/groundtruth.json" "$OUT/$NAME-groundtruth.json" 2>/dev/null
rm -rf "$W"/rings-*
tar -C /tmp -czf "$OUT/$NAME.tgz" "$NAME"
ls -la "$OUT"
