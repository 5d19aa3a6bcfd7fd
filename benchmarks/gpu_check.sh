#!/usr/bin/env bash
# On a machine with a CUDA GPU, in under 10 minutes: the CUDA tests (captured CUDA-graph steps, CoMERA's late step
# among them, the Trainer's --cuda-graphs, bf16 autocast, the LM loss and the factored vocabulary on the GPU), the
# train-step benchmarks (fp32 and bf16; the 350m step with a factored vocabulary beside dense) and the time-to-quality
# benchmark at tiny size, each under its own time limit (8 minutes at most together); with two or more GPUs also a
# tensor-parallel run over NCCL (1.5 minutes more). Everything goes to OUT; OUT/summary.md lists each step's status.
#
#   bash benchmarks/gpu_check.sh          # OUT defaults to benchmarks/results/gpu_check_<UTC date>
#
# Env: OUT, PYTHON (default .venv/bin/python, else python). A time-to-quality run cut short by its limit resumes from
# its checkpoints when the script runs again with the same OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
OUT="${OUT:-benchmarks/results/gpu_check_$(date -u +%Y-%m-%d)}"
mkdir -p "$OUT"
# the tokenizer cache under OUT: needs no cache folder of the machine (nor platformdirs, which a bare image lacks)
export TENSORSLIM_CACHE="${TENSORSLIM_CACHE:-$OUT/cache}"
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/summary.md"
printf '# GPU check, %s\n\n| step | exit | seconds |\n|---|---:|---:|\n' "$(date -u +%FT%TZ)" > "$SUMMARY"

step() {  # step NAME TIMEOUT_S COMMAND...: run one check under a time limit, log its command, status and time
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "## $name: $*" | tee -a "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local status=$?
  echo "exit $status after $((SECONDS - start)) s" | tee -a "$LOG"
  echo "| $name | $status | $((SECONDS - start)) |" >> "$SUMMARY"
}

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 1 ]; then
  echo "no CUDA device visible to torch; nothing to check" | tee -a "$SUMMARY"
  exit 1
fi
{ nvidia-smi; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } \
  > "$OUT/machine.txt" 2>&1

# 1. The tests that need CUDA (they skip without it), and the CPU twins of the static step they check against.
step tests 120 "$PY" -m pytest -q -x -p no:cacheprovider --junitxml="$OUT/tests.xml" \
  tests/integration/test_cuda_paths.py tests/unit/test_cuda_graph_step.py tests/integration/test_train_static_step.py
# 2. Train-step speed and memory against dense, fp32 and bf16 autocast.
step bench_60m 75 "$PY" -m tensorslim bench --preset 60m --device cuda --methods cola,cola-m,comera --dtype fp32,bf16 \
  --batch-size 8 --seq-len 256 --warmup 3 --repeats 10 --out "$OUT/bench_60m"
step bench_350m 50 "$PY" -m tensorslim bench --preset 350m --device cuda --methods cola --dtype bf16 \
  --batch-size 8 --seq-len 256 --warmup 3 --repeats 10 --out "$OUT/bench_350m"
step vocab_step_350m 60 "$PY" benchmarks/vocab_step.py --preset 350m --device cuda --dtypes fp32,bf16 \
  --batch-size 8 --seq-len 256 --warmup 3 --repeats 10 --out "$OUT/vocab_step_350m"
# 3. Time to quality at tiny size in bf16: every arm (GaLore where its package is installed), the same 200 steps of
# 8 x 128 tokens.
ARMS=dense,cola,cola-m,comera,cola+vocab,cola+bf16-state
"$PY" -c "import galore_torch" 2> /dev/null && ARMS="$ARMS,galore"
step time_to_quality 180 "$PY" benchmarks/time_to_quality.py --preset tiny --device cuda --dtype bf16 --steps 200 \
  --batch-size 8 --seq-len 128 --eval-every 25 --arms "$ARMS" --runs "$OUT/runs" --out "$OUT"
# 4. Tensor parallelism over NCCL (BOOST's TP of CoLA), two ranks on two GPUs.
if [ "$GPUS" -ge 2 ]; then
  step tp_nccl 90 "$PY" -m torch.distributed.run --nproc-per-node 2 -m tensorslim train --device cuda --tp 2 \
    --method cola --steps 20 --eval-every 10 --no-progress --out-dir "$OUT/runs/tp_nccl" --overwrite
else
  echo "| tp_nccl | not run: one GPU (NCCL refuses two ranks on one device) | 0 |" >> "$SUMMARY"
fi
cat "$SUMMARY"
