#!/usr/bin/env bash
# probe attach against `vllm serve` of the tiny DeepSeek-V3.2 + MTP model on FLASHMLA_SPARSE
# (benchmarks/gpu/serve_attach.py), one run per TP size given, under a deadline:
#   benchmarks/gpu/run_device_serve.sh SECONDS TP [TP ...]
# Needs vLLM importable (PYTHONPATH) and as many GPUs as the largest TP. The project is run
# from this tree; --plugin-shim makes its vllm.general_plugins entry point visible to every
# server process without installing it.
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
END=$(( $(date +%s) + SECS ))
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
SPEC='{"method": "mtp", "num_speculative_tokens": 1, "attention_backend": "FLASHMLA_SPARSE"}'
for TP in "$@"; do
  left=$(( END - $(date +%s) ))
  if (( left < 150 )); then echo "skip tp$TP: ${left}s left"; continue; fi
  W=/tmp/serve-tp$TP; rm -rf "$W"; mkdir -p "$W"  # fresh: a recording left by an earlier run is refused
  timeout -k 20 "$left" python3 benchmarks/gpu/serve_attach.py --name "tp$TP" --tp "$TP" \
    --out "$W" --plugin-shim --window "${WINDOW:-10}" --attach-s "${ATTACH_S:-16}" \
    --start-timeout $(( left - 90 )) -- \
    --dtype bfloat16 --kv-cache-dtype fp8_ds_mla --attention-backend FLASHMLA_SPARSE \
    --speculative-config "$SPEC" --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}' \
    --max-model-len 4096 --max-num-seqs 64 --gpu-memory-utilization 0.3 \
    --generation-config vllm 2> "$W/serve.stderr"
  echo "tp$TP rc=$?"; tail -25 "$W/serve.stderr"
  cp "$W/serve-tp$TP.json" "$OUT/" 2>/dev/null
  cp "$W/serve-tp$TP.report.txt" "$OUT/" 2>/dev/null
  tar -C /tmp -czf "$OUT/serve-tp$TP.tgz" "serve-tp$TP"
done
ls -la "$OUT"
