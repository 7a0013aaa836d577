"""Recipes as files: a YAML recipe read with its overrides and plugins into a validated `Config`,
and a resolved config written back. Any error of the input is a `ConfigError` of one line per
problem, naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from agentrl.config import Config, ConfigError
from agentrl.files import write_atomic
from agentrl.registry import PluginError, load_plugin


def load_config(path: str | Path, overrides: list[str] = (), imports: list[str] = ()) -> Config:
    """Load a YAML recipe, import its plugins and `imports` (files relative to the working
    directory), apply `key.sub=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist" if not path.exists() else f"recipe {path} is not a file")
    data = _read_yaml(path.read_bytes(), str(path))
    if data is None:
        raise ConfigError(f"{path}: the recipe is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a YAML mapping, got {type(data).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[leaf] = _read_yaml(value.encode(), f"override {item!r}")
    recipe_imports = data.get("imports") or []
    if not isinstance(recipe_imports, list):
        raise ConfigError(f"{path}: imports: a list of modules or .py files")
    try:
        loaded = [load_plugin(str(spec), path.parent) for spec in recipe_imports]
        loaded += [load_plugin(spec) for spec in imports]
    except PluginError as err:
        raise ConfigError(f"{path}: {err}") from None
    data["imports"] = list(dict.fromkeys(loaded))
    return validate_config(data, source=str(path))


def _read_yaml(raw: bytes, source: str):
    """YAML text (UTF-8) -> data; a syntax or encoding error names `source` and the position."""
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: YAML syntax error{where}: {problem}") from None


def validate_config(data: dict, source: str = "config") -> Config:
    """The Config of `data`; each validation error is one line `source: field.path: message`."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        lines = [f"{source}: {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in err.errors()]
        raise ConfigError("\n".join(lines)) from None


def config_yaml(config: Config) -> str:
    """The resolved config as YAML (it holds no secrets: keys come from environment variables it names)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def save_config(config: Config, path: str | Path) -> None:
    write_atomic(path, config_yaml(config))
