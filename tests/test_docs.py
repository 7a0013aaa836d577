"""The documentation site: it builds with warnings as errors, its reference pages are the code's,
and the code in its guides runs (Python), parses (every `agentrl` command line, with the flags the
CLI has and recipe files that exist), names real make targets, and validates (recipe YAML)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.cli import build_parser
from agentrl.config import Section
from agentrl.recipe import validate_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))

from gen_reference import UndocumentedField, main as gen_reference, section_rows  # noqa: E402

PAGES = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)
RUN_BY_OTHER_TESTS = {"# my_plugin.py", "# step_cost.py", "# my_recipe.yaml"}  # tests/test_plugins.py


def blocks(language: str) -> list[tuple[str, str]]:
    return [(page.relative_to(DOCS).as_posix(), m.group(2)) for page in PAGES
            for m in BLOCK.finditer(page.read_text()) if m.group(1) == language]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d",
                           str(site)], capture_output=True, text=True, env=env)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmarks" / "results" / "demo-overview.png").is_file()  # the hook's figures


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "benchmarks" / "results").mkdir(parents=True)
    with (copy / "docs" / "concepts.md").open("a") as f:
        f.write("\nSee [the missing page](guides/missing.md).\n")
    done = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stdout + done.stderr


def test_the_reference_pages_are_generated_from_the_code(tmp_path):
    assert gen_reference(["--check"]) == 0, "run python docs/gen_reference.py"
    assert gen_reference(["--out", str(tmp_path)]) == 0
    config = (tmp_path / "config.md").read_text()
    for field in ("rl.tis_cap", "rl.env_pool.workers", "sft.pack_prefixes"):  # nested sections, by path
        assert f"| `{field}` |" in config
    assert "| `step_weight` | float | `1.0` |" in config  # GiGPO's own section, beside its implementation
    assert "agentrl.advantages.gigpo" in config
    cli = (tmp_path / "cli.md").read_text()
    assert "## agentrl compare" in cli and "`--runs`" in cli
    registry = (tmp_path / "registry.md").read_text()
    assert "| `gigpo` | `GiGPOConfig` | `agentrl.advantages.gigpo` |" in registry
    (tmp_path / "cli.md").write_text(cli.replace("## agentrl compare", "## agentrl kompare"))
    assert gen_reference(["--check", "--out", str(tmp_path)]) == 1  # a stale page is seen


def test_the_reference_lists_built_ins_only_whatever_plugins_are_loaded(tmp_path):
    from typing import Literal

    from agentrl.registry import ADVANTAGES

    class StrayConfig(Section):
        type: Literal["stray"] = "stray"

    ADVANTAGES.register("stray", StrayConfig, target=lambda trajectories, config: None)
    try:
        assert gen_reference(["--check"]) == 0  # an undocumented plugin changes nothing
    finally:
        ADVANTAGES._entries.pop("stray")


def test_a_field_without_a_docstring_is_refused():
    class Documented(Section):
        a: int = 1
        """Documented."""

    class Undocumented(Documented):
        b: int = 2

    assert len(section_rows(Documented, "x.")[0]) == 1
    with pytest.raises(UndocumentedField, match="Undocumented.b"):
        section_rows(Undocumented, "x.")


def _command_lines(code: str) -> list[list[str]]:
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split("  #")[0].split(" # ")[0].strip()
        if line and not line.startswith("#"):
            lines.append(shlex.split(line.removeprefix("$ ")))
    return lines


def _agentrl_args(words: list[str]) -> list[str] | None:
    """The arguments after `agentrl` on a command line (also under torchrun / accelerate launch)."""
    for i, word in enumerate(words):
        if word == "agentrl" or word.endswith("/bin/agentrl"):
            return words[i + 1:]
    return None


@pytest.mark.parametrize("page, code", blocks("bash") + blocks(""), ids=lambda x: x if x.endswith(".md") else "")
def test_every_command_in_the_guides_exists(page, code):
    targets = set(re.findall(r"^([a-z][a-z.-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for words in _command_lines(code):
        if words[0] == "make":
            assert words[1] in targets, f"{page}: make {words[1]} is not a target"
            continue
        args = _agentrl_args(words)
        if args is None:
            continue
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{page}: `agentrl {' '.join(args)}` does not parse")
        for word in args:
            if word.startswith("recipes/") and word.endswith(".yaml"):
                assert (ROOT / word).is_file(), f"{page}: {word} does not exist"


@pytest.mark.parametrize("page, code", [b for b in blocks("yaml") if b[1].splitlines()[0] not in RUN_BY_OTHER_TESTS],
                         ids=lambda x: x if x.endswith(".md") else "")
def test_every_recipe_fragment_in_the_guides_validates(page, code):
    validate_config(yaml.safe_load(code), source=page)


def test_every_python_block_of_the_guides_is_run_by_a_test():
    unrun = [(page, code.splitlines()[0]) for page, code in blocks("python")
             if code.splitlines()[0] not in RUN_BY_OTHER_TESTS and page != "guides/python-api.md"]
    assert not unrun, f"python blocks no test runs: {unrun}"


def test_the_python_api_guide_runs_as_written(tmp_path, tiny_model_dir):
    """The guide's block, run in a folder where recipes/demo.yaml is a small recipe and
    runs/demo/sft/model a tiny model: the code is the guide's, only the sizes are smaller."""
    (code,) = [code for page, code in blocks("python") if page == "guides/python-api.md"]
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "demo.yaml").write_text(yaml.safe_dump({
        "run_dir": "runs/demo", "prompt": {"history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "rl": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "mini_batch_size": 8, "save_rollouts": 0},
        "eval": {"episodes": 2, "splits": ["l0"]}}))
    shutil.copytree(tiny_model_dir, tmp_path / "runs" / "demo" / "sft" / "model")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'rollout/success'" in done.stdout  # train_step's metrics
    assert (tmp_path / "runs" / "api" / "rl" / "checkpoints").is_dir()
