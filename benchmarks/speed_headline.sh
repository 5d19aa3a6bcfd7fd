#!/usr/bin/env bash
# Re-measures every headline speed figure of docs/speed.md in one go, on a QUIET machine:
# wall clock, all the machine's threads (the TT layer at 2), methods alternating within each run.
#
#   bash benchmarks/speed_headline.sh                 # full sizes; the steps' time limits add up to 15 min
#   TINY=1 OUT=/tmp/headline bash benchmarks/speed_headline.sh   # tiny sizes: checks that every step runs
#
# Each step writes <OUT>/speed_headline_<name>.md/.json (with its exact command, date and load average); the
# last step writes <OUT>/speed_headline.md: every figure, what it measured against its target, and this script's log.
# Env: OUT (default benchmarks/results), PYTHON (default .venv/bin/python, else python), TINY=1, PROFILE=1 adds the
# per-op profile of the 350m step at 1 and 2 threads (at most 3 more minutes).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
LOG="$OUT/speed_headline.log"
: > "$LOG"

if [ "${TINY:-0}" = 1 ]; then
  LM=tiny; LM_SMALL=tiny; BERT=bert-tiny; LM_BATCH=1; SMALL_BATCH=2; SEQ=64; BERT_SEQ=32; REP=2; WARM=1
  TT_ARGS="--repeats 2 --batch 2 --seq 64"; DEC_ARGS="--prompt-len 16 --new-tokens 4 --repeats 1"
else
  LM=350m; LM_SMALL=60m; BERT=bert6; LM_BATCH=1; SMALL_BATCH=4; SEQ=256; BERT_SEQ=128; REP=3; WARM=1
  TT_ARGS="--repeats 15 --batch 32 --seq 128"; DEC_ARGS="--prompt-len 128 --new-tokens 32 --repeats 3"
fi

step() {  # step NAME TIMEOUT_S COMMAND...: run one measurement, log its command, time and exit status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "## $name: $*" | tee -a "$LOG"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "exit $? after $((SECONDS - start)) s" | tee -a "$LOG"
}

# 1. CoLA train step at 350m, batch 1 x 256, fp32 and --dtype auto (bf16 only where the CPU has it).
step train_350m 150 "$PY" -m tensorslim bench --preset "$LM" --methods cola --dtype fp32,auto \
  --batch-size "$LM_BATCH" --seq-len "$SEQ" --warmup "$WARM" --repeats "$REP" --out "$OUT/speed_headline_train_350m"
# 2. CoLA train step at 60m, batch 4 x 256, fp32 and auto.
step train_60m 120 "$PY" -m tensorslim bench --preset "$LM_SMALL" --methods cola --dtype fp32,auto \
  --batch-size "$SMALL_BATCH" --seq-len "$SEQ" --warmup 2 --repeats $((REP + 2)) --out "$OUT/speed_headline_train_60m"
# 3. TT 768x768 layer forward + backward, 4,096 tokens, 2 threads.
step tt_layer 45 "$PY" benchmarks/comera_layers.py $TT_ARGS --threads 2 --linear-only --out "$OUT/speed_headline_tt_layer"
# 4. bert6 masked-LM train step, batch 8 x 128, dense vs CoMERA.
step bert6_mlm 80 "$PY" -m tensorslim bench --preset "$BERT" --task mlm --methods comera --batch-size 8 \
  --seq-len "$BERT_SEQ" --warmup 1 --repeats 5 --out "$OUT/speed_headline_bert6_mlm"
# 5. Prefill and KV-cache decode at 350m, batch 1 and 8: dense, CoLA, W4 (4-bit, default dequantized-weight cache).
step decode_350m 230 "$PY" benchmarks/inference.py --presets "$LM" --methods dense,cola,w4 --batch-sizes 1,8 \
  $DEC_ARGS --warmup 1 --out "$OUT/speed_headline_decode_350m"
# 6. torch.compile (TorchInductor, regional) vs eager for each method at 60m; compile time reported apart.
step compile_60m 275 "$PY" -m tensorslim bench --preset "$LM_SMALL" --methods cola,svd --compile \
  --batch-size "$SMALL_BATCH" --seq-len "$SEQ" --warmup 1 --repeats 2 --out "$OUT/speed_headline_compile_60m"
# 7. (PROFILE=1 only) where the 350m step's time goes per operator family, 1 vs 2 threads.
if [ "${PROFILE:-0}" = 1 ]; then
  for threads in 1 2; do
    step "profile_threads$threads" 90 "$PY" benchmarks/profile_step.py --preset "$LM" --batch-size "$LM_BATCH" \
      --seq-len "$SEQ" --threads "$threads" --out "$OUT/speed_headline_profile_threads$threads"
  done
fi

"$PY" benchmarks/speed_headline.py --out "$OUT" --log "$LOG" --tiny "${TINY:-0}"
