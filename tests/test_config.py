import copy
from pathlib import Path

import pytest
import yaml

from agentrl.config import ConfigError
from agentrl.recipe import config_yaml, load_config, save_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.stpes: Extra inputs are not permitted"):
        load_config(write(tmp_path, "rl:\n  stpes: 3\n"))


def test_unknown_estimator_lists_valid_names(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.advantage: .*unknown advantage estimator 'nope'; registered: .*grpo"):
        load_config(write(tmp_path, "rl:\n  advantage:\n    type: nope\n"))


def test_wrong_type_and_range(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.group_size: Input should be greater than or equal to 1"):
        load_config(write(tmp_path, "rl:\n  group_size: 0\n"))
    with pytest.raises(ConfigError, match=r"env\.difficulty"):
        load_config(write(tmp_path, "env:\n  type: household\n  difficulty: impossible\n"))
    with pytest.raises(ConfigError, match=r"env: .*'webshop'; registered: .*household"):
        load_config(write(tmp_path, "env:\n  type: webshop\n"))


def test_retries_are_refused_where_nothing_would_retry():
    """DAgger's moves are played as sampled (the expert labels where an inadmissible one leads) and
    a judgment names no action: a retries setting there would do nothing, so it is an error."""
    with pytest.raises(ConfigError, match=r"sft\.dagger\.sampling\.retries: Input should be 0"):
        validate_config({"sft": {"dagger": {"sampling": {"retries": 2}}}})
    with pytest.raises(ConfigError, match=r"rl\.aux\.0\.sampling\.retries: Input should be 0"):
        validate_config({"rl": {"aux": [{"type": "gcd", "sampling": {"retries": 2}}]}})
    validate_config({"sft": {"dagger": {"sampling": {"retries": 0}}}, "eval": {"sampling": {"retries": 2}}})


def test_bad_template_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match=r"prompt\.template.*placeholders"):
        load_config(write(tmp_path, "prompt:\n  template: 'hi {nope}'\n"))
    with pytest.raises(ConfigError, match=r"prompt\.turn_template.*placeholders.*'nope'"):
        load_config(write(tmp_path, "prompt:\n  full_history: true\n  history_length: 0\n  turn_template: '{nope}'\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="YAML mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_a_sections_own_defaults_hold_when_a_recipe_sets_another_of_its_fields():
    """SFT's optimiser defaults to lr 1e-5 (RL's to 1e-6: an SFT at that rate barely moves a cold
    start) and GCD's judgments to 96 new tokens (48 cut the testbed's critiques), also when a recipe
    sets another field of the section (both fell to the base class's default then)."""
    config = validate_config({"sft": {}, "rl": {}})
    assert (config.sft.optim.lr, config.rl.optim.lr) == (1e-5, 1e-6)
    assert validate_config({"sft": {"optim": {"warmup_steps": 5}}}).sft.optim.lr == 1e-5
    for sampling in ({}, {"temperature": 0.7}):
        aux = validate_config({"rl": {"aux": [{"type": "gcd", "sampling": sampling}]}}).rl.aux[0]
        assert aux.sampling.max_new_tokens == 96
    assert validate_config({"rl": {"aux": [{"type": "gcd"}]}}).rl.aux[0].sampling.max_new_tokens == 96


def test_a_parent_section_built_in_python_reads_as_the_fields_it_set():
    """A field typed with a subclass (SFT's optimiser, evaluation's play sampling, GCD's judgment
    sampling) takes an instance of the parent section built in Python, read as a recipe's mapping
    of the fields it set: what it set holds, the subclass's own defaults fill the rest, and what
    the subclass refuses is refused."""
    from pydantic import ValidationError

    from agentrl.config import EvalConfig, OptimConfig, SamplingConfig, SFTConfig
    from agentrl.gcd.loss import GCDAuxConfig

    assert SFTConfig(optim=OptimConfig(lr=0.01)).optim.lr == 0.01
    assert SFTConfig(optim=OptimConfig(warmup_steps=5)).optim == SFTConfig(optim={"warmup_steps": 5}).optim
    assert SFTConfig(optim=OptimConfig(warmup_steps=5)).optim.lr == 1e-5
    play = EvalConfig(sampling=SamplingConfig(top_p=0.9)).sampling
    assert (play.temperature, play.top_p) == (0.4, 0.9)
    assert EvalConfig(sampling=SamplingConfig(temperature=0.0)).sampling.temperature == 0.0
    judging = GCDAuxConfig(sampling=SamplingConfig(temperature=0.7)).sampling
    assert (judging.temperature, judging.max_new_tokens) == (0.7, 96)
    with pytest.raises(ValidationError, match="retries"):
        GCDAuxConfig(sampling=SamplingConfig(retries=2))


def test_a_config_built_in_python_from_section_objects():
    """The Python API: sections made with a registry's `make` (or taken from another config) are
    accepted where the recipe's mappings are, and resolve to the same settings."""
    from agentrl.config import Config, RLConfig, SFTConfig
    from agentrl.registry import ACTORS, ADVANTAGES

    rl = RLConfig(advantage=ADVANTAGES.make("gigpo", step_weight=0.5), actor=ACTORS.make("single"))
    config = Config(rl=rl, sft=SFTConfig(actor=rl.actor))
    assert config == validate_config({"rl": {"advantage": {"type": "gigpo", "step_weight": 0.5}}, "sft": {"actor": {}}})
    assert config.rl.advantage.step_weight == 0.5 and config.sft.actor.backend == "single"


def test_an_older_recipes_nthr_and_coupling_hook_in_where_they_ran_before_they_moved():
    """Before NTHR and the coupling lab became components the trainer hooked them in before the
    recipe's `rl.components`: an older recipe's `rl.nthr` and `rl.coupling_*` are read as components
    placed first, every setting carried over."""
    rl = validate_config({"rl": {"coupling_every": 3, "coupling_pairs": 4, "coupling_lr": 0.01,
                                 "components": [{"type": "nthr", "tau": 2.0}]}}).rl
    assert [(c.type, c.every, c.pairs, c.lr) for c in rl.components[:1]] == [("coupling", 3, 4, 0.01)]
    assert [(c.type, c.tau) for c in rl.components[1:]] == [("nthr", 2.0)]
    rl = validate_config({"rl": {"nthr": {"tau": 3.0}, "components": [{"type": "coupling", "every": 5}]}}).rl
    assert [c.type for c in rl.components] == ["nthr", "coupling"] and rl.components[0].tau == 3.0


def test_setting_one_field_of_the_evaluation_sampling_keeps_its_other_defaults(tmp_path):
    config = load_config(ROOT / "recipes" / "demo.yaml", ["eval.sampling={retries: 2}"])
    assert (config.eval.sampling.temperature, config.eval.sampling.retries) == (0.4, 2)


def test_overrides_and_round_trip(tmp_path):
    config = load_config(write(tmp_path, "rl:\n  steps: 3\n"), ["rl.steps=5", "rl.optim.lr=0.001", "seed=7"])
    assert config.rl.steps == 5 and config.rl.optim.lr == 0.001 and config.seed == 7
    save_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(write(tmp_path, "{}"), ["rl.steps"])


def test_every_recipe_loads():
    from pathlib import Path
    recipes = sorted(Path(__file__).parents[1].joinpath("recipes").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        load_config(recipe)
    assert validate_config({}).rl is None


def test_filter_groups_needs_groups_of_two():
    validate_config({"rl": {"group_size": 2, "rollout": {"filter_groups": {}}}})
    with pytest.raises(ConfigError, match=r"rl\.rollout\.filter_groups .* needs rl\.group_size >= 2"):
        validate_config({"rl": {"group_size": 1, "rollout": {"filter_groups": {"max_draws": 2}}}})


def test_the_samplers_old_share_prefill_is_read_as_share_prefixes():
    assert not validate_config({"rl": {"sampler": {"type": "hf", "share_prefill": False}}}).rl.sampler.share_prefixes
    assert validate_config({"rl": {"sampler": {"type": "hf"}}}).rl.sampler.share_prefixes


def test_sharded_actor_with_vllm_refuses_what_needs_a_full_policy_copy():
    base = {"rl": {"actor": {"backend": "fsdp2"}, "sampler": {"type": "vllm"}}}
    validate_config(base)  # fine on its own
    with pytest.raises(ConfigError, match=r"rl\.components\[0\] \(nthr\) needs actor\.backend: single when sampler\.type is vllm"):
        validate_config({"rl": {**base["rl"], "components": [{"type": "nthr"}]}})
    with pytest.raises(ConfigError, match=r"rl\.components\[0\] \(coupling\) needs actor\.backend: single"):
        validate_config({"rl": {**base["rl"], "coupling_every": 2}})  # the key from before, read as the component
    with pytest.raises(ConfigError, match=r"rl\.advantage: the ppo critic runs in one process only"):
        validate_config({"rl": {"actor": {"backend": "fsdp2"}, "advantage": {"type": "ppo"}}})
    with pytest.raises(ConfigError, match=r"rl\.aux\[0\]: the GCD classifier head runs in one process only"):
        validate_config({"rl": {"actor": {"backend": "zero3"}, "aux": [{"type": "gcd", "judge": "classifier"}]}})
    validate_config({"rl": {"actor": {"backend": "zero3"}, "aux": [{"type": "gcd"}]}})  # the generative judge shards
    with pytest.raises(ConfigError, match=r"rl\.sampler\.kv_cache_gib: Input should be greater than 0"):
        validate_config({"rl": {"sampler": {"type": "vllm", "kv_cache_gib": 0}}})


def test_an_option_of_another_variant_is_an_error():
    with pytest.raises(ConfigError, match=r"rl\.sampler\.kv_cache_gib: Extra inputs are not permitted"):
        validate_config({"rl": {"sampler": {"type": "hf", "kv_cache_gib": 1}}})
    with pytest.raises(ConfigError, match=r"rl\.actor\.cpu_offload: Extra inputs are not permitted"):
        validate_config({"rl": {"actor": {"backend": "single", "cpu_offload": True}}})
    with pytest.raises(ConfigError, match=r"rl\.aux\.0: .*needs a `type`: one of chat_sft, gcd"):
        validate_config({"rl": {"aux": [{"name": "x"}]}})
    with pytest.raises(ConfigError, match=r"rl\.kl_estimator: .*'k9'; registered: k1, k2, k3"):
        validate_config({"rl": {"kl_estimator": "k9"}})


def config_classes():
    """Every config class a recipe can reach: Config's fields, nested, and every registry entry's."""
    import typing

    from pydantic import BaseModel

    from agentrl import registry

    found, todo = [], [validate_config({}).__class__]
    for axis in (registry.ENVIRONMENTS, registry.ADVANTAGES, registry.POLICY_LOSSES, registry.AUX_LOSSES,
                 registry.SAMPLERS, registry.ACTORS):
        todo += [axis.entry(name).config for name in axis.names() if axis.entry(name).config is not None]
    while todo:
        cls = todo.pop()
        if cls in found or not cls.__module__.startswith("agentrl"):
            continue
        found.append(cls)
        for field in cls.model_fields.values():
            stack = [field.annotation]
            while stack:
                t = stack.pop()
                stack += typing.get_args(t)
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
    return found


def test_every_config_field_is_documented():
    classes = config_classes()
    assert len(classes) > 25
    undocumented = [f"{c.__name__}.{name}" for c in classes for name, f in c.model_fields.items() if not f.description]
    assert undocumented == []


def test_the_default_sections_are_the_built_in_entries_beside_their_implementations():
    config = validate_config({"rl": {}, "sft": {}})
    where = {"env": (config.env, "agentrl.envs.household.env"),
             "rl.advantage": (config.rl.advantage, "agentrl.advantages.grpo"),
             "rl.loss": (config.rl.loss, "agentrl.losses.policy"),
             "rl.actor": (config.rl.actor, "agentrl.actor"), "sft.actor": (config.sft.actor, "agentrl.actor"),
             "rl.sampler": (config.rl.sampler, "agentrl.sampler")}
    for field, (section, module) in where.items():
        assert type(section).__module__ == module, field
    assert (config.env.type, config.rl.advantage.type, config.rl.loss.type, config.rl.actor.backend,
            config.rl.sampler.type) == ("household", "grpo", "ppo_clip", "single", "hf")
    latency = validate_config({"env": {"type": "latency"}}).env
    assert latency.inner.type == "household"


SAVED = Path(__file__).resolve().parent / "data" / "saved-configs"
ADDED_SINCE = {  # (section, its type or None for any, field): fields added after these files were saved, at their defaults
    ("eval", None, "initial"): True, ("eval", None, "batch_size"): None, ("init", None, "corpus"): None,
    ("env", "scienceworld", "gold_path"): True, ("env", "scienceworld", "train_task_types"): None,
    ("env", "scienceworld", "expert_teleports"): False, ("env", "scienceworld", "memory"): False,
    ("env", "scienceworld", "reject_unparsed"): False, ("env", "scienceworld", "failure_penalty"): True,
    ("prompt", None, "full_history"): False,
    ("prompt", None, "turn_template"): "Observation: {observation}\nAdmissible actions: {actions}",
    ("rl", None, "mini_batch_order"): "shuffled", ("rl.rollout", None, "filter_groups"): None,
    ("rl.sampler", "hf", "keep_cache_mib"): None, ("rl", None, "overlap"): None,
    ("env", "alfworld", "grouped_actions"): False, ("env", "alfworld", "memory"): False, ("sft", None, "dagger"): None,
    ("sampling", None, "retries"): 0, ("eval.sampling", None, "retries"): 0, ("rl.aux.0.sampling", None, "retries"): 0,
    ("sft.dagger", None, "sampling"): {"temperature": 0.4, "top_p": 1.0, "max_new_tokens": 48, "retries": 0},
    ("rl", None, "balance_task_types"): False, ("rl", None, "train_task_types"): None,
    ("init", None, "context_length"): 4096, ("env", "latency", "expert_median_s"): 0.0,
}
RECIPE_SETS_SINCE = {"demo.yaml": {("rl", "mini_batch_order"): "grouped"}}  # an added field a recipe sets
VARIANTS = {  # demo-NAME.yaml: recipes/demo.yaml with these overrides
    "gcd-external": ["rl.aux=[{type: gcd, labels: [rules, llm], external: {base_url: 'http://127.0.0.1:9/v1', "
                     "model: m}, correction: {every: 5}}, {type: chat_sft, data: x.jsonl}]"],
    "variants": ["env={type: latency, inner: {type: testbed}}", "rl.env_pool={backend: ray, workers: 2}",
                 "rl.actor={backend: fsdp2, lora: {r: 4}}", "rl.sampler={type: vllm, kv_cache_gib: 1}",
                 "rl.loss={type: seq_ratio}", "rl.advantage={type: gagpo}"],
    "ppo-nthr": ["rl.advantage={type: ppo}", "rl.nthr={tau: 1.0}", "env={type: scienceworld}",
                 "sft.actor={backend: zero3}"],
}


def _settings(config, recipe_sets: dict | None = None) -> dict:
    data = yaml.safe_load(config_yaml(config))
    for (path, kind, field), default in ADDED_SINCE.items():
        section = data
        for key in path.split("."):  # a dotted path into nested sections; a list's item by index
            section = section[int(key)] if isinstance(section, list) and key.isdigit() and int(key) < len(section) \
                else section.get(key) if isinstance(section, dict) else None
        if section is not None and kind in (None, section.get("type")):  # a section the recipe has
            assert section.pop(field) == (recipe_sets or {}).get((path, field), default)
    return data


@pytest.mark.parametrize("saved", sorted(SAVED.glob("*.yaml")), ids=lambda p: p.stem)
def test_recipes_and_saved_configs_load_as_before_the_built_ins_moved(saved):
    """config.yaml files written by the code before each built-in's config class moved beside its
    implementation (commit c7bbcd7: every recipe, and variants of every axis): the same recipe and
    overrides resolve to the same settings now (so no default moved), and the saved file loads into
    them (so saved runs rerun)."""
    before = yaml.safe_load(saved.read_text())
    name = saved.stem.removeprefix("demo-")
    recipe, overrides = (ROOT / "recipes" / "demo.yaml", VARIANTS[name]) if name in VARIANTS else \
        (ROOT / "recipes" / saved.name, [])
    assert _settings(load_config(recipe, overrides), RECIPE_SETS_SINCE.get(recipe.name)) == \
        _changed_defaults(saved.stem, _components_moved(before))
    assert _settings(load_config(saved)) == _components_moved(before)  # a saved run keeps what it ran with


def _components_moved(settings: dict) -> dict:
    """The settings as they read since NTHR and the coupling lab became components (rl.components):
    the files hold `rl.nthr` (one of them set) and the lab's `rl.coupling_*` at 0 (off); and since
    `rl.sampler.share_prefill` became `share_prefixes`."""
    settings = copy.deepcopy(settings)
    rl = settings["rl"]
    if "share_prefill" in rl["sampler"]:
        rl["sampler"]["share_prefixes"] = rl["sampler"].pop("share_prefill")
    assert (rl.pop("coupling_every"), rl.pop("coupling_pairs"), rl.pop("coupling_lr")) == (0, 8, 0.001)
    nthr = rl.pop("nthr")
    rl["components"] = [{"type": "nthr", **nthr}] if nthr else []
    return settings


def _changed_defaults(name: str, settings: dict) -> dict:
    """The settings a recipe gets now where a default it relies on changed on purpose since the files
    were saved: GCD's judgment sampling max_new_tokens 48 -> 96 (48 cut the testbed's longer
    judgments); recipes/gcd.yaml sets its own."""
    settings = copy.deepcopy(settings)
    if name == "demo-gcd-external":
        settings["rl"]["aux"][0]["sampling"]["max_new_tokens"] = 96
    return settings


@pytest.mark.parametrize("refused,accepted,message", [
    ({"rl": {"actor": {"backend": "fsdp2"}, "overlap": {}}}, {"rl": {"overlap": {}}},
     r"rl\.overlap runs the sampler beside a single-process actor for now: it needs rl\.actor\.backend: single"),
    ({"rl": {"tis_cap": 2.0}}, {"rl": {"tis_cap": 2.0, "old_logprobs": "actor"}},
     r"rl\.tis_cap weights by p_actor / p_sampler: it needs rl\.old_logprobs: actor"),
    ({"rl": {"actor": {"backend": "fsdp2", "lora": {}}, "sampler": {"type": "vllm"}, "kl_coef": 0.1}},
     {"rl": {"actor": {"backend": "fsdp2", "lora": {}}, "sampler": {"type": "vllm"}, "kl_coef": 0.0}},
     r"rl\.actor\.lora with rl\.kl_coef needs actor\.backend: single when sampler\.type is vllm"),
    ({"env": {"type": "scienceworld"}, "sft": {"judgments": 2}},
     {"env": {"type": "scienceworld", "valid_actions": True}, "sft": {"judgments": 2}},
     r"sft\.judgments plays random valid actions: it needs env\.valid_actions: true"),
    ({"prompt": {"full_history": True}, "sft": {"judgments": 2}}, {"sft": {"judgments": 2}},
     r"sft\.judgments reads a step's prompt as text: not yet with prompt\.full_history"),
])
def test_a_setting_without_the_one_it_needs_is_refused_by_name(refused, accepted, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(refused)
    validate_config(accepted)
