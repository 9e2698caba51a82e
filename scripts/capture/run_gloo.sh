#!/usr/bin/env bash
# Run gloo_comm.py scenarios as a user would: torchrun with --tee 3 and --log-dir, the console tee'd to
# driver.log. CPU only (Gloo), so it runs anywhere torch is installed. One folder per scenario under OUTROOT.
#
# usage: scripts/capture/run_gloo.sh OUTROOT SCENARIO[:NPROC]...   e.g.  rank_timing:4 gloo_timeout:2
# Run from the repository root.
set -u -o pipefail
ROOT=$1; shift
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
PY=${PYTHON:-python3}
port=${CAPTURE_PORT0:-29600}
for spec in "$@"; do
  name=${spec%%:*}; nproc=2
  [[ $spec == *:* ]] && nproc=${spec#*:}
  run="$ROOT/$name"
  rm -rf "$run"; mkdir -p "$run"
  port=$((port + 1))
  echo "=== $(date -u +%FT%TZ) scenario $name ($nproc ranks, port $port)"
  timeout -k 10 120 $PY -m torch.distributed.run --nproc_per_node "$nproc" --master_addr 127.0.0.1 \
      --master_port $port --tee 3 --log-dir "$run/torchrun_logs" scripts/capture/gloo_comm.py --scenario "$name" \
      2>&1 | tee "$run/driver.log" >/dev/null
  echo "=== scenario $name exit=${PIPESTATUS[0]} size=$(du -sh "$run" | cut -f1)"
done
