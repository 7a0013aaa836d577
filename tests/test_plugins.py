"""The plugins guide's worked example (docs/guides/plugins.md), run exactly as written: a user's environment and estimator in a
file outside the package, through `agentrl run --import`, the saved config, a changed setting,
and `agentrl compare`. Plus the registries' own rules."""

import json
import re
import shlex
from pathlib import Path

import pytest
from pydantic import BaseModel

from agentrl.cli import main
from agentrl.config import ConfigError
from agentrl.recipe import load_config
from agentrl.registry import ADVANTAGES, PluginError

ROOT = Path(__file__).resolve().parents[1]


GUIDE = ROOT / "docs" / "guides" / "plugins.md"


def guide_block(language: str, start: str) -> str:
    """The plugins guide's code block in `language` whose first line starts with `start`."""
    text = GUIDE.read_text()
    match = re.search(rf"```{language}\n({re.escape(start)}.*?)```", text, re.DOTALL)
    assert match, f"{GUIDE} has no {language} block starting with {start!r}"
    return match.group(1)


def guide_commands() -> list[list[str]]:
    """The commands of the example's shell block (continuation lines joined, comments dropped)."""
    block = guide_block("bash", "agentrl run my_recipe.yaml --import my_plugin.py").replace("\\\n", " ")
    return [shlex.split(line.split("  #")[0]) for line in block.splitlines() if line.strip()]


def test_the_guides_plugin_example_end_to_end(tmp_path, monkeypatch, capsys):
    user = tmp_path / "user"  # outside the package
    user.mkdir()
    (user / "my_plugin.py").write_text(guide_block("python", "# my_plugin.py"))
    (user / "my_recipe.yaml").write_text(guide_block("yaml", "# my_recipe.yaml"))
    monkeypatch.chdir(user)
    first, saved, changed, compare = guide_commands()
    run = user / "runs" / "guess"

    assert main(first[1:]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["phases"]) == ["initial", "sft", "rl"]
    config = load_config(run / "config.yaml")
    assert config.imports == [str(user / "my_plugin.py")] and config.rl.advantage.type == "loo_median"
    assert config.model.path == "runs/guess/model-init"  # the tiny model follows run_dir
    rows = [json.loads(line) for line in (run / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the post-SFT evaluation
    assert rows[0]["eval/l0/success"] == summary["phases"]["sft"]["l0"]["success"]
    capsys.readouterr()

    sft_stamp = (run / "sft" / "model" / "model.safetensors").stat().st_mtime_ns
    assert main(saved[1:]) == 0  # the saved config.yaml: nothing redone
    out = capsys.readouterr().out
    for phase in ("init", "eval initial", "expert data", "sft", "eval sft", "eval rl"):
        assert f"phase {phase}: done earlier with the same settings, reused" in out, out
    assert (run / "sft" / "model" / "model.safetensors").stat().st_mtime_ns == sft_stamp

    assert main(changed[1:]) == 0  # one SFT setting changed: SFT and everything after it redone
    out = capsys.readouterr().out
    for phase in ("init", "eval initial", "expert data"):
        assert f"phase {phase}: done earlier with the same settings, reused" in out, out
    assert "phase sft: settings changed (sft.epochs: 2 -> 3), redoing" in out, out
    for phase in ("eval sft", "rl", "eval rl"):
        assert re.search(rf"phase {phase}: settings changed \(.*sft", out), out
    new_sft = (run / "sft" / "model" / "model.safetensors").stat().st_mtime_ns
    assert new_sft != sft_stamp
    assert load_config(run / "config.yaml").sft.epochs == 3
    # RL started over from the new SFT model: nothing under rl/ is older than it, and its steps ran anew
    rl_files = [p for p in (run / "rl").rglob("*") if p.is_file()]
    assert rl_files and all(p.stat().st_mtime_ns >= new_sft for p in rl_files)
    rows = [json.loads(line) for line in (run / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]

    assert compare[:2] == ["agentrl", "compare"]
    assert main(compare[1:]) == 0
    summary = json.loads((user / "runs" / "guess-compare" / "summary.json").read_text())
    assert list(summary["methods"]) == ["grpo", "loo_median"]
    assert all(len(m["l0"]["per_seed"]) == 2 for m in summary["methods"].values())
    assert summary["pairs"]["grpo - loo_median"]["seeds"] == [1, 2]
    variant = load_config(user / "runs" / "guess-compare" / "loo_median" / "seed1" / "config.yaml")
    assert variant.rl.advantage.type == "loo_median"


def test_plugin_errors_are_one_line_user_errors(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rl:\n  advantage: {type: loo_mean}\n")
    assert main(["run", str(recipe), "--import", str(tmp_path / "missing.py")]) == 2
    assert "plugin file" in capsys.readouterr().err
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('oops')\n")
    assert main(["run", str(recipe), "--import", str(broken)]) == 2
    assert "broken_plugin.py: RuntimeError: oops" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"rl\.advantage: .*'loo_mean'; registered: .*grpo.*rloo"):
        load_config(recipe)


def test_registering_a_name_twice_or_without_its_type_field_is_an_error():
    from typing import Literal

    from agentrl.config import Section

    with pytest.raises(PluginError, match="'grpo' is registered twice"):
        ADVANTAGES.register("grpo", target=lambda trajectories, config: None)

    class Untyped(BaseModel):
        x: int = 1

    with pytest.raises(PluginError, match=r"needs the field `type: Literal\['mine'\] = 'mine'`"):
        ADVANTAGES.register("mine", Untyped)

    class Mine(Section):
        type: Literal["mine_ok"] = "mine_ok"

    ADVANTAGES.register("mine_ok", Mine, target=lambda trajectories, config: None)
    assert "mine_ok" in ADVANTAGES.names()




def test_a_plugin_component_and_train_resume_against_changed_plugin_code(tmp_path, tiny_model_dir, capsys):
    """The plugins guide's component, from a user file, hooks into the step; `agentrl train` into a folder with
    checkpoints needs --resume or --overwrite, and refuses to resume once the plugin's code changed."""
    from conftest import COMPACT

    plugin = tmp_path / "step_cost.py"
    code = guide_block("python", "# step_cost.py")
    plugin.write_text(code)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({
        "imports": ["step_cost.py"], "run_dir": str(tmp_path / "run"), "env": {"type": "household", "max_steps": 4},
        "prompt": {"template": COMPACT, "history_length": 1}, "sampling": {"max_new_tokens": 6},
        "rl": {"steps": 1, "tasks_per_step": 1, "group_size": 2, "components": [{"type": "step_cost", "cost": 0.5}]},
        "eval": {"episodes": 1, "splits": ["l0"]}}))
    train = ["train", str(recipe), "--model", str(tiny_model_dir)]
    assert main(train) == 0
    [row] = [json.loads(line) for line in (tmp_path / "run" / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert row["step_cost/charged"] == pytest.approx(0.5 * 2 * row["rollout/length"])
    capsys.readouterr()

    assert main(train) == 2
    assert "add --resume to continue that run or --overwrite" in capsys.readouterr().err
    assert main([*train, "--resume", "--set", "rl.optim.lr=0.5"]) == 2  # a setting changed: not resumed
    assert "trained with other settings (rl.optim.lr: " in capsys.readouterr().err
    plugin.write_text(code.replace("cost: float = 0.1", "cost: float = 0.2"))
    assert main([*train, "--resume", "--set", "rl.steps=2"]) == 2
    err = capsys.readouterr().err
    assert f"plugin {plugin}:" in err and "--overwrite starts over" in err and "Traceback" not in err
    assert main([*train, "--overwrite", "--set", "rl.steps=2"]) == 0
    rows = (tmp_path / "run" / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in rows] == [1, 2]
    assert main([*train, "--overwrite"]) == 0  # a shorter run over a longer one: nothing of the old is left
    assert sorted(p.name for p in (tmp_path / "run" / "rl" / "checkpoints").iterdir()) == ["step_000001"]

    with pytest.raises(ConfigError, match="trainer component 'step_costs'; registered: coupling, nthr, step_cost"):
        load_config(recipe, ["rl.components=[{type: step_costs}]"])
    with pytest.raises(ConfigError, match="trainer component 'kl_reference' is built for every run from the run's settings"):
        load_config(recipe, ["rl.components=[{type: kl_reference}]"])  # registered like a plugin, always on


def test_a_plugin_packages_every_module_is_part_of_its_fingerprint(tmp_path, monkeypatch):
    """An edit anywhere in an imported plugin package, a subpackage's module included, changes the
    settings its phases were made with."""
    from agentrl.provenance import plugin_fingerprints
    from agentrl.recipe import validate_config

    (tmp_path / "mypkg" / "sub").mkdir(parents=True)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "sub" / "estimator.py").write_text("GAMMA = 0.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = validate_config({"imports": ["mypkg"]})
    before = plugin_fingerprints(config)["plugin mypkg"]
    (tmp_path / "mypkg" / "sub" / "estimator.py").write_text("GAMMA = 0.8\n")
    assert plugin_fingerprints(config)["plugin mypkg"] != before


def test_an_installed_plugin_packages_version_is_part_of_the_settings(tmp_path, monkeypatch):
    """A plugin installed as a package (an `agentrl.plugins` entry point) is recorded by name and
    version: upgrading it changes the settings its phases were made with."""
    from agentrl.provenance import plugin_fingerprints
    from agentrl.recipe import validate_config

    def installed(version: str) -> dict:
        site = tmp_path / version
        info = site / f"myplug-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: myplug\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("[agentrl.plugins]\nmyplug = myplug_module\n")
        with monkeypatch.context() as patch:
            patch.syspath_prepend(str(site))
            return plugin_fingerprints(validate_config({}))

    assert installed("1.0")["plugin myplug_module"] == "myplug 1.0"
    assert installed("1.1")["plugin myplug_module"] == "myplug 1.1"


def test_a_plugin_file_whose_module_name_is_taken_and_a_broken_entry_point_are_errors(tmp_path, monkeypatch):
    """Two plugin files of one name would be one module (the second silently never imported), and
    an installed entry point that cannot load would leave its methods missing: both are refused."""
    import sys

    from agentrl import registry

    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same_stem_plugin.py").write_text("LOADED = True\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    first = tmp_path / "one" / "same_stem_plugin.py"
    try:
        assert registry.load_plugin(str(first)) == str(first)
        assert registry.load_plugin(str(first)) == str(first)  # the same file again: already loaded, fine
        with pytest.raises(PluginError, match="a module named 'same_stem_plugin' is already imported from .*one"):
            registry.load_plugin(str(tmp_path / "two" / "same_stem_plugin.py"))
    finally:
        sys.modules.pop("same_stem_plugin", None)

    info = tmp_path / "site" / "brokenplug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[agentrl.plugins]\nbrokenplug = no_such_module_for_agentrl\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    with pytest.raises(PluginError, match=r"plugin entry point brokenplug \(no_such_module_for_agentrl\): No module"):
        registry.load_entry_points()

