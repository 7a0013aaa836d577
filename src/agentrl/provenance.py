"""Run provenance: every pipeline phase records the settings it depended on, and a rerun reuses a
phase's output only when they are the same.

A phase's settings are flat `dotted.key -> value` pairs taken from the config, plus a hash of
each plugin's source, plus those of the phases it builds on, so a change anywhere upstream reaches every phase after it, and the line
that says why a phase is redone can name the fields that changed. They are kept in
`<run_dir>/phases.json`, written (atomically) after each phase completes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

from agentrl.config import Config
from agentrl.files import write_atomic
from agentrl.prompting import DEFAULT_TURN_TEMPLATE
from agentrl.progress import set_stage
from agentrl.registry import ENTRY_POINT_GROUP


def flatten(data, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, object] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_settings(config: Config, *paths: str, exclude: tuple[str, ...] = ()) -> dict[str, object]:
    """The config's values under `paths` (top-level or dotted sections), flattened."""
    dumped = flatten(config.model_dump(mode="json"))
    return {k: v for k, v in dumped.items()
            if any(k == p or k.startswith(p + ".") for p in paths) and not any(
                k == e or k.startswith(e + ".") for e in exclude)}


def folder_fingerprint(path: str | Path) -> str | None:
    """A short hash of a local folder's file names, sizes and modification times (None for a
    hub id or a missing path): a model replaced in place is a different model."""
    path = Path(path)
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def plugin_fingerprints(config: Config) -> dict[str, str]:
    """`plugin <spec>` -> a short hash of the source of each of the run's imports (a package: all
    its .py files), and the version of each installed `agentrl.plugins` package: a researcher's
    edited environment or estimator is a changed setting like any other."""
    out = {}
    for spec in config.imports:
        if spec.endswith(".py"):
            files = [Path(spec)]
        else:
            module = sys.modules.get(spec) or importlib.import_module(spec)
            source = Path(module.__file__)
            files = sorted(source.parent.rglob("*.py")) if source.name == "__init__.py" else [source]
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.read_bytes())
        out[f"plugin {spec}"] = digest.hexdigest()[:16]
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        out[f"plugin {point.value}"] = f"{point.dist.name} {point.dist.version}" if point.dist else "installed"
    return out


OLD_BEHAVIOUR = {"rl.mini_batch_order": "shuffled", "env.memory": False, "env.expert_teleports": False,
                 "env.reject_unparsed": False, "env.failure_penalty": True, "prompt.full_history": False,
                 "prompt.turn_template": DEFAULT_TURN_TEMPLATE,
                 "rl.coupling_every": 0, "rl.coupling_pairs": 8, "rl.coupling_lr": 0.001,
                 "rl.balance_task_types": False, "init.context_length": 4096, "env.expert_median_s": 0.0}
OLD_BEHAVIOUR |= {f"dagger.{k}": v for k, v in OLD_BEHAVIOUR.items() if k.startswith(("env.", "prompt."))}
"""Settings added since runs were first recorded whose default is not None, each with the value
that does what runs recorded without it did; and settings gone since (the coupling lab's, now a
component), each with the value that did what runs recorded without them do. DAgger's rounds
record the env and prompt settings again under `dagger.`: the same values hold there."""
RENAMED = {"rl.sampler.share_prefill": "rl.sampler.share_prefixes"}
"""Settings recorded under an earlier name: old name -> the name they are compared under."""
UNRECORDED_SINCE = {"prompt.invalid_penalty"}
"""Settings some phases recorded and no longer depend on (reward-only since: the expert data, the
tokenizer and SFT): a record's value of one is ignored where a phase's settings now lack it."""


def changes(old: dict, new: dict) -> list[str]:
    """'key: old -> new' for every setting that differs. A key a record lacks was added since: at
    None or its `OLD_BEHAVIOUR` value it changes nothing; one recorded under an earlier name
    (`RENAMED`) is compared under its name now; one the phase no longer depends on
    (`UNRECORDED_SINCE`, absent from `new`) is not compared."""
    old = {RENAMED.get(k, k): v for k, v in old.items() if k in new or k not in UNRECORDED_SINCE}
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k, '(unset)')} -> {new.get(k, '(unset)')}" for k in keys
            if old.get(k, OLD_BEHAVIOUR.get(k)) != new.get(k, OLD_BEHAVIOUR.get(k))]


class Phases:
    """What `<run_dir>/phases.json` says each completed phase was made with."""

    def __init__(self, run_dir: Path, say=print):
        self.path = Path(run_dir) / "phases.json"
        self.done: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.say = say

    def same(self, name: str, settings: dict) -> bool:
        """Whether `name` was recorded with `settings` (a setting added since at its old
        behaviour counts as the same: `changes`)."""
        previous = self.done.get(name)
        return previous is not None and not changes(previous, settings)

    def reusable(self, name: str, settings: dict, output_exists: bool) -> bool:
        """True when `name` completed with `settings` (`same`) and its output is there; otherwise
        says in one line why it runs."""
        previous = self.done.get(name)
        if self.same(name, settings) and output_exists:
            self.say(f"{name}: done earlier with the same settings, reused")
            return True
        set_stage(name)
        if previous is None or not output_exists:
            self.say(f"{name}: running")
        else:
            diff = changes(previous, settings)
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            self.say(f"{name}: settings changed ({shown}), redoing")
        self.done.pop(name, None)
        self._write()
        return False

    def complete(self, name: str, settings: dict) -> None:
        self.done[name] = settings
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.done, indent=1, sort_keys=True))
