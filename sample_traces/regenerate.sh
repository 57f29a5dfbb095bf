#!/usr/bin/env bash
# Regenerate every sample trace with the commands listed in sample_traces/README.md.
# Needs PyTorch (pip install 'pipebubble[capture]'); runs on CPU in about a minute.
# --force: each capture replaces the one already in its folder.
set -euo pipefail
cd "$(dirname "$0")/.."

pipebubble capture --force --out sample_traces/toy_train -- python sample_traces/toy_train.py

pipeline="pipebubble capture --force --workload pipeline --stages 4 --microbatches 8 --active 1"
$pipeline --schedule gpipe --out sample_traces/pipeline_gpipe
$pipeline --schedule 1f1b --out sample_traces/pipeline_1f1b
$pipeline --schedule 1f1b --imbalance 1.6 --out sample_traces/pipeline_1f1b_imbalanced
for schedule in gpipe 1f1b; do
  for m in 4 8; do
    pipebubble capture --force --workload pipeline --stages 4 --microbatches $m --batch 2048 --hidden 128 --layers 8 \
      --active 1 --schedule $schedule --out sample_traces/memory/${schedule}_m$m
  done
done

serve="pipebubble capture --force --workload serve --requests 32 --arrival-rate 0.25"
$serve --out sample_traces/serve
$serve --chunked-prefill 256 --out sample_traces/serve_chunked_prefill
