#!/usr/bin/env bash
# One device call: run a batch of scenarios on the 2-GPU machine and pack the run
# folders into $OUT (split tarballs of <= 15 MiB, a summary, the whole log).
# usage (from the repo root): scripts/capture/device_call.sh a|b [budget_s]
set -u -o pipefail
PART=$1; BUDGET=${2:-480}
OUT=${OUT:-/tmp/capture_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CAPTURE_DEADLINE=$(( $(date +%s) + BUDGET ))
R=scripts/capture/run_scenarios.sh
main() {
  date -u; uname -a; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  case $PART in
    a) $R /root/runs oom_then_timeout stall_timeout_fr sigkill device_assert collective_mismatch \
          collective_mismatch=collective_mismatch_noddp bad_socket_ifname leak_oom healthy ;;
    b) CAPTURE_PORT0=29600 $R /root/runs nan_injection slow_rank trace_healthy trace_slow_rank trace_large
       CAPTURE_PORT0=29700 $R /root/runs_v1 lr_divergence@0.05 lr_oscillation@3e-3
       CAPTURE_PORT0=29800 $R /root/runs_v2 lr_divergence@0.2 lr_oscillation@6e-3
       CAPTURE_PORT0=29900 $R /root/runs_v3 lr_divergence@1.0 lr_oscillation@1.2e-2 ;;
    c) i=0; for lr in 4e-3 5e-3 7e-3 8e-3 9e-3 1e-2; do i=$((i+1))
         CAPTURE_PORT0=$((30000 + 10*i)) $R /root/runs_o$i lr_oscillation@$lr; done ;;
    d) i=0; for c in sgd:0.9@1.0 sgd:0.9@2.0 sgd:0.9@4.0 adamw:0.0,0.99@3e-3 adamw:0.0,0.99@5e-3 adamw:0.9,0.95@4e-3; do
         i=$((i+1)); CAPTURE_OPTIM=${c%@*} CAPTURE_PORT0=$((30100 + 10*i)) $R /root/runs_p$i lr_oscillation@${c#*@}; done ;;
    # issue 19, on a machine of 4 or 8 GPUs: what-if pairs at 2 and 4 ranks, cascades at all of them with the
    # faulty rank in the middle, multi-rank healthy runs of several schedules
    e) n=$(nvidia-smi -L | wc -l); f=$(( n / 2 + 1 ))
       for w in 2 4; do [ "$w" -le "$n" ] || continue
         CAPTURE_NPROC=$w CAPTURE_PORT0=$((31000 + 100*w)) $R /root/runs_w$w whatif_base whatif_slow_rank whatif_slow_loader
       done
       CAPTURE_NPROC=$n CAPTURE_FAULTY_RANK=$f CAPTURE_PORT0=31500 $R /root/runs_c$n oom_then_timeout stall_timeout_fr \
         sigkill cascade_nccl_error ;;
    f) n=$(nvidia-smi -L | wc -l); i=0
       for spec in healthy@1e-3 healthy@3e-4 healthy@2e-3; do for w in 2 4 "$n"; do i=$((i+1)); [ "$w" -le "$n" ] || continue
         CAPTURE_NPROC=$w CAPTURE_PORT0=$((32000 + 10*i)) $R /root/runs_h$i "$spec=healthy_w${w}_${spec#*@}"; done; done ;;
    *) $R /root/runs "${@:3}" ;;
  esac
  {
    for m in /root/runs*/*/capture_meta.json; do
      d=$(dirname "$m"); echo "## $d $(cat "$m")"; (cd "$d" && find . -type f -printf '%10s %P\n' | sort -k2)
    done
  } > "$OUT/summary_$PART.txt"
  (cd / && tar czf - root/runs*) | split -b 15m -d -a 1 - "$OUT/gpu_$PART.tar.gz.part"
  ls -la "$OUT"; grep '^## ' "$OUT/summary_$PART.txt"
}
main "$@" 2>&1 | tee "$OUT/log_$PART.txt"
