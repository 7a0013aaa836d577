#!/usr/bin/env bash
# Fills .gpu (ignored through .git/info/exclude) with what benchmarks/gpu_overlap.sh needs on a GPU
# machine that has Python 3.12, torch and transformers but no network: cp312 wheels of pydantic and
# ALFWorld's dependencies, jericho and fast_downward from .venv, the ALFWorld games, and a
# full-history ALFWorld model folder's tokenizer and prompt (MODEL, e.g. a seed's model-init from
# `make alfworld-cpu-full`). The tracked tree's seed results are too large to carry: see gpu_overlap.sh.
#   MODEL=runs/alfworld-cpu-full/seed4/model-init bash benchmarks/gpu_overlap_prepare.sh
set -eu
MODEL=${MODEL:?a full-history ALFWorld model folder}
SP=.venv/lib/python3.11/site-packages
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl
for p in alfworld==0.4.2 textworld==1.7.0 mementos==1.3.1 tatsu==5.8.3 termcolor prompt_toolkit hashids \
        more_itertools wcwidth pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection peft==0.21.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
        -d .gpu/whl "$p"
done
tar -C $SP -cJf .gpu/libs.tar.xz jericho fast_downward
cp ../shared/data/alfworld/alfworld_json_2.1.1_slim.tar.xz .gpu/
mkdir .gpu/alf-full-model && cp "$MODEL"/* .gpu/alf-full-model/ && rm -f .gpu/alf-full-model/model.safetensors
du -sh .gpu/* | sort -h
