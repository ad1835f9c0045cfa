#!/usr/bin/env bash
# A vLLM release against the probe in one command: its wheel tree, the hook target
# resolution table, and the wheel suite.
#
# Usage: scripts/vllm_release_check.sh [--no-tests] [--docs FILE] [--python PY] VERSION...
#   VERSION      any vLLM release on the package index (e.g. 0.35.0), one or more
#   --no-tests   print the table only (no wheel suite)
#   --docs FILE  also write the releases' tables side by side as Markdown to FILE
#                (docs/vllm-releases.md is made this way, over every supported release)
#   --python PY  the interpreter (default: python3; it must have the CPU torch, pytest
#                and hypothesis, as the dev venv does)
#
# Per version: scripts/setup_vllm_wheels.sh builds (or finds) the tree under
# PROBE_VLLM_TREES (default ./.cache/vllm-trees); scripts/vllm_targets.py prints every hook
# target of the family table as resolved / not in this vLLM / missing, and what each
# surface finds (runners, resolver and manager signatures, graph sizes, breakable graphs);
# scripts/test_wheels.sh runs tests/wheels on the tree. Exit 1 if a tree cannot be built,
# the table cannot be made, or the suite fails (or cannot run: see below).
# The versions the suite expects are in tests/wheels/vllm_env.py (SUPPORTED_VERSIONS): a new
# release runs the suite only once it is listed there (before, the table alone says what
# changed).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=python3
TESTS=1
DOCS=""
versions=()
while (($#)); do
    case $1 in
        --no-tests) TESTS=0 ;;
        --docs) DOCS=$2; shift ;;
        --python) PY=$2; shift ;;
        -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "vllm_release_check: unknown option $1" >&2; exit 2 ;;
        *) versions+=("$1") ;;
    esac
    shift
done
if ((${#versions[@]} == 0)); then
    echo "vllm_release_check: give at least one vLLM version (e.g. 0.34.0)" >&2
    exit 2
fi

ROOT=${PROBE_VLLM_TREES:-.cache/vllm-trees}
facts=$(mktemp -d)
trap 'rm -rf "$facts"' EXIT
rc=0
for V in "${versions[@]}"; do
    echo "== vLLM $V" >&2
    tree=$(PROBE_VLLM_VERSIONS=$V scripts/setup_vllm_wheels.sh "$PY" "$ROOT") || {
        echo "vllm_release_check: vLLM $V: the tree could not be set up" >&2
        rc=1
        continue
    }
    PYTHONPATH="$tree:$PWD" VLLM_TARGET_DEVICE=cpu "$PY" scripts/vllm_targets.py \
        --json "$facts/$V.json" 2> >(grep -v -e '^WARNING' -e '^INFO' >&2) || rc=1
    if ((TESTS)); then
        if grep -q "\"$V\"" tests/wheels/vllm_env.py; then
            PROBE_TEST_VLLM_TREES=$tree bash scripts/test_wheels.sh "$PY" -rs || rc=1
        else
            echo "vllm_release_check: vLLM $V is not in SUPPORTED_VERSIONS" \
                "(tests/wheels/vllm_env.py): the suite was not run" >&2
            rc=1
        fi
    fi
done
if [[ -n $DOCS ]]; then
    shopt -s nullglob
    files=("$facts"/*.json)
    if ((${#files[@]})); then
        "$PY" scripts/vllm_targets.py --markdown "${files[@]}" >"$DOCS.table" &&
            "$PY" - "$DOCS" "$DOCS.table" <<'EOF'
import pathlib, sys
doc, table = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
begin, end = "<!-- release-table: begin -->", "<!-- release-table: end -->"
body = f"{begin}\n{table.read_text()}{end}"
text = doc.read_text() if doc.exists() else f"{body}\n"
if begin in text and end in text:
    head, _, rest = text.partition(begin)
    text = head + body + rest.partition(end)[2]
doc.write_text(text)
table.unlink()
EOF
        echo "vllm_release_check: wrote the tables of ${versions[*]} into $DOCS" >&2
    fi
fi
exit $rc
