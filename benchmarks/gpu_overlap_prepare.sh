#!/usr/bin/env bash
# Fills .gpu with what benchmarks/gpu_overlap.sh needs: what gpu_prepare.sh puts there (wheels,
# jericho and fast_downward, the ALFWorld games) and the tokenizer and prompt of a full-history
# ALFWorld model folder (MODEL, e.g. a seed's model-init from `make alfworld-cpu-full`). The tracked
# tree's seed results are too large to carry: see gpu_overlap.sh.
#   MODEL=runs/alfworld-cpu-full/seed4/model-init bash benchmarks/gpu_overlap_prepare.sh
set -eu
MODEL=${MODEL:?a full-history ALFWorld model folder}
source "$(dirname "$0")/gpu_prepare.sh"
prepare_gpu_folder peft==0.21.2
mkdir .gpu/alf-full-model && cp "$MODEL"/* .gpu/alf-full-model/ && rm -f .gpu/alf-full-model/model.safetensors
du -sh .gpu/* | sort -h
