#!/usr/bin/env bash
# Re-measure on one GPU what the H100 validation rests on, in as few device calls as the
# device budget allows (one call: at most 10 minutes). Run from the project root on the GPU machine,
# after a CUDA build:
#
#   bash .gpu/gpu-build.sh build && bash tests/gpu/remeasure.sh build-gpu/trainplan "$OUT" [PHASE...]
#
# PHASE (default: calibrate exec bench), each under its own time limit, each recorded with its exact
# command and exit code in OUT/commands.txt whether it succeeds or not:
#   calibrate  trainplan calibrate --device cuda --base dgx-h100: the ops tables timed back to back
#              (exec/calibrate.cpp), with the GEMM shapes of the validation models at M = 2048 to
#              16384 tokens (M = 4096 is the row tests/validation/test_validation_h100.cpp misses), and a
#              trainplan-exec software profile with the measured host time per kernel
#              -> OUT/calibrate/{dgx-h100-calibrated.json,trainplan-exec.json,calibrate.txt}
#   exec       the six trainplan exec plans of tests/data/h100/trainplan_exec at this commit
#              -> OUT/exec/<name>.meas.json and <name>.log
#   execmem    the executor against its software profile: the four plans of tests/data/h200/trainplan_exec
#              and a Llama-3.2-3B-shaped one (micro-batch 4), each predicted with --software
#              trainplan-exec, run with --memory-accounting on (bytes by category from the CUDA caching
#              allocator: weight copies, saved activations, the step's peak, optimizer temporaries) and
#              compared; cluster dgx-h200 on an H200, else dgx-h100, about 4 minutes
#              -> OUT/execmem/<name>.{pred,meas}.json, <name>.cmp.txt
#   bench      the side by side, trainplan exec against plain PyTorch (tests/gpu/bench_gpu.py; exec's
#              extra flags from $BENCH_EXEC_ARGS, e.g. '--fused-kernels on') -> OUT/bench-gpu.json
#   trace      where exec's step time goes against eager PyTorch's: llama-1b and gpt2-xl at micro-batch
#              4 (the bench plans), exec with --fused-kernels off and on under `exec --trace`, eager
#              under step_profile.py, every trace summarized by kernel name (step_profile.py
#              --summarize), about 2 minutes -> OUT/trace/summary.json, exec-*.meas.json, eager.json
#   pytorch    the eager and torch.compile rows of tests/data/h100/pytorch_steps.jsonl again
#              -> OUT/pytorch_steps.jsonl
#   sustained  three bf16 GEMMs timed as isolated calls (idle GPU, as ops_bench.py) and back to back
#              for 60 s each (tests/gpu/sustained_gemm.py), about 4 minutes -> OUT/sustained.json
#   profile    one training step of the llama-1b eager rows (micro-batch 2, 4, 8) and gpt2-medium
#              compiled under torch.profiler (tests/gpu/step_profile.py): kernel time, GPU idle time
#              and in-step GEMM time per shape, the figures the validation's fixed-cost split
#              (LlamaEagerMissIsInTheFixedCostPerMicroBatch) needs, about 2 minutes -> OUT/step_profile.json
# Throughout, nvidia-smi samples SM clock, power, temperature and throttle reasons every 200 ms into
# OUT/clocks.csv, to check whether sustained work runs at lower clocks than the short op timings
# (the hypothesis the issue-14 note gives for single-GPU and published runs disagreeing).
set -uo pipefail
trainplan=${1:?usage: remeasure.sh TRAINPLAN OUT [calibrate|exec|execmem|bench|trace|pytorch|sustained|profile ...]}
out=${2:?usage: remeasure.sh TRAINPLAN OUT [calibrate|exec|execmem|bench|trace|pytorch|sustained|profile ...]}
shift 2
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(calibrate exec bench)
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
log="$out/commands.txt"
{
  echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv 2>&1
} > "$out/env.txt"

# step NAME LIMIT_S CMD...: runs CMD under a time limit, appends the command and its exit code.
step() {
  local name=$1 limit=$2
  shift 2
  printf '%s\t' "$name" >> "$log"
  printf '%q ' "$@" >> "$log"
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  printf '\t# exit %d, %d s\n' "$rc" $((SECONDS - t0)) >> "$log"
  return 0
}

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > "$out/clocks.csv" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

models="$root/tests/data/h100/llama-1b.json,gpt2-xl,gpt2-medium,llama3-8b,gpt3-175b"
cluster=dgx-h100
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && cluster=dgx-h200
for phase in "${phases[@]}"; do
  case "$phase" in
    calibrate)
      mkdir -p "$out/calibrate"
      step calibrate 300 "$trainplan" calibrate --device cuda --base dgx-h100 --model "$models" \
        --tokens 2048,4096,8192,16384 --out "$out/calibrate/dgx-h100-calibrated.json" \
        --software-out "$out/calibrate/trainplan-exec.json" > "$out/calibrate/calibrate.txt" 2>&1
      ;;
    exec)
      mkdir -p "$out/exec"
      # name model micro-batch global-batch recompute (sequence: the model's)
      while read -r name model mb gb recompute; do
        case "$model" in llama-1b) model="$root/tests/data/h100/llama-1b.json" ;; esac
        step "exec-$name" 120 "$trainplan" exec --cluster dgx-h100 --gpus 1 --model "$model" \
          --global-batch "$gb" --micro-batch "$mb" --dtype bf16 --recompute "$recompute" --steps 8 --warmup 3 \
          --json "$out/exec/$name.meas.json" > "$out/exec/$name.log" 2>&1
      done <<'PLANS'
tiny tiny-gpt 8 64 none
xl-mb4-none gpt2-xl 4 32 none
xl-mb8-full gpt2-xl 8 64 full
xl-mb8-sel gpt2-xl 8 64 selective
l1b-mb4-none llama-1b 4 32 none
l1b-mb8-full llama-1b 8 64 full
PLANS
      ;;
    execmem)
      mkdir -p "$out/execmem"
      # Llama 3.2 3B shape (Hugging Face meta-llama/Llama-3.2-3B config.json), as llama-1b.json is 1B's.
      python3 -c "import json,sys; m=json.load(open(sys.argv[1])); m.update(name='llama-3b', layers=28, hidden=3072,
heads=24, kv_heads=8, source='Llama 3.2 3B shape (28 layers, hidden 3072, 24 heads, 8 kv heads, ffn 8192)');
json.dump(m, open(sys.argv[2], 'w'))" "$root/tests/data/h200/llama-1b.json" "$out/execmem/llama-3b.json"
      # name model micro-batch global-batch sequence recompute
      while read -r name model mb gb seq recompute; do
        case "$model" in llama-1b) model="$root/tests/data/h200/llama-1b.json" ;; llama-3b) model="$out/execmem/llama-3b.json" ;; esac
        plan=(--cluster "$cluster" --gpus 1 --model "$model" --micro-batch "$mb" --global-batch "$gb" --seq "$seq"
              --recompute "$recompute" --dtype bf16)
        step "predict-$name" 60 "$trainplan" predict "${plan[@]}" --software trainplan-exec \
          --json "$out/execmem/$name.pred.json" > "$out/execmem/$name.pred.txt" 2>&1
        step "exec-$name" 150 "$trainplan" exec "${plan[@]}" --steps 4 --warmup 2 --memory-accounting on \
          --json "$out/execmem/$name.meas.json" > "$out/execmem/$name.log" 2>&1
        step "compare-$name" 60 "$trainplan" compare "$out/execmem/$name.pred.json" "$out/execmem/$name.meas.json" \
          > "$out/execmem/$name.cmp.txt" 2>&1
      done <<'PLANS'
xl-mb4 gpt2-xl 4 32 1024 none
l1b-mb4 llama-1b 4 32 2048 none
l1b-mb2-full llama-1b 2 32 2048 full
large-mb8 gpt2-large 8 32 1024 none
l3b-mb4 llama-3b 4 32 2048 none
PLANS
      ;;
    bench)
      step bench 400 python3 "$root/tests/gpu/bench_gpu.py" --trainplan "$trainplan" --out "$out/bench-gpu.json" \
        --cluster "$cluster" --steps "${BENCH_STEPS:-8}" --warmup "${BENCH_WARMUP:-3}" \
        --exec-args "${BENCH_EXEC_ARGS:-}" > "$out/bench-gpu.log" 2>&1
      ;;
    trace)
      mkdir -p "$out/trace"
      # name model micro-batch global-batch sequence
      while read -r name model mb gb seq; do
        case "$model" in llama-1b) model="$root/tests/data/h100/llama-1b.json" ;; esac
        for fused in off on; do
          step "trace-$name-$fused" 120 "$trainplan" exec --cluster "$cluster" --gpus 1 --model "$model" \
            --micro-batch "$mb" --global-batch "$gb" --seq "$seq" --dtype bf16 --recompute none --steps 3 --warmup 1 \
            --fused-kernels "$fused" --json "$out/trace/exec-$name-$fused.meas.json" \
            --trace "$out/trace/exec-$name-$fused" > "$out/trace/exec-$name-$fused.log" 2>&1
        done
      done <<'PLANS'
l1b-mb4 llama-1b 4 32 2048
xl-mb4 gpt2-xl 4 32 1024
PLANS
      step trace-eager 180 python3 "$root/tests/gpu/step_profile.py" --out "$out/trace/eager.json" \
        --trace-dir "$out/trace" llama-1b:4:32:2048 gpt2-xl:4:32:1024 > "$out/trace/eager.log" 2>&1
      step trace-summary 120 python3 "$root/tests/gpu/step_profile.py" --out "$out/trace/summary.json" \
        --summarize "$out"/trace/exec-*.rank0.json "$out"/trace/*_*_*.json > "$out/trace/summary.log" 2>&1
      # The traces themselves (tens of MB each) stay on the GPU machine; their summaries come back.
      rm -f "$out"/trace/exec-*.rank0.json "$out"/trace/*_*_*.json
      ;;
    pytorch)
      # The rows of tests/data/h100/pytorch_steps.jsonl: model micro-batch global-batch sequence modes.
      while read -r model mb gb seq modes; do
        case "$model" in llama-1b) model="$root/tests/data/h100/llama-1b.json" ;; *) model="$root/models/$model.json" ;; esac
        step "pytorch-$(basename "$model" .json)-mb$mb" 150 python3 "$root/tests/data/h100/pytorch_reference.py" \
          "$model" "$mb" "$gb" "$seq" "$modes" >> "$out/pytorch_steps.jsonl" 2>> "$out/pytorch.log"
      done <<'ROWS'
gpt2 16 64 1024 eager
gpt2-medium 8 64 1024 eager,compile
gpt2-large 8 32 1024 eager
gpt2-xl 2 32 1024 eager
gpt2-xl 4 32 1024 eager,compile
gpt2-xl 8 64 1024 eager
llama-1b 2 32 2048 eager
llama-1b 4 32 2048 eager,compile
llama-1b 8 32 2048 eager
ROWS
      ;;
    sustained)
      step sustained 300 python3 "$root/tests/gpu/sustained_gemm.py" --out "$out/sustained.json" \
        > "$out/sustained.log" 2>&1
      ;;
    profile)
      step profile 240 python3 "$root/tests/gpu/step_profile.py" --out "$out/step_profile.json" \
        > "$out/step_profile.log" 2>&1
      ;;
    *)
      echo "remeasure.sh: unknown phase '$phase' (calibrate, exec, execmem, bench, trace, pytorch, sustained, profile)" >&2
      exit 2
      ;;
  esac
done
echo "done: $out (commands and exit codes in $log)"
