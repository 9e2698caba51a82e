#!/usr/bin/env bash
# Capture a full checkpoint disk: ckpt_disk_full.py under torchrun (2 ranks, --tee 3 --log-dir), with
# its checkpoint directory on a small tmpfs (SIZE, default 24m) that the saves fill up. Where mounting is not
# allowed, every checkpoint file is made a link to /dev/full, whose writes fail with ENOSPC.
#
# usage: scripts/capture/ckpt_disk_full.sh OUTDIR [SIZE]      (run from the repository root)
set -u -o pipefail
OUT=$1
SIZE=${2:-24m}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-$(dirname "$(command -v "$PY")")/torchrun}
export PYTHONUNBUFFERED=1
CKPT="$OUT/ckpt"
mkdir -p "$CKPT"
mounted=0
if mount -t tmpfs -o size="$SIZE" tmpfs "$CKPT" 2>/dev/null; then
  mounted=1
  echo "=== checkpoint dir $CKPT: tmpfs of $SIZE"
else
  echo "=== cannot mount a tmpfs here: checkpoint files of steps >= 10 are links to /dev/full"
  for step in 10 15 20 25 30; do
    d="$CKPT/global_step_$step/actor"; mkdir -p "$d"
    for r in 0 1; do ln -sf /dev/full "$d/model_world_size_2_rank_$r.pt"; ln -sf /dev/full "$d/optim_world_size_2_rank_$r.pt"; done
  done
fi
$PY -m torch.utils.collect_env > "$OUT/collect_env.txt" 2>&1
timeout -k 15 300 "$TORCHRUN" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "${CAPTURE_PORT:-29611}" \
  --tee 3 --log-dir "$OUT/torchrun_logs" scripts/capture/ckpt_disk_full.py --ckpt-dir "$CKPT" 2>&1 \
  | tee "$OUT/driver.log" >/dev/null
rc=${PIPESTATUS[0]}
df -h "$CKPT" > "$OUT/df_after.txt" 2>&1
if [ $mounted = 1 ]; then umount "$CKPT"; fi
rmdir "$CKPT" 2>/dev/null || rm -rf "$CKPT"
echo "=== exit code $rc; logs in $OUT"
