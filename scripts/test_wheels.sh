#!/usr/bin/env bash
# Run tests/wheels once per vLLM wheel tree (0.26.0, 0.28.0, 0.30.0, 0.33.0, 0.34.0); fail if
# any fails.
#
# Usage: scripts/test_wheels.sh [PYTHON] [PYTEST_ARGS...]
#   PYTHON       interpreter with pytest, hypothesis and the CPU torch (default: python3)
#   PYTEST_ARGS  passed on to pytest (e.g. -k mrv2 -x)
#
# Trees: PROBE_TEST_VLLM_TREES (space-separated paths) when set; otherwise
# scripts/setup_vllm_wheels.sh sets up the versions in PROBE_VLLM_VERSIONS (default: all
# five) or finds them up to date under PROBE_VLLM_TREES (default: ./.cache/vllm-trees).
set -uo pipefail

cd "$(dirname "$0")/.."
PY=${1:-python3}
shift || true

if [[ -n ${PROBE_TEST_VLLM_TREES:-} ]]; then
    read -r -a trees <<<"$PROBE_TEST_VLLM_TREES"
else
    versions=(${PROBE_VLLM_VERSIONS:-0.26.0 0.28.0 0.30.0 0.33.0 0.34.0})
    mapfile -t trees < <(PROBE_VLLM_VERSIONS="${versions[*]}" \
        scripts/setup_vllm_wheels.sh "$PY" "${PROBE_VLLM_TREES:-.cache/vllm-trees}")
    if ((${#trees[@]} != ${#versions[@]})); then
        echo "test_wheels: setting up the vLLM trees failed" >&2
        exit 1
    fi
fi

failed=()
for tree in "${trees[@]}"; do
    echo "== tests/wheels on $tree" >&2
    start=$SECONDS
    # PROBE_REQUIRE_VLLM_TREE turns "not a wheel tree" from a skip into an error.
    PYTHONPATH="$tree" VLLM_TARGET_DEVICE=cpu PROBE_REQUIRE_VLLM_TREE=1 \
        "$PY" -m pytest -m wheels tests/wheels -q -p no:cacheprovider "$@"
    rc=$?
    echo "== $tree: exit $rc in $((SECONDS - start)) s" >&2
    ((rc != 0)) && failed+=("$tree")
done

if ((${#failed[@]})); then
    echo "test_wheels: FAILED on ${failed[*]}" >&2
    exit 1
fi
