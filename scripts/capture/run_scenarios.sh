#!/usr/bin/env bash
# Run fault-injection scenarios of train.py as a user would: torchrun (2 ranks) with
# --tee 3 and --log-dir, NCCL_DEBUG=INFO, the console tee'd to driver.log, nvidia-smi
# sampling in the background.  One folder per scenario under OUTROOT.
#
# usage: scripts/capture/run_scenarios.sh OUTROOT SPEC...
#   SPEC = scenario[@lr][=folder]   e.g.  healthy   lr_divergence@0.3=var1/lr_divergence
# CAPTURE_NPROC ranks (default 2, one per GPU); CAPTURE_FAULTY_RANK picks the rank a fault hits (default 1).
# Run from the repository root.  Set CAPTURE_TINY=1 for a CPU/gloo logic test.
set -u -o pipefail
ROOT=$1; shift
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAVE_GPU=1; fi
TINY=()
[ "${CAPTURE_TINY:-0}" = 1 ] && TINY=(--tiny)

[ -s "$ROOT/.collect_env.txt" ] || $PY -m torch.utils.collect_env > "$ROOT/.collect_env.txt" 2>&1
if [ $HAVE_GPU = 1 ] && [ ! -s "$ROOT/.nvidia_smi_q.txt" ]; then nvidia-smi -q > "$ROOT/.nvidia_smi_q.txt" 2>&1; fi

port=${CAPTURE_PORT0:-29500}
for spec in "$@"; do
  folder=$spec; [[ $spec == *=* ]] && folder=${spec#*=}
  spec=${spec%%=*}
  name=${spec%%@*}; lr=""
  [[ $spec == *@* ]] && lr=${spec#*@}
  [[ $folder == "$spec" ]] && folder=$name
  run="$ROOT/$folder"
  rm -rf "$run"; mkdir -p "$run"
  cp "$ROOT/.collect_env.txt" "$run/collect_env.txt"
  [ -f "$ROOT/.nvidia_smi_q.txt" ] && cp "$ROOT/.nvidia_smi_q.txt" "$run/nvidia_smi_q.txt"
  port=$((port + 1))

  envs=(NCCL_DEBUG=INFO)
  tmo=120
  case $name in
    healthy|lr_divergence|lr_oscillation|nan_injection|slow_rank|trace_*|whatif_*) ;;
    *)
      mkdir -p "$run/fr"
      envs+=(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
             TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$run/fr/nccl_trace_rank_" TORCH_FR_DUMP_TEMP_FILE="$run/fr/nccl_trace_rank_")
      ;;
  esac
  case $name in
    oom_then_timeout|stall_timeout_fr) tmo=170 ;;
    collective_mismatch) envs+=(TORCH_DISTRIBUTED_DEBUG=DETAIL CAPTURE_RECORD=1) ;;
    device_assert) envs+=(CAPTURE_RECORD=1) ;;
    bad_socket_ifname) envs+=(NCCL_SOCKET_IFNAME=doesnotexist0 NCCL_IB_DISABLE=1) ;;
  esac
  [[ $folder == *_noddp ]] && envs+=(CAPTURE_NO_DDP=1)
  if [ -n "${CAPTURE_DEADLINE:-}" ]; then  # never run past the caller's deadline (epoch seconds)
    left=$(( CAPTURE_DEADLINE - $(date +%s) ))
    if [ $left -lt 40 ]; then echo "=== SKIP $folder: only ${left}s left before deadline"; rm -rf "$run"; continue; fi
    [ $left -lt $tmo ] && tmo=$left
  fi
  args=(--scenario "$name" --run-dir "$run" "${TINY[@]}")
  [ -n "$lr" ] && args+=(--lr "$lr")

  smi=""
  if [ $HAVE_GPU = 1 ]; then
    nvidia-smi --query-gpu=timestamp,index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw \
      --format=csv -lms 500 > "$run/nvidia_smi.csv" 2>&1 &
    smi=$!
  fi
  t0=$(date +%s.%N)
  echo "=== $(date -u +%FT%TZ) scenario $folder (port $port, timeout $tmo): ${envs[*]} torchrun ... ${args[*]}"
  env "${envs[@]}" timeout -k 15 $tmo torchrun --nproc_per_node "${CAPTURE_NPROC:-2}" --master_addr 127.0.0.1 --master_port $port \
      --tee 3 --log-dir "$run/torchrun_logs" scripts/capture/train.py "${args[@]}" 2>&1 | tee "$run/driver.log" >/dev/null
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  sleep 1
  if [ -n "$smi" ]; then kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; fi
  [ -d "$run/fr" ] && [ -z "$(ls -A "$run/fr")" ] && rmdir "$run/fr"
  dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  # provenance for the lead engineer (not something a user's folder would have)
  printf '{"scenario":"%s","lr":"%s","optim":"%s","nproc":%d,"faulty_rank":%d,"exit_code":%d,"duration_s":%s,"env":"%s","port":%d}\n' \
    "$name" "$lr" "${CAPTURE_OPTIM:-adamw}" "${CAPTURE_NPROC:-2}" "${CAPTURE_FAULTY_RANK:-1}" "$rc" "$dur" "${envs[*]}" \
    "$port" > "$run/capture_meta.json"
  echo "=== scenario $folder exit=$rc duration=${dur}s size=$(du -sh "$run" | cut -f1)"
done
