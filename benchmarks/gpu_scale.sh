#!/usr/bin/env bash
# Issue 50, item 5: the GPU acceptance run of benchmarks/scale.py. rlhfkit against TRL 1.16 at Qwen2.5-0.5B's
# full depth (24 layers, its widths and 151,936-token vocabulary), GRPO, bf16 autocast over float32 weights,
# rlhfkit's checkpointing 'auto' (TRL: its default, on), under a 24 GB budget: every child process is capped
# with torch.cuda.set_per_process_memory_fraction(24e9 / total), so a 24 GB card is emulated on the H200, and
# rlhfkit also gets memory_budget_gb=24. Two commands, one per completion length (docs/results/speed.md,
# "Scale", how to carry TRL's four wheels in .gpu-wheels/ and the estimate of each command's time):
#
#   bash benchmarks/gpu_scale.sh 1024   # both sides, one warm-up + one timed step; then rlhfkit with
#                                       # hf_decode=static (its warm-up compiles)                   ~4 min
#   bash benchmarks/gpu_scale.sh 4096   # both sides, no warm-up, one step                          ~4.5 min
#
# Writes under $OUT: scale-L<L>.jsonl (one JSON line per run), stdout-L<L>.txt / stderr-L<L>.txt (the
# parents' output) and summary-L<L>.md (the tables, of every row this machine has run: /tmp/gpu-scale.jsonl
# keeps them across the two commands while the machine stays warm). Exit 0 when every run succeeded, 1 when
# one failed (its row says why: out of memory under the budget, a time-out), 2 when the preflight refused.
#
# A CPU rehearsal of this very script (tiny model, seconds; it checks the plumbing, not the numbers):
#   GPU_SCALE_DEVICE=cpu PYTHON=.venv/bin/python TRL_PYTHON=.venv-trl/bin/python OUT=/tmp/gs GPU_SCALE_WHEELS=none \
#       GPU_SCALE_ALL=/tmp/gs/all.jsonl GPU_SCALE_EXTRA="--hidden 64 --vocab 512 --depths 1" bash benchmarks/gpu_scale.sh 16
set -uo pipefail
L=${1:?usage: benchmarks/gpu_scale.sh 1024|4096}
OUT=${OUT:-gpu-scale-out}
PY=${PYTHON:-python3}
TRL_PY=${TRL_PYTHON:-$PY}
DEVICE=${GPU_SCALE_DEVICE:-cuda}
BUDGET=${GPU_SCALE_BUDGET_GB:-24}
WHEELS=${GPU_SCALE_WHEELS:-.gpu-wheels}
ALL=${GPU_SCALE_ALL:-/tmp/gpu-scale.jsonl}
read -r -a EXTRA <<<"${GPU_SCALE_EXTRA:-}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
case $L in
    1024) WARMUP=1 RUN_TIMEOUT=180 STATIC=1 ;;
    4096) WARMUP=0 RUN_TIMEOUT=240 STATIC=0 ;;
    *) WARMUP=0 RUN_TIMEOUT=600 STATIC=1 ;;  # other lengths: the CPU rehearsal
esac

# TRL 1.16 and datasets from the wheels carried to the machine (offline; nothing else installed or replaced)
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# Preflight (seconds, before any model is built): TRL imports; rlhfkit's config has the checkpointing policy
# (gradient_checkpointing off/on/auto) and memory_budget_gb; CUDA is there.
"$TRL_PY" -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" || exit 2
"$PY" - "$DEVICE" <<'EOF' || exit 2
import dataclasses, sys
import torch, transformers
sys.path.insert(0, ".")
from rlhfkit.config import RLConfig
fields = {f.name: f.type for f in dataclasses.fields(RLConfig)}
if fields["gradient_checkpointing"] in (bool, "bool") or "memory_budget_gb" not in fields:
    sys.exit("preflight: rlhfkit's RLConfig has no gradient_checkpointing policy / memory_budget_gb in this checkout")
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("preflight: no CUDA device")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print("torch", torch.__version__, "transformers", transformers.__version__, gpu)
EOF

COMMON=(--device "$DEVICE" --depths 24 --part rl --lengths "$L" --dtypes bf16 --checkpointing auto
    --memory-budget-gb "$BUDGET" --warmup "$WARMUP" --steps 1 --rounds 1 --timeout "$RUN_TIMEOUT"
    --work-dir /tmp/scale-models --trl-python "$TRL_PY" --json-out "$OUT/scale-L$L.jsonl" "${EXTRA[@]}")
rc=0
"$PY" benchmarks/scale.py "${COMMON[@]}" >"$OUT/stdout-L$L.txt" 2>"$OUT/stderr-L$L.txt" || rc=1
if [ "$STATIC" = 1 ]; then
    "$PY" benchmarks/scale.py "${COMMON[@]}" --only rlhfkit --rlhfkit-set hf_decode=static \
        >>"$OUT/stdout-L$L.txt" 2>>"$OUT/stderr-L$L.txt" || rc=1
fi
cat "$OUT/scale-L$L.jsonl" >>"$ALL"
"$PY" benchmarks/scale_summary.py "$ALL" | tee "$OUT/summary-L$L.md"
exit $rc
