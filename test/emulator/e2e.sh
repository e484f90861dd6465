#!/usr/bin/env bash
# End-to-end checks of the CUDA backend on the emulated build (-DMTNLG_CUDA=EMULATE):
# the binary's `training.device: cuda` path runs mtnlg's kernels, cuBLASLt calls and NCCL
# collectives on the CPU, and must agree with the same binary's CPU path.
#   usage: test/emulator/e2e.sh STEP MTNLG_BINARY     (run from anywhere)
#   STEP:
#     train       tiny GPT, 6 iterations, dropout 0.1: cuda vs cpu in fp32 (every loss and
#                 grad norm within 1e-4 relative) with recompute none, selective and full,
#                 and in bf16 (within 2e-2); and bf16 again with every cuBLASLt epilogue
#                 refused (MTNLG_EMU_LT_FAIL=epilogues): the run goes on with separate
#                 kernels, within 2e-2 of the CPU, each refused shape warned about once and
#                 every refusal counted in metrics.jsonl's gemm_fallbacks; the bf16 cuda run
#                 with logging.step_timing writes the GPU's step parts (CUDA events) too,
#                 and with logging.gpu_profile the GPU time by op family
#     checkpoint  4 iterations on cuda, saved, resumed for 4 on the cpu; and the other way:
#                 both equal the straight 8-iteration run of the resuming device (1e-4)
#     layout      mpirun -np 8, tp2 x pp2 x dp2, ZeRO-1 and sequence parallel, on the
#                 emulated NCCL: every loss within 1e-5 of the single-process cuda run
#     moe         mixture of experts on CUDA (core/cuda/moe.cu, cuBLAS's grouped GEMM): the
#                 tiny GPT with 4 routed experts per layer, fp32, cuda vs cpu (1e-4) for top-2
#                 softmax routing with the balancing and z losses and full recompute, and for
#                 sigmoid routing with the expert bias, a capacity with padding and a gated
#                 shared expert (Llama family); bf16 cuda vs cpu (2e-2) and the cpu's bf16 vs
#                 its fp32 run (2e-2); under mpirun ep2 and etp2 x ep2 with ZeRO-1
#                 on the emulated NCCL (the token exchange by grouped send/recv): every loss
#                 within 1e-5 of the single-process cuda run; eval (1e-4) and greedy generate
#                 (the same text) of a random MoE model, cuda vs cpu; the padded Llama-shaped
#                 MoE with CUDA graphs bit-identical to eager under a batch ramp (fp32, bf16),
#                 its routing record too; CUDA graphs with dropless MoE layers exit 2;
#                 sinkhorn's balancing cuda vs cpu (1e-4) and at ep2 against one process (1e-5);
#                 the fp64 router cuda vs cpu (fp32 1e-4, bf16 2e-2) and at ep2 (1e-5)
#     cp          context parallelism on the device path (the CUDA block and merge ops, the
#                 K/V ring and the heads' all-to-all over the emulated NCCL's cp group):
#                 mpirun -np 2 cp2 (p2p, all_gather, a2a), -np 4 cp2 x tp2 with sequence
#                 parallelism and cp4 a2a+p2p (a2a within pairs, the ring across them), fp32,
#                 every loss and grad norm within 1e-5 of the single-process cuda run; and
#                 bf16 cp2 p2p and all_gather (cuDNN's fused blocks) within 2e-2 of the
#                 single-process bf16 cuda run
#     graphs      training.enable_cuda_graph: micro batches replayed from CUDA graphs give
#                 the eager cuda run's losses and grad norms bit for bit (fp32 with recompute
#                 none and full, bf16, fp16 with loss scaling; the loss-mask path; hidden and
#                 attention dropout, unfused and cuDNN's, keys from device memory; a Llama-family
#                 model with qk_layernorm), with the
#                 graph launches counted in metrics.jsonl; under mpirun dp2 (the last micro
#                 batch eager, for the overlapped reduction), tp2 with sequence
#                 parallelism (NCCL captured, the same bytes counted) and cp2 (the K/V
#                 ring's side streams captured) too; a capture the runtime
#                 invalidates (MTNLG_EMU_CAPTURE_FAIL) is warned about once and the run
#                 goes on eagerly with the same numbers; what graphs do not cover (pipeline
#                 stages, spike forensics, the CPU) exits 2 naming the key
#     watchdog    the NCCL watchdog (parallel/flight_recorder.hpp) under mpirun on the emulated
#                 NCCL, MTNLG_COLLECTIVE_TIMEOUT=25 s (MTNLG_E2E_WD_TIMEOUT): tp2 x pp2 x dp2
#                 where rank 5 stops entering collectives at iteration 4 (MTNLG_FAULT_INJECT
#                 mode=hang): every rank exits 3, its flight recorder dumped, within the
#                 timeout + 30 s, and `report --explain` names rank 5, its group and
#                 collective; the checkpoint of iteration 2 resumes bit for bit against a
#                 straight run; an asynchronous ncclRemoteError on one rank
#                 (MTNLG_EMU_NCCL_FAULT) and a killed rank (its liveness connection closes) end
#                 every rank within 10 s; tp2 x dp2 with CUDA
#                 graphs: the hang is caught in a graph replay; SIGUSR1 writes a live
#                 dump; a rank that never joins an NCCL communicator's initialisation
#                 ends the run after the timeout; a slow but live rank (sleeps shorter than the timeout) is not
#                 aborted; `mtnlg eval` under mpirun (tp2, NCCL groups): a rank that stops
#                 entering collectives at the second eval batch (8 s timeout) and an
#                 asynchronous error each end both ranks with exit 3, dumps and a verdict
#                 naming the rank
#     pause       a paused process is not a dead one (the liveness service, parallel/liveness.hpp),
#                 tp2 x pp2 x dp2 under a 30 s timeout (MTNLG_E2E_PAUSE_TIMEOUT): rank 5 stopped
#                 (SIGSTOP) for 10 s and continued, and every rank stopped together for
#                 longer than the timeout and continued: both runs finish with the straight
#                 run's losses; rank 5 stopped for good: the other 7 exit 3 within the
#                 timeout + 30 s and the verdict names rank 5 as alive but silent; and a real
#                 Slurm job (scripts/slurm-local, srun -n 4) suspended with `scontrol suspend`
#                 for longer than the timeout and resumed completes with the same losses
# (eval and generate on cuda vs cpu: scripts/gpu/train-proof.sh's infer step, which CI
# runs on the emulated build as the test emulator.train-proof)
# Exit status 0 when the step passes; every comparison prints its worst difference.
set -uo pipefail
step=${1:?step}
bin=${2:?mtnlg binary}
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out=$(mktemp -d "${TMPDIR:-/tmp}/mtnlg-emu-$step.XXXXXX")
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fails=0

train() {  # train NAME DEVICE PRECISION [--set ...]
  local name=$1 dev=$2 prec=$3
  shift 3
  "$bin" train recipes/tiny-mock.yaml --set training.device="$dev" --set training.precision="$prec" \
    --set training.train_iters=6 --set model.hidden_dropout=0.1 --set model.attention_dropout=0.1 \
    --set logging.dir="$out/$name" --set logging.log_interval=1 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "  $name: mtnlg exited $rc"; tail -5 "$out/$name.log"; fails=$((fails + 1)); }
  return $rc
}

compare() {  # compare A B RTOL [FIRST_ITERATION]
  python3 - "$out/$1/metrics.jsonl" "$out/$2/metrics.jsonl" "$3" "${4:-1}" "$1 vs $2" <<'EOF' || fails=$((fails + 1))
import json, sys
a = {r["iteration"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["iteration"]: r for r in map(json.loads, open(sys.argv[2]))}
rtol, first, what = float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
its = sorted(i for i in a if i >= first and i in b)
if not its:
    print(f"  {what}: no common iterations"); sys.exit(1)
worst = 0.0
for i in its:
    for k in ("loss", "grad_norm"):
        if a[i][k] is None or b[i][k] is None:  # a skipped fp16 step has no norm: both must skip
            worst = max(worst, 0.0 if a[i][k] is b[i][k] else float("inf"))
            continue
        worst = max(worst, abs(a[i][k] - b[i][k]) / max(abs(b[i][k]), 1e-30))
ok = worst <= rtol
print(f"  {what}: iterations {its[0]}..{its[-1]}: worst relative difference {worst:.3e} (bound {rtol:g}) "
      f"{'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}

# mpi_train NAME NP ARGS...: mpirun -np NP of the tiny GPT on cuda in fp32, one emulated
# GPU per rank, its log and run directory under $out/NAME
mpi_train() {
  local name=$1 np=$2
  shift 2
  MTNLG_EMU_DEVICES=$np "$repo/test/support/mpi/mpirun.sh" "$np" "$bin" train recipes/tiny-mock.yaml \
    --set training.device=cuda --set training.precision=fp32 --set logging.dir="$out/$name" \
    --set logging.log_interval=1 "$@" >"$out/$name.log" 2>&1 ||
    { echo "  mpirun -np $np $name failed"; tail -20 "$out/$name.log"; fails=$((fails + 1)); }
}

# The watchdog's steps (watchdog, pause): mpirun runs of the tiny GPT on the emulated NCCL
# under a collective timeout of T s.
T=${MTNLG_E2E_WD_TIMEOUT:-25}
[ "$step" = pause ] && T=${MTNLG_E2E_PAUSE_TIMEOUT:-30}
common=(--set training.device=cuda --set training.precision=fp32 --set model.hidden_dropout=0
  --set model.attention_dropout=0 --set logging.log_interval=1)
l8=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
l4=(--set parallel.tensor_model_parallel_size=2)
# wd NAME NP ARGS...: mpirun under the watchdog's timeout; start and end in $out/NAME.secs
wd() {
  local name=$1 np=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  MTNLG_COLLECTIVE_TIMEOUT=$T MTNLG_EMU_DEVICES=$np "$repo/test/support/mpi/mpirun.sh" "$np" "$bin" train \
    recipes/tiny-mock.yaml "${common[@]}" --set logging.dir="$out/$name" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "$t0 $t1" >"$out/$name.secs"
  return $rc
}
# tripped NAME NP BOUND CULPRIT [DEAD]: every rank (but a DEAD one) said it exits 3 and left
# its dump, the last dump within BOUND s of the trouble's start (the first operation left
# waiting), report.txt written, and `report --explain` names CULPRIT with its coordinates
tripped() {
  python3 - "$out" "$bin" "$@" <<'EOF' || fails=$((fails + 1))
import glob, json, re, subprocess, sys
out, binary, name, np, bound, culprit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
dead = int(sys.argv[7]) if len(sys.argv) > 7 else -1
log = open(f"{out}/{name}.log").read()
t0, t1 = map(float, open(f"{out}/{name}.secs").read().split())
exits = sorted(set(int(r) for r in re.findall(r"mtnlg: rank (\d+)[^\n]*NCCL watchdog: communicators aborted, exiting with status 3", log)))
dumps = [json.load(open(f)) for f in glob.glob(f"{out}/{name}/flight_recorder/rank*.json")]
pending = [o["t_enqueued"] for d in dumps for o in d["ops"] if o["state"] != "completed"]
start = min(pending) if pending else min(d["time"] for d in dumps)
if dead >= 0:  # when its connection to the liveness service closed (its process ended), as rank 0 saw it
    seen = [d["liveness"]["dead"][str(dead)] for d in dumps if str(dead) in d.get("liveness", {}).get("dead", {})]
    start = min(seen) if seen else start
last = max(d["time"] for d in dumps) if dumps else float("inf")
verdict = subprocess.run([binary, "report", "--explain", f"{out}/{name}"], capture_output=True, text=True)
lines = verdict.stdout.splitlines()
said = lines[1].strip() if verdict.returncode == 0 and len(lines) > 1 else verdict.stderr.strip()
report = "".join(open(f).read() for f in glob.glob(f"{out}/{name}/flight_recorder/report.txt"))
named = re.search(rf"rank {culprit} \(tp=\d,pp=\d,dp=\d\) (is the culprit|failed on its own)|rank {culprit} (left no flight record|died)", said)
if len(sys.argv) > 8:  # the verdict must also say this
    named = named if sys.argv[8] in said else None
want = [r for r in range(np) if r != dead]
print(f"  {name}: ranks that exited 3: {exits}; {len(dumps)} dumps; the last {last - start:.1f} s after the trouble began "
      f"(bound {bound:g} s); mpirun ran {t1 - t0:.0f} s")
print(f"    verdict: {said[:500]}")
ok = exits == want and len(dumps) == len(want) and last - start <= bound and named is not None and report.strip() == said
print(f"    {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}

# left_alone NAME N BG [PIDS...]: a run started in the background (subshell BG) under
# orte_abort_on_non_zero_status 0, which makes mpirun leave the survivors to the watchdog
# and then never return: waits (at most 10 min) until N ranks said they exit 3, kills
# PIDS (processes that cannot exit themselves) and the subshell's mpirun, and reaps it.
left_alone() {
  local name=$1 want=$2 bg=$3 n
  shift 3
  for _ in $(seq 1200); do
    n=$(grep -c 'exiting with status 3' "$out/$name.log" 2>/dev/null)
    [ "${n:-0}" -ge "$want" ] && break
    sleep 0.5
  done
  sleep 1
  for p in "$@"; do kill -KILL "$p" 2>/dev/null; done
  for p in $(pgrep -P "$bg"); do kill "$p" 2>/dev/null; done
  wait "$bg"
}

case "$step" in
  train)
    for rc in none selective full; do
      train "cpu32-$rc" cpu fp32 --set parallel.recompute_granularity=$rc &&
        train "gpu32-$rc" cuda fp32 --set parallel.recompute_granularity=$rc &&
        compare "gpu32-$rc" "cpu32-$rc" 1e-4
    done
    train cpu16 cpu bf16 && train gpu16 cuda bf16 --set logging.step_timing=true --set logging.gpu_profile=true && compare gpu16 cpu16 2e-2
    grep -q "reserved" "$out/gpu16.log" || { echo "  the cuda log line names no allocator memory"; fails=$((fails + 1)); }
    export MTNLG_EMU_LT_FAIL=epilogues
    train gpu16-refused cuda bf16 && compare gpu16-refused cpu16 2e-2
    unset MTNLG_EMU_LT_FAIL
    python3 - "$out" <<'EOF' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
def last(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")][-1]
log = open(f"{out}/gpu16-refused.log").read().splitlines()
warned = [l for l in log if "cuBLASLt refused" in l]
ok = (last("gpu16")["gemm_fallbacks"] == 0 and last("gpu16-refused")["gemm_fallbacks"] > 0
      and 0 < len(warned) == len(set(warned)) and "gemm fallbacks: " in "\n".join(log))
# the GPU's clock beside the host's (logging.step_timing on a CUDA run): CUDA events charge
# the device's time to the parts, forward and backward work among them
gpu_parts = last("gpu16").get("step_parts_gpu", {}).get("ranks", [{}])[0]
ok = ok and gpu_parts.get("forward", 0) > 0 and gpu_parts.get("backward", 0) > 0 and "step_parts" in last("gpu16")
# logging.gpu_profile: the GPU time by op family, the GEMMs and attention among them
fam = last("gpu16").get("gpu_profile", {})
ok = ok and fam.get("gemm", 0) > 0 and fam.get("attention", 0) > 0 and "gpu_profile" not in last("gpu16-refused")
print(f"  refused epilogues: {len(warned)} shapes warned once each, gemm_fallbacks "
      f"{last('gpu16-refused')['gemm_fallbacks']} (without refusals {last('gpu16')['gemm_fallbacks']}) "
      f"{'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
    ;;
  checkpoint)
    for pair in "cuda cpu" "cpu cuda"; do
      set -- $pair
      a=$1 b=$2
      train "straight-$b" "$b" fp32 --set training.train_iters=8 &&
        train "first-$a" "$a" fp32 --set training.train_iters=8 --set training.exit_interval=4 \
          --set checkpoint.save="$out/ck-$a" &&
        train "second-$b" "$b" fp32 --set training.train_iters=8 --set checkpoint.load="$out/ck-$a" \
          --set checkpoint.save="$out/ck2-$a" &&
        compare "second-$b" "straight-$b" 1e-4 5 &&
        echo "  a checkpoint written on $a resumed on $b"
    done
    ;;
  layout)
    common=(--set training.train_iters=4 --set model.hidden_dropout=0 --set model.attention_dropout=0)
    train one cuda fp32 "${common[@]}"
    # one emulated GPU per rank, as on an 8-GPU node
    MTNLG_EMU_DEVICES=8 "$repo/test/support/mpi/mpirun.sh" 8 "$bin" train recipes/tiny-mock.yaml --set training.device=cuda \
      --set training.precision=fp32 --set logging.dir="$out/eight" --set logging.log_interval=1 "${common[@]}" \
      --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 \
      --set parallel.use_distributed_optimizer=true --set parallel.sequence_parallel=true >"$out/eight.log" 2>&1 ||
      { echo "  mpirun -np 8 failed"; tail -20 "$out/eight.log"; fails=$((fails + 1)); }
    compare eight one 1e-5
    ;;
  moe)
    moe=(--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=48
      --set model.moe_aux_loss_coeff=1e-2 --set model.moe_z_loss_coeff=1e-3 --set model.add_bias_linear=false
      --set model.hidden_dropout=0 --set model.attention_dropout=0)
    train moe-cpu cpu fp32 "${moe[@]}" --set parallel.recompute_granularity=full &&
      train moe-gpu cuda fp32 "${moe[@]}" --set parallel.recompute_granularity=full && compare moe-gpu moe-cpu 1e-4
    llama=(--set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true
      --set model.ffn_hidden_size=80 --set model.num_query_groups=2 --set model.moe_router_score_function=sigmoid
      --set model.moe_router_enable_expert_bias=true --set model.moe_expert_capacity_factor=1.5
      --set model.moe_pad_expert_input_to_capacity=true --set model.moe_shared_expert_intermediate_size=32
      --set model.moe_shared_expert_gate=true --set model.moe_input_jitter_eps=0.05)
    train moe2-cpu cpu fp32 "${moe[@]}" "${llama[@]}" &&
      train moe2-gpu cuda fp32 "${moe[@]}" "${llama[@]}" && compare moe2-gpu moe2-cpu 1e-4
    # CUDA graphs capture the padded groups whole (the plan made on the device, the routing
    # record kept there): bit-identical to eager, under a batch ramp (2, 3, then 4 micro
    # batches a step: the MoE losses' weight changes and a replay reads it from device
    # memory), in fp32 and bf16
    ramp=(--set "training.rampup_batch_size={start: 4, increment: 2, ramp_tokens: 384}")
    for prec in fp32 bf16; do
      train "moe2-eager-$prec" cuda $prec "${moe[@]}" "${llama[@]}" "${ramp[@]}" &&
        train "moe2-graph-$prec" cuda $prec "${moe[@]}" "${llama[@]}" "${ramp[@]}" --set training.enable_cuda_graph=true &&
        compare "moe2-graph-$prec" "moe2-eager-$prec" 0
      if grep -q "CUDA graphs: micro batches of 2 samples captured" "$out/moe2-graph-$prec.log" &&
        ! grep -q "CUDA graphs off" "$out/moe2-graph-$prec.log"; then
        echo "  moe2-graph-$prec: the MoE micro batches ran as graphs ok"
      else
        echo "  moe2-graph-$prec: no graph captured FAILED"; grep -i "graph" "$out/moe2-graph-$prec.log" | tail -3
        fails=$((fails + 1))
      fi
    done
    python3 - "$out" <<'EOF' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
a = [json.loads(l) for l in open(f"{out}/moe2-graph-fp32/metrics.jsonl")]
b = [json.loads(l) for l in open(f"{out}/moe2-eager-fp32/metrics.jsonl")]
keys = [k for k in b[0] if k.startswith("moe")]
same = len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys)
batches = sorted({r.get("global_batch_size", r.get("batch_size")) for r in b})
print(f"  moe2 graph vs eager routing record ({', '.join(keys)}): {'identical' if same else 'DIFFERENT'}; "
      f"batches {batches}")
sys.exit(0 if same and keys and len(batches) > 1 else 1)
EOF
    # A routing form (its --set overrides): fp32 cuda vs cpu (1e-4), and under mpirun at ep2
    # against one process (1e-5)
    moe_form() {
      local name=$1
      shift
      train "moe-$name-cpu" cpu fp32 "${moe[@]}" "$@" && train "moe-$name-gpu" cuda fp32 "${moe[@]}" "$@" &&
        compare "moe-$name-gpu" "moe-$name-cpu" 1e-4
      train "moe-$name-one" cuda fp32 "${moe[@]}" "$@" --set training.train_iters=4
      mpi_train "moe-$name-ep2" 2 --set training.train_iters=4 "${moe[@]}" "$@" --set parallel.expert_model_parallel_size=2
      compare "moe-$name-ep2" "moe-$name-one" 1e-5
    }
    # sinkhorn's balancing (no balancing loss; the z-loss kept): each ep rank's micro
    # batches balanced as one process balances them
    moe_form sk --set model.moe_router_load_balancing_type=sinkhorn --set model.moe_aux_loss_coeff=0
    # the fp64 router (moe_router_dtype fp64: the router's side in double, the weights on the
    # rows fp32), and in bf16 storage cuda vs cpu
    r64=(--set model.moe_router_dtype=fp64)
    moe_form r64 "${r64[@]}"
    train moe-r64-16-cpu cpu bf16 "${moe[@]}" "${r64[@]}" && train moe-r64-16-gpu cuda bf16 "${moe[@]}" "${r64[@]}" &&
      compare moe-r64-16-gpu moe-r64-16-cpu 2e-2
    # bf16 storage (fp32 master weights, the router in fp32): cuda vs cpu, and the cpu's bf16
    # run against its fp32 run (full recompute there: the same numbers as without)
    train moe16-cpu cpu bf16 "${moe[@]}" && train moe16-gpu cuda bf16 "${moe[@]}" && compare moe16-gpu moe16-cpu 2e-2
    compare moe16-cpu moe-cpu 2e-2
    train moe-one cuda fp32 "${moe[@]}" --set training.train_iters=4
    for l in "ep2 2 --set parallel.expert_model_parallel_size=2" \
      "etp2-ep2-zero1 4 --set parallel.expert_model_parallel_size=2 --set parallel.expert_tensor_parallel_size=2 --set parallel.use_distributed_optimizer=true"; do
      set -- $l
      name=$1 np=$2
      shift 2
      mpi_train "moe-$name" "$np" --set training.train_iters=4 "${moe[@]}" "$@"
      compare "moe-$name" moe-one 1e-5
    done
    # eval and greedy generate of a random MoE model on cuda against the cpu (routing without
    # drops; the KV cache unchanged)
    scripts/fetch-gpt2-vocab.sh >/dev/null || { echo "  GPT-2's vocabulary could not be fetched"; fails=$((fails + 1)); }
    small=(--random-init test/fixtures/eval/tiny-model.yaml --set model.num_experts=4 --set model.moe_router_topk=2
      --set model.moe_ffn_hidden_size=32 --set model.add_bias_linear=false)
    for dev in cpu cuda; do
      "$bin" eval "${small[@]}" --device $dev --tasks piqa,lambada_openai --data-dir test/fixtures/eval --num-fewshot 1 \
        --batch-size 7 --no-progress --output "$out/moe-eval-$dev.json" --log-samples "$out/moe-samples-$dev.jsonl" \
        >"$out/moe-eval-$dev.log" 2>&1 || { echo "  moe eval on $dev failed"; tail -3 "$out/moe-eval-$dev.log"; fails=$((fails + 1)); }
      "$bin" generate "${small[@]}" --set model.init_method_std=0.3 --device $dev --prompt "The quick brown fox" \
        --greedy --max-new-tokens 20 --no-echo >"$out/moe-gen-$dev.txt" 2>"$out/moe-gen-$dev.log" ||
        { echo "  moe generate on $dev failed"; tail -3 "$out/moe-gen-$dev.log"; fails=$((fails + 1)); }
    done
    python3 - "$out/moe-samples-cpu.jsonl" "$out/moe-samples-cuda.jsonl" <<'EOF' || fails=$((fails + 1))
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
worst = max(abs(u - v) / max(abs(u), 1.0) for x, y in zip(a, b) for u, v in zip(x["loglikelihoods"], y["loglikelihoods"]))
ok = len(a) == len(b) > 0 and worst <= 1e-4
print(f"  moe eval cuda vs cpu: {len(a)} documents, worst log-likelihood difference {worst:.2e} (bound 1e-4) "
      f"{'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
    if cmp -s "$out/moe-gen-cpu.txt" "$out/moe-gen-cuda.txt" && [ -s "$out/moe-gen-cuda.txt" ]; then
      echo "  moe generate: cuda's greedy text is the cpu's ok"
    else
      echo "  moe generate: cuda's greedy text differs from the cpu's FAILED"; fails=$((fails + 1))
    fi
    "$bin" train recipes/tiny-mock.yaml "${moe[@]}" --set training.device=cuda --set training.enable_cuda_graph=true \
      --set logging.dir="$out/moe-graphs" >"$out/moe-graphs.log" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -q "training.enable_cuda_graph: MoE layers route dropless" "$out/moe-graphs.log"; then
      echo "  CUDA graphs with dropless MoE layers: exit 2 naming training.enable_cuda_graph ok"
    else
      echo "  CUDA graphs with dropless MoE layers: exit $rc FAILED"; tail -3 "$out/moe-graphs.log"; fails=$((fails + 1))
    fi
    ;;
  cp)
    common=(--set training.train_iters=4 --set model.hidden_dropout=0 --set model.attention_dropout=0)
    train one cuda fp32 "${common[@]}"
    for layout in "cp2 2" "cp2-allgather 2 --set parallel.cp_comm_type=all_gather" \
      "cp2-tp2-sp 4 --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true" \
      "cp2-a2a 2 --set parallel.cp_comm_type=a2a" \
      "cp4-a2a+p2p 4 --set parallel.context_parallel_size=4 --set parallel.cp_comm_type=a2a+p2p --set parallel.hierarchical_context_parallel_sizes=[2,2]"; do
      set -- $layout
      name=$1 np=$2
      shift 2
      mpi_train "$name" "$np" "${common[@]}" --set parallel.context_parallel_size=2 "$@"
      compare "$name" one 1e-5
    done
    # bf16: the p2p ring's blocks are cuDNN's fused graphs (the banner says so), against one
    # process's cuDNN attention, within the bf16 runs' bound
    train one16 cuda bf16 "${common[@]}"
    for type in p2p all_gather; do
      mpi_train "cp2-bf16-$type" 2 "${common[@]}" --set parallel.context_parallel_size=2 \
        --set parallel.cp_comm_type=$type --set training.precision=bf16
      compare "cp2-bf16-$type" one16 2e-2
      if grep -q "cuDNN's fused blocks" "$out/cp2-bf16-$type.log"; then
        echo "  cp2-bf16-$type: cuDNN's fused blocks ok"
      else
        echo "  cp2-bf16-$type: the banner does not say cuDNN's fused blocks FAILED"; fails=$((fails + 1))
      fi
    done
    ;;
  graphs)
    nodrop=(--set model.hidden_dropout=0 --set model.attention_dropout=0 --set data.eod_mask_loss=true
      --set optimizer.initial_loss_scale=1024)
    # PRECISION RECOMPUTE DROPOUT: with dropout the kernels take their keys from device
    # memory (bf16: the flash form, cuDNN's dropout; fp32: the unfused form's)
    for c in "fp32 none 0" "fp32 full 0" "bf16 selective 0" "fp16 none 0" "fp32 selective 0.1" "bf16 none 0.1"; do
      set -- $c
      id="$1-$2$([ "$3" = 0 ] || echo -drop)"
      drop=(--set model.hidden_dropout="$3" --set model.attention_dropout="$3")
      train "eager-$id" cuda "$1" "${nodrop[@]}" "${drop[@]}" --set parallel.recompute_granularity="$2" &&
        train "graph-$id" cuda "$1" "${nodrop[@]}" "${drop[@]}" --set parallel.recompute_granularity="$2" \
          --set training.enable_cuda_graph=true &&
        compare "graph-$id" "eager-$id" 0
    done
    # the Llama family with Qwen3's per-head q/k norms (their op and weights inside the graphs)
    qk=(--set model.position_embedding_type=rope --set model.normalization=RMSNorm --set model.swiglu=true
      --set model.ffn_hidden_size=80 --set model.num_query_groups=2 --set model.add_bias_linear=false
      --set model.qk_layernorm=true)
    train eager-qk cuda bf16 "${nodrop[@]}" "${qk[@]}" &&
      train graph-qk cuda bf16 "${nodrop[@]}" "${qk[@]}" --set training.enable_cuda_graph=true &&
      compare graph-qk eager-qk 0
    # the dropout runs do drop: not the numbers of the runs without
    python3 - "$out" <<'EOF' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(f"{out}/eager-fp32-selective-drop/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{out}/eager-fp32-none/metrics.jsonl")]  # recompute changes no bits
print(f"  dropout 0.1 against 0 (fp32): last loss {a[-1]:.6f} vs {b[-1]:.6f}")
sys.exit(0 if a != b else 1)
EOF
    # dp2: each rank's step has 2 micro batches, the last one eager; tp2 with sequence
    # parallelism: the tensor-parallel collectives captured with the rest, 4 micro batches;
    # cp2: the K/V ring's sends and receives on their side streams captured too
    for layout in "dp2" "tp2 --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true" \
      "cp2 --set parallel.context_parallel_size=2"; do
      set -- $layout
      name=$1
      shift
      for mode in eager graph; do
        extra=()
        [ $mode = graph ] && extra=(--set training.enable_cuda_graph=true)
        MTNLG_EMU_DEVICES=2 "$repo/test/support/mpi/mpirun.sh" 2 "$bin" train recipes/tiny-mock.yaml \
          --set training.device=cuda --set training.precision=bf16 --set training.train_iters=6 "${nodrop[@]}" \
          --set logging.dir="$out/$name-$mode" --set logging.log_interval=1 "$@" "${extra[@]}" \
          >"$out/$name-$mode.log" 2>&1 ||
          { echo "  mpirun -np 2 $name ($mode) failed"; tail -20 "$out/$name-$mode.log"; fails=$((fails + 1)); }
      done
      compare "$name-graph" "$name-eager" 0
    done
    # a capture the runtime invalidates (fault injection): warned once, then eager, same numbers
    MTNLG_EMU_CAPTURE_FAIL=1 train "graph-refused" cuda bf16 "${nodrop[@]}" --set parallel.recompute_granularity=selective \
      --set training.enable_cuda_graph=true && compare graph-refused eager-bf16-selective 0
    python3 - "$out" <<'EOF' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
def last(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")][-1]
# 6 steps x 4 micro batches: the first eager (warm-up), the other 23 a forward and a
# backward launch each; dp2: 6 x 2, the last of each step eager: 5 graphed; cp2: 6 x 4,
# the last of each step eager (its gradients are reduced over dp x cp): 17 graphed
want = {"graph-fp32-none": 46, "graph-fp32-full": 46, "graph-bf16-selective": 46, "graph-fp16-none": 46, "dp2-graph": 10,
        "tp2-graph": 46, "cp2-graph": 34, "graph-fp32-selective-drop": 46, "graph-bf16-none-drop": 46, "graph-qk": 46}
ok = True
for name, n in want.items():
    got = last(name).get("cuda_graph_replays")
    captured = "captured (forward and backward" in open(f"{out}/{name}.log").read()
    print(f"  {name}: {got} graph launches (want {n}), capture logged: {captured}")
    ok = ok and got == n and captured
ok = ok and "cuda_graph_replays" not in last("eager-bf16-selective")
# a replay counts the tensor-parallel bytes its capture counted: the same traffic as eager
tp_bytes = [[json.loads(l)["bytes_sent_tp"] for l in open(f"{out}/tp2-{m}/metrics.jsonl")] for m in ("eager", "graph")]
print(f"  tp2 bytes sent per iteration: eager {tp_bytes[0]}, graphs {tp_bytes[1]}")
ok = ok and tp_bytes[0] == tp_bytes[1] and tp_bytes[0][-1] > 0
cp_bytes = [[json.loads(l)["bytes_sent_cp"] for l in open(f"{out}/cp2-{m}/metrics.jsonl")] for m in ("eager", "graph")]
print(f"  cp2 bytes sent per iteration: eager {cp_bytes[0]}, graphs {cp_bytes[1]}")
ok = ok and cp_bytes[0] == cp_bytes[1] and cp_bytes[0][-1] > 0
warned = [l for l in open(f"{out}/graph-refused.log") if "CUDA graphs off for micro batches" in l]
print(f"  graph-refused: {last('graph-refused').get('cuda_graph_replays')} graph launches, "
      f"{len(warned)} warning(s): {warned[0].strip()[:160] if warned else '-'}")
ok = ok and last("graph-refused").get("cuda_graph_replays") == 0 and len(warned) == 1 and "StreamCaptureInvalidated" in warned[0]
sys.exit(0 if ok else 1)
EOF
    # what graphs do not cover: exit 2 and the key named (pp2 under mpirun: every rank)
    refused() {  # refused NAME PATTERN COMMAND...
      local name=$1 pattern=$2
      shift 2
      "$@" --set training.train_iters=1 --set training.enable_cuda_graph=true --set logging.dir="$out/refused-$name" \
        >"$out/refused-$name.log" 2>&1
      local rc=$?
      if [ $rc -eq 2 ] && grep -q "training.enable_cuda_graph: $pattern" "$out/refused-$name.log"; then
        echo "  refused ($name): $(grep -o 'training.enable_cuda_graph.*' "$out/refused-$name.log" | head -1 | cut -c1-110)"
      else
        echo "  enable_cuda_graph ($name): exit $rc, not refused as expected"; tail -5 "$out/refused-$name.log"
        fails=$((fails + 1))
      fi
    }
    refused pp2 "graphs cover one pipeline stage" env MTNLG_EMU_DEVICES=2 "$repo/test/support/mpi/mpirun.sh" 2 "$bin" \
      train recipes/tiny-mock.yaml --set training.device=cuda --set parallel.pipeline_model_parallel_size=2
    refused forensics "spike forensics" "$bin" train recipes/tiny-mock.yaml --set training.device=cuda \
      --set training.check_for_nan_in_loss_and_grad=true
    refused cpu "training runs on the CPU" "$bin" train recipes/tiny-mock.yaml --set training.device=cpu
    ;;
  watchdog)
    # 1. The hang: rank 5 (tp=1, pp=1, dp=0) stops entering collectives at iteration 4; the
    # checkpoint of iteration 2 was committed after iteration 3. Rank 0's communicator aborts
    # (15) take 0.3 s each: the ranks done sooner wait for it, so that the launcher, which ends
    # the job when the first process exits, does not kill it before its last line.
    MTNLG_EMU_NCCL_FAULT=rank=0:abort_ms=300 MTNLG_FAULT_INJECT=rank=5:iteration=4:mode=hang wd hang 8 "${l8[@]}" --set training.train_iters=6 --set checkpoint.save="$out/ck-hang" --set checkpoint.save_interval=2
    rc=$?
    echo "  hang: mpirun exited $rc (want 3)"
    [ $rc -eq 3 ] || { tail -20 "$out/hang.log"; fails=$((fails + 1)); }
    grep -q "MTNLG_FAULT_INJECT hang" "$out/hang.log" || { echo "  hang: the fault did not fire"; fails=$((fails + 1)); }
    tripped hang 8 $((T + 30)) 5
    # nothing half-written: iteration 2 committed, no partial directory left
    if [ "$(cat "$out/ck-hang/latest" 2>/dev/null)" = 2 ] && [ -d "$out/ck-hang/iter_0000002" ] &&
      [ -z "$(ls -d "$out"/ck-hang/*.partial 2>/dev/null)" ]; then
      echo "  hang: checkpoint iter_0000002 committed, nothing partial"
    else
      echo "  hang: checkpoint: latest=$(cat "$out/ck-hang/latest" 2>/dev/null), $(ls "$out/ck-hang" | tr '\n' ' ')"
      fails=$((fails + 1))
    fi
    # 2. It resumes bit for bit: iterations 3 and 4 from that checkpoint against a straight run.
    wd straight 8 "${l8[@]}" --set training.train_iters=4 || { echo "  straight run failed"; tail -5 "$out/straight.log"; fails=$((fails + 1)); }
    wd resumed 8 "${l8[@]}" --set training.train_iters=4 --set checkpoint.load="$out/ck-hang" ||
      { echo "  resumed run failed"; tail -5 "$out/resumed.log"; fails=$((fails + 1)); }
    compare resumed straight 0 3
    # 3. An asynchronous ncclRemoteError on rank 2's 60th NCCL operation: every rank out within 10 s.
    MTNLG_EMU_NCCL_FAULT=rank=2:op=60:error=remote wd async 4 "${l4[@]}" --set training.train_iters=6
    echo "  async: mpirun exited $? (want 3)"
    grep -q "MTNLG_EMU_NCCL_FAULT" "$out/async.log" || { echo "  async: the fault did not fire"; fails=$((fails + 1)); }
    tripped async 4 10 2
    # 4. CUDA graphs (one stage: tp2 x dp2): rank 1 stops entering at iteration 3, where every
    # micro batch but the last runs as graph replays.
    MTNLG_FAULT_INJECT=rank=1:iteration=3:mode=hang wd graphs 4 "${l4[@]}" --set training.train_iters=6 \
      --set training.enable_cuda_graph=true
    echo "  graphs: mpirun exited $? (want 3)"
    tripped graphs 4 $((T + 30)) 1
    grep -q '"replay": true' "$out"/graphs/flight_recorder/rank0.json ||
      { echo "  graphs: no graph replay in rank 0's flight recorder"; fails=$((fails + 1)); }
    # 5. A killed rank (SIGKILL at iteration 3): its connection to the liveness service
    # closes with the process, the service tells the survivors, and they end within 10 s
    # of its death (as rank 0's service saw it). OpenMPI's mpirun would end the job itself at once; told
    # not to (orte_abort_on_non_zero_status 0) it leaves the survivors to the watchdog, but
    # then never returns, so it is stopped once every survivor has exited.
    (MTNLG_FAULT_INJECT=rank=1:iteration=3:mode=kill OMPI_MCA_orte_abort_on_non_zero_status=0 \
      wd killed 4 "${l4[@]}" --set training.train_iters=6) &
    left_alone killed 3 $!
    tripped killed 4 10 1 1
    # 6. SIGUSR1 (save and stop) also writes a live dump; a bad MTNLG_NCCL_WATCHDOG is exit 2.
    MTNLG_FAULT_INJECT=rank=0:iteration=2:mode=sigusr1 wd usr1 2 "${l4[@]}" --set training.train_iters=4 \
      --set checkpoint.save="$out/ck-usr1"
    rc=$?
    if [ $rc -eq 0 ] && grep -q '"reason": "live dump (SIGUSR1)"' "$out/usr1/flight_recorder/rank0.json" 2>/dev/null; then
      echo "  usr1: saved and stopped (exit 0), rank 0's live dump written"
    else
      echo "  usr1: exit $rc, no live dump"; tail -5 "$out/usr1.log"; fails=$((fails + 1))
    fi
    MTNLG_NCCL_WATCHDOG=maybe wd badswitch 2 "${l4[@]}" --set training.train_iters=1
    rc=$?
    if [ $rc -eq 2 ] && grep -q 'MTNLG_NCCL_WATCHDOG="maybe": expected 1 or 0' "$out/badswitch.log"; then
      echo "  MTNLG_NCCL_WATCHDOG=maybe: exit 2, named"
    else
      echo "  MTNLG_NCCL_WATCHDOG=maybe: exit $rc"; tail -5 "$out/badswitch.log"; fails=$((fails + 1))
    fi
    # 8. Initialisation has the deadline too: rank 1 never joins its second NCCL
    # communicator (MTNLG_EMU_NCCL_FAULT init=2): every rank ends, naming the group, within
    # the timeout + 30 s, instead of waiting in ncclCommInitRank forever.
    MTNLG_EMU_NCCL_FAULT=rank=1:init=2 wd init 2 "${l4[@]}" --set training.train_iters=1
    rc=$?
    read -r t0 t1 <"$out/init.secs"
    secs=$(python3 -c "print(round($t1 - $t0))")
    if [ $rc -ne 0 ] && grep -q "initialisation of NCCL group 'tp' .*still in progress after .* a peer never joined" "$out/init.log" &&
      [ "$secs" -le $((T + 30)) ]; then
      echo "  init: exit $rc after $secs s: $(grep -o "initialisation of NCCL group 'tp'.*joined" "$out/init.log" | head -1)"
    else
      echo "  init: exit $rc after $secs s, not the initialisation deadline"; tail -5 "$out/init.log"; fails=$((fails + 1))
    fi
    # 9. `mtnlg eval` under mpirun (tp2) on NCCL groups is watched too: a checkpoint of the
    # tiny GPT-2-vocabulary model, then rank 1 stops entering collectives at the second
    # eval batch (MTNLG_FAULT_INJECT mode=hang; an 8 s timeout, which a loaded machine's
    # emulated batch stays well within, and no more: the case costs seconds), and an
    # asynchronous ncclRemoteError on rank 1: both ranks exit 3 with their dumps and the
    # verdict names rank 1.
    if scripts/fetch-gpt2-vocab.sh >/dev/null &&
      "$bin" train test/fixtures/eval/tiny-model.yaml --quiet --set training.device=cpu --set logging.dir="$out/ev-train" \
        --set checkpoint.save="$out/ck-eval" --set checkpoint.save_interval=1 >"$out/ev-train.log" 2>&1; then
      # ev NAME ARGS...: the eval of that checkpoint under mpirun -np 2, LOGDIR $out/NAME
      ev() {
        local name=$1 t0 t1 rc
        shift
        t0=$(date +%s.%N)
        env "$@" MTNLG_EMU_DEVICES=2 "$repo/test/support/mpi/mpirun.sh" 2 "$bin" eval --checkpoint "$out/ck-eval" \
          --device cuda --tasks piqa --limit 1 --batch-size 1 --data-dir test/fixtures/eval --no-progress \
          --set parallel.tensor_model_parallel_size=2 --set logging.dir="$out/$name" >"$out/$name.log" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        echo "$t0 $t1" >"$out/$name.secs"
        echo "  $name: mpirun exited $rc (want 3), $(python3 -c "print(round($t1 - $t0, 1))") s"
        [ $rc -eq 3 ] || { tail -5 "$out/$name.log"; fails=$((fails + 1)); }
      }
      ev eval-hang MTNLG_COLLECTIVE_TIMEOUT=8 MTNLG_FAULT_INJECT=rank=1:iteration=2:mode=hang
      tripped eval-hang 2 38 1
      ev eval-async MTNLG_EMU_NCCL_FAULT=rank=1:op=5:error=remote
      tripped eval-async 2 10 1
      # 10. `mtnlg generate` under mpirun (tp2, its NCCL group): the greedy text of the
      # single CPU process; rank 1 stops entering collectives at token 3 (8 s timeout): both
      # ranks exit 3 with their dumps and the verdict names rank 1.
      gen() {  # gen NAME ENV...: greedy generation under mpirun -np 2, stdout in NAME.out
        local name=$1 t0 t1
        shift
        t0=$(date +%s.%N)
        env "$@" MTNLG_EMU_DEVICES=2 "$repo/test/support/mpi/mpirun.sh" 2 "$bin" generate --checkpoint "$out/ck-eval" \
          --device cuda --prompt "The cat" --max-new-tokens 8 --greedy --no-echo \
          --set parallel.tensor_model_parallel_size=2 --set logging.dir="$out/$name" >"$out/$name.out" 2>"$out/$name.log"
        local rc=$?
        t1=$(date +%s.%N)
        echo "$t0 $t1" >"$out/$name.secs"
        return $rc
      }
      "$bin" generate --checkpoint "$out/ck-eval" --device cpu --prompt "The cat" --max-new-tokens 8 --greedy --no-echo \
        >"$out/gen-one.out" 2>"$out/gen-one.log"
      gen gen-tp2 MTNLG_COLLECTIVE_TIMEOUT=8
      rc=$?
      if [ $rc -eq 0 ] && [ -s "$out/gen-one.out" ] && cmp -s "$out/gen-one.out" "$out/gen-tp2.out"; then
        echo "  gen-tp2: tp2 on the emulated NCCL generates the single process's text: $(head -c 60 "$out/gen-one.out")"
      else
        echo "  gen-tp2: exit $rc; tp2 '$(cat "$out/gen-tp2.out")' vs one process '$(cat "$out/gen-one.out")'"
        tail -5 "$out/gen-tp2.log"; fails=$((fails + 1))
      fi
      gen gen-hang MTNLG_COLLECTIVE_TIMEOUT=8 MTNLG_FAULT_INJECT=rank=1:iteration=3:mode=hang
      rc=$?
      echo "  gen-hang: mpirun exited $rc (want 3)"
      [ $rc -eq 3 ] || { tail -5 "$out/gen-hang.log"; fails=$((fails + 1)); }
      tripped gen-hang 2 38 1
    else
      echo "  eval: no GPT-2 vocabulary or the checkpoint's training failed"; tail -5 "$out/ev-train.log"; fails=$((fails + 1))
    fi
    # 7. A slow but live rank: 3 s per iteration, well inside the timeout: no abort, no dump.
    MTNLG_FAULT_INJECT=rank=3:iteration=2:mode=slow:ms=3000 wd slow 4 "${l4[@]}" --set training.train_iters=4
    rc=$?
    n=$(ls "$out/slow/flight_recorder"/rank*.json 2>/dev/null | wc -l)
    echo "  slow: mpirun exited $rc (want 0), $n dumps (want 0)"
    [ $rc -eq 0 ] && [ "$n" -eq 0 ] || { tail -5 "$out/slow.log"; fails=$((fails + 1)); }
    ;;
  pause)
    # A pause is not a death (tp2 x pp2 x dp2, MTNLG_COLLECTIVE_TIMEOUT=30 s): processes are
    # stopped with SIGSTOP and continued with SIGCONT, as a debugger, swapping or
    # `scontrol suspend`/`resume` do.
    # pids NAME: the rank processes of run NAME (its logging.dir is on their command lines)
    # (argv[0] is the binary: mtnlg re-executes itself through /proc/self/exe, so comm says "exe")
    pids() { pgrep -f -- "logging.dir=$out/$1( |\$)" | while read -r p; do
      [ "$(basename "$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1)")" = "$(basename "$bin")" ] && echo "$p"; done; }
    # stopped_pid NAME: waits (at most 120 s) until one rank process of NAME is stopped; prints it
    stopped_pid() {
      for _ in $(seq 1200); do
        for p in $(pids "$1"); do
          [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = T ] && { echo "$p"; return 0; }
        done
        sleep 0.1
      done
      return 1
    }
    wd straight 8 "${l8[@]}" --set training.train_iters=4 || { echo "  straight run failed"; tail -5 "$out/straight.log"; fails=$((fails + 1)); }
    # (a) Rank 5 stops itself (SIGSTOP) at iteration 3 and is continued 10 s later: the
    # run finishes, its losses those of the straight run.
    (MTNLG_FAULT_INJECT=rank=5:iteration=3:mode=stop wd one 8 "${l8[@]}" --set training.train_iters=4; echo $? >"$out/one.rc") &
    bg=$!
    if p=$(stopped_pid one); then
      sleep 10
      kill -CONT "$p"
    else
      echo "  one: rank 5 never stopped"; fails=$((fails + 1))
    fi
    wait "$bg"
    rc=$(cat "$out/one.rc")
    echo "  one: rank 5 stopped for 10 s under a ${T} s timeout: mpirun exited $rc (want 0)"
    [ "$rc" = 0 ] || { tail -5 "$out/one.log"; fails=$((fails + 1)); }
    compare one straight 0
    # (b) Every rank stopped together for longer than the timeout (a suspended job), then
    # continued: the run finishes with the straight run's losses, and the watchdog saw the pause.
    (wd all 8 "${l8[@]}" --set training.train_iters=4; echo $? >"$out/all.rc") &
    bg=$!
    for _ in $(seq 1200); do grep -q "iteration *2/" "$out/all.log" 2>/dev/null && break; sleep 0.1; done
    mapfile -t all < <(pids all)
    kill -STOP "${all[@]}"
    sleep $((T + 8))
    kill -CONT "${all[@]}"
    wait "$bg"
    rc=$(cat "$out/all.rc")
    echo "  all: ${#all[@]} ranks stopped together for $((T + 8)) s under a ${T} s timeout: mpirun exited $rc (want 0)"
    [ "$rc" = 0 ] && [ "${#all[@]}" = 8 ] || { tail -5 "$out/all.log"; fails=$((fails + 1)); }
    grep -q "NCCL watchdog: this process was stopped for" "$out/all.log" ||
      { echo "  all: no rank's watchdog noticed the pause"; fails=$((fails + 1)); }
    compare all straight 0
    # (c) Rank 5 stopped for good: every other rank exits 3 within the timeout + 30 s of the
    # first operation left waiting, and the verdict names rank 5 as alive but silent. The
    # launcher ends the job once they have; the stopped process is then killed here.
    (MTNLG_FAULT_INJECT=rank=5:iteration=3:mode=stop OMPI_MCA_orte_abort_on_non_zero_status=0 \
      wd forever 8 "${l8[@]}" --set training.train_iters=4) &
    bg=$!
    # the stopped rank's pid is read before the others exit (the launcher may reap it then)
    stopped=$(stopped_pid forever)
    left_alone forever 7 "$bg" $stopped
    tripped forever 8 $((T + 30)) 5 5 "but did not answer"
    # (e) A real Slurm job (scripts/slurm-local: one node on loopback), srun -n 4, tp2 x
    # dp2: `scontrol suspend` for longer than the timeout, `scontrol resume`: the job
    # completes with the straight run's losses. Needs root and slurm-wlm + munge.
    if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null && command -v srun >/dev/null; then
      state=/tmp/mtnlg-slurm-pause-$$
      MTNLG_SLURM_PORT=$((26000 + 2 * ($$ % 2000))) timeout -k 5 60 scripts/slurm-local/start.sh "$state" \
        >"$out/slurm-start.log" 2>&1 || { echo "  slurm: the local cluster did not start"; cat "$out/slurm-start.log"; fails=$((fails + 1)); }
      export SLURM_CONF=$state/slurm.conf
      srun_env=(OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1
        OMPI_MCA_osc=^ucx OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_tcp_if_include=lo
        MTNLG_COLLECTIVE_TIMEOUT=$T MTNLG_EMU_DEVICES=4)
      (env "${srun_env[@]}" timeout -k 10 400 srun -n 4 --mpi=pmix --kill-on-bad-exit=1 -J mtnlg-pause "$bin" train \
        recipes/tiny-mock.yaml "${common[@]}" --set logging.dir="$out/slurm" "${l4[@]}" --set training.train_iters=4 \
        >"$out/slurm.log" 2>&1; echo $? >"$out/slurm.rc") &
      bg=$!
      for _ in $(seq 1800); do grep -q "iteration *2/" "$out/slurm.log" 2>/dev/null && break; sleep 0.1; done
      job=$(squeue -h -n mtnlg-pause -o %A | head -1)
      if [ -n "$job" ] && scontrol suspend "$job"; then
        sleep $((T + 8))
        scontrol resume "$job" || fails=$((fails + 1))
      else
        echo "  slurm: no job to suspend (squeue: '$job')"; fails=$((fails + 1))
      fi
      wait "$bg"
      rc=$(cat "$out/slurm.rc")
      echo "  slurm: job $job suspended for $((T + 8)) s under a ${T} s timeout, resumed: srun exited $rc (want 0)"
      [ "$rc" = 0 ] || { tail -8 "$out/slurm.log"; fails=$((fails + 1)); }
      grep -q "NCCL watchdog: this process was stopped for" "$out/slurm.log" ||
        { echo "  slurm: no rank's watchdog noticed the suspension"; fails=$((fails + 1)); }
      wd straight4 4 "${l4[@]}" --set training.train_iters=4 && compare slurm straight4 0
      timeout -k 5 60 scripts/slurm-local/stop.sh "$state" --purge >/dev/null 2>&1
      unset SLURM_CONF
    else
      echo "  slurm: skipped (needs root and slurm-wlm + munge: scripts/install-deps.sh)"
    fi
    ;;
  *) echo "e2e.sh: unknown step '$step'" >&2; exit 2 ;;
esac
[ $fails -eq 0 ] && echo "PASS $step" || echo "FAIL $step ($fails)"
exit $fails
