#!/usr/bin/env bash
# Tau as vLLM serves a drafter specdeck trained, against specdeck's own eval, on one GPU machine.
#
# NOT RUN YET: this script has not been run anywhere. The task that wrote it (issue 32 §3) was lent
# no device machine; `bash -n` passes (tests/unit/test_engine_clients.py checks it) and every
# specdeck command in it is tested on CPU (core.ml.tiny, core.ml.export, core.ml.eval,
# core.ml.engine_clients against a stand-in server, core.ml.compare). Run it when a machine with
# one CUDA GPU is lent; it is sized for one H200 and ends inside 9 minutes (each step has its own
# timeout; the whole run is capped by PARITY_BUDGET_S).
#
#   OUT=/tmp/out bash bench/device/engine_parity.sh            # from the repository root
#   VLLM_WHEELS=.whl OUT=... bash bench/device/engine_parity.sh # install vllm from carried wheels
#
# What it does, everything written under $OUT (at most 8 files, two folders down):
#   1. a venv (/tmp/parity-venv, $PYTHON's packages visible after its own) with vllm ($VLLM_SPEC, default `vllm`)
#      from $VLLM_WHEELS (--no-index) when set, else from the package index;
#   2. `python -m core.ml.tiny` writes a tiny Qwen3 target (with its tokenizer) and a drafter fitted
#      to it, block size $BLOCK; `specdeck export` (python -m core.ml.export) writes the z-lab layout
#      vLLM loads (bf16, world-readable) and prints how each engine reads it (its lint);
#   3. `vllm serve TARGET --speculative-config '{"method": "dflash", "model": EXPORT,
#      "num_speculative_tokens": B-1}'` on 127.0.0.1, waited for on /health;
#   4. `python -m core.ml.engine_clients --engine vllm` (token ids, the counters' deltas) and
#      `python -m core.ml.eval` (specdeck in process, CUDA, bf16) on the same prompts;
#   5. `python -m core.ml.compare` of the two, and parity.json: tau per prompt on both sides, the
#      pooled figures, whether the generated tokens are equal.
# Exit 0 when every step ran (the verdict is in parity.json and the last lines of log.txt), 1 when
# a step failed (log.txt and vllm.log say which).
#
# Known limits: this workplace's device machines reach no network and carry at most 64 MiB, and a
# vllm wheel with its CUDA dependencies is far larger, so there vllm must already be installed or
# come from a wheelhouse mounted some other way; vllm pins its own torch, which may not be the
# machine's. The tiny target has head_dim 16: if vLLM's attention backend refuses it, set
# PARITY_TINY_ARGS to a larger model's flags or point TARGET/DRAFTER at a real pair.

set -euo pipefail

OUT=${OUT:-$PWD/parity-out}
PY=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm}
BLOCK=${BLOCK:-8}
PORT=${PORT:-8765}
MAX_NEW=${MAX_NEW:-64}
WORK=${WORK:-/tmp/parity}
BUDGET=${PARITY_BUDGET_S:-540}
mkdir -p "$OUT" "$OUT/engine" "$OUT/specdeck" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
START=$(date +%s)
SERVER_PID=

step() { echo "== $(date -u +%H:%M:%S) [$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
cap() {  # a step's timeout: what it wants, or what is left of the budget (1 s once it is spent)
    local want=$1 rest; rest=$(left)
    if (( rest <= 5 )); then echo "out of the ${BUDGET}s budget" >&2; echo 1
    elif (( want < rest )); then echo "$want"; else echo "$rest"; fi
}
stop_server() {
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
}
trap 'stop_server' EXIT

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'

step "venv with $VLLM_SPEC"
if [[ ! -x /tmp/parity-venv/bin/python ]]; then
    "$PY" -m venv /tmp/parity-venv
    # $PY may itself be a venv (the device image's is), which --system-site-packages would skip:
    # a .pth makes its packages (torch, transformers) visible after the venv's own
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
        >"$(/tmp/parity-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/parity-system.pth"
fi
VPY=/tmp/parity-venv/bin/python
if ! "$VPY" -c 'import vllm' 2>/dev/null; then
    if [[ -n ${VLLM_WHEELS:-} ]]; then
        timeout "$(cap 240)" "$VPY" -m pip install -q --no-index --find-links "$VLLM_WHEELS" "$VLLM_SPEC"
    else
        timeout "$(cap 240)" "$VPY" -m pip install -q "$VLLM_SPEC"
    fi
fi
"$VPY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'

step "tiny target + drafter (block $BLOCK), export"
if [[ -z ${TARGET:-} ]]; then
    # shellcheck disable=SC2086  # PARITY_TINY_ARGS holds several flags on purpose
    timeout "$(cap 180)" "$VPY" -m core.ml.tiny "$WORK/tiny" --block-size "$BLOCK" ${PARITY_TINY_ARGS:-}
    TARGET=$WORK/tiny/target DRAFTER=$WORK/tiny/drafter PROMPTS=$WORK/tiny/prompts.jsonl
fi
PROMPTS=${PROMPTS:?set PROMPTS with TARGET and DRAFTER}
timeout "$(cap 60)" "$VPY" -m core.ml.export "$DRAFTER" --out "$WORK/serve" --target "$TARGET"

step "vllm serve"
SPEC=$(printf '{"method": "dflash", "model": "%s", "num_speculative_tokens": %d}' "$WORK/serve" $((BLOCK - 1)))
VLLM=(/tmp/parity-venv/bin/vllm)
[[ -x ${VLLM[0]} ]] || VLLM=("$VPY" -m vllm.entrypoints.cli.main)
setsid timeout "$(cap 420)" "${VLLM[@]}" serve "$TARGET" --host 127.0.0.1 --port "$PORT" \
    --served-model-name tiny --dtype bfloat16 --max-model-len 2048 --gpu-memory-utilization 0.30 \
    --enforce-eager --max-num-seqs 1 --speculative-config "$SPEC" >"$OUT/vllm.log" 2>&1 &
SERVER_PID=$!
deadline=$(( $(date +%s) + $(cap 240) ))
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "vllm serve exited; the end of vllm.log:"; tail -30 "$OUT/vllm.log"; exit 1; }
    (( $(date +%s) < deadline )) || { echo "vllm serve not up in time"; tail -30 "$OUT/vllm.log"; exit 1; }
    sleep 2
done
curl -s "http://127.0.0.1:$PORT/version"; echo

step "tau through vLLM (core.ml.engine_clients)"
timeout "$(cap 150)" "$VPY" -m core.ml.engine_clients --engine vllm --url "http://127.0.0.1:$PORT" \
    --prompts "$PROMPTS" --target "$TARGET" --max-new-tokens "$MAX_NEW" --out "$OUT/engine/result.json"
stop_server  # free the GPU for specdeck's own run

step "tau in specdeck (core.ml.eval, cuda bf16)"
timeout "$(cap 150)" "$VPY" -m core.ml.eval --target "$TARGET" --drafter "$WORK/serve" --prompts "$PROMPTS" \
    --device cuda --dtype bfloat16 --max-new-tokens "$MAX_NEW" --out "$OUT/specdeck/result.json"

step "compare"
"$VPY" -m core.ml.compare "$OUT/specdeck/result.json" "$OUT/engine/result.json" --allow-mismatch \
    --out "$OUT/compare.json" || true
"$VPY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
own = json.loads((out / "specdeck/result.json").read_text())
eng = json.loads((out / "engine/result.json").read_text())
e_rows = {r["id"]: r for r in eng["per_prompt"]}
rows = []
for r in own["per_prompt"]:
    e = e_rows.get(r["id"], {})
    rows.append({"id": r["id"], "tau_specdeck": r["tau"], "tau_vllm": e.get("tau"),
                 "tau_vllm_engine": (e.get("engine") or {}).get("tau"), "rounds_specdeck": len(r["rounds"]),
                 "rounds_vllm": e.get("num_rounds"), "tokens_equal": r["tokens"] == e.get("tokens")})
summary = {"tau": [own["tau"], eng["tau"]], "tau_pooled": [own["tau_pooled"], eng["tau_pooled"]],
           "engine_tau_pooled": eng["engine"]["engine_tau_pooled"], "vllm_version": eng["engine"]["version"],
           "prompts": len(rows), "tokens_equal": sum(r["tokens_equal"] for r in rows),
           "tau_equal": sum(r["tau_specdeck"] == r["tau_vllm"] for r in rows), "rows": rows}
(out / "parity.json").write_text(json.dumps(summary, indent=2) + "\n")
for r in rows:
    print(f"{r['id']:>8}  specdeck {r['tau_specdeck']}  vllm {r['tau_vllm']}  tokens equal {r['tokens_equal']}")
print(f"tau (macro) specdeck {own['tau']} vllm {eng['tau']}; pooled {own['tau_pooled']} / {eng['tau_pooled']}; "
      f"tokens equal on {summary['tokens_equal']}/{len(rows)} prompts, tau equal on {summary['tau_equal']}")
EOF
step "done"
