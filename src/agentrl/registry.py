"""Registries: one per extension axis, each mapping a name to a config class and an implementation.

A recipe section such as `rl.advantage: {type: loo_median, ...}` is validated by the config class
registered under its `type` at load time, so a researcher's own environment, estimator or loss
enters through a recipe like a built-in one:

    from typing import Literal
    from agentrl.config import Section
    from agentrl.registry import ADVANTAGES

    class LOOMedianConfig(Section):
        type: Literal["loo_median"] = "loo_median"

    @ADVANTAGES.register("loo_median", LOOMedianConfig)
    def loo_median(trajectories, config): ...

User code is loaded by `--import MODULE_OR_FILE.py` on the command line, by `imports:` in the
recipe (`load_plugins`), and from installed packages through the entry-point group
`agentrl.plugins`. A built-in implementation may be registered as a "module:attribute" string, so
heavy engines are imported only when used.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import core_schema

ENTRY_POINT_GROUP = "agentrl.plugins"


class PluginError(ValueError):
    """A plugin that cannot be loaded or registered (reported as a user error, exit status 2)."""


@dataclass
class Entry:
    config: type[BaseModel] | None
    target: Any
    """The implementation, or a "module:attribute" string imported at first use."""
    components: Any = None
    """`(config, context) -> list[Component]`: trainer components the entry needs (PPO's critic)."""
    always: bool = False
    """Built for every run from the run's own settings, never named in a recipe (the KL reference)."""


class Registry:
    def __init__(self, axis: str, modules: tuple[str, ...], key: str = "type"):
        self.axis, self.key = axis, key
        self._modules = modules  # imported before the first lookup: they register the built-ins
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, config: type[BaseModel] | None = None, target: Any = None, components=None,
                 always: bool = False):
        """Register `target` under `name` (as a decorator when `target` is not given). `config` is
        the pydantic class of the recipe section; its `key` field (`type`) must default to `name`.
        `components(config, context) -> list[Component]` adds trainer components the entry needs
        (`agentrl.components`). An `always` entry takes no section: the trainer calls it in every
        run (`target(None, context) -> list[Component]`, empty where the run's settings do not
        call for it)."""
        if config is not None:
            field = config.model_fields.get(self.key)
            if field is None or field.default != name:
                raise PluginError(f"{self.axis} {name!r}: its config class {config.__name__} needs the field "
                                  f"`{self.key}: Literal[{name!r}] = {name!r}`")

        def add(obj):
            if name in self._entries and self._entries[name].target is not obj:
                raise PluginError(f"{self.axis} {name!r} is registered twice")
            self._entries[name] = Entry(config, obj, components, always)
            return obj
        return add if target is None else add(target)

    def _load(self) -> None:
        for module in self._modules:
            importlib.import_module(module)
        load_entry_points()

    def names(self) -> list[str]:
        """What a recipe section can name."""
        self._load()
        return sorted(name for name, entry in self._entries.items() if not entry.always)

    def always(self) -> list[str]:
        """The entries built for every run, in the order they were registered."""
        self._load()
        return [name for name, entry in self._entries.items() if entry.always]

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            self._load()
        if name not in self._entries:
            raise ValueError(f"unknown {self.axis} {name!r}; registered: {', '.join(self.names())} "
                             f"(add your own with --import or the recipe's `imports:`)")
        return self._entries[name]

    def get(self, name: str):
        entry = self.entry(name)
        if isinstance(entry.target, str):
            module, _, attribute = entry.target.partition(":")
            entry.target = getattr(importlib.import_module(module), attribute)
        return entry.target

    def config(self, data: Any, default: str) -> BaseModel:
        """A recipe section validated by the config class its `key` names."""
        if isinstance(data, BaseModel):
            data = data.model_dump()
        if not isinstance(data, dict):
            raise ValueError(f"a {self.axis} section is a mapping with a `{self.key}` field")
        name = data.get(self.key, default)
        if not name:
            raise ValueError(f"this {self.axis} section needs a `{self.key}`: one of {', '.join(self.names())}")
        entry = self.entry(name)
        if entry.always:
            raise ValueError(f"{self.axis} {name!r} is built for every run from the run's settings; "
                             f"it takes no section")
        if entry.config is None:
            raise ValueError(f"{self.axis} {name!r} takes no settings")
        return entry.config.model_validate(data)

    def make(self, name: str, **settings) -> BaseModel:
        """The config section of entry `name` with `settings` (the rest at their defaults)."""
        return self.config({self.key: name, **settings}, name)

    def field(self, default: str):
        """Annotation marker for a config field holding one of this registry's sections:
        `Annotated[Section, ADVANTAGES.field("grpo")]`."""
        return _Choice(self, default)


class _Choice:
    def __init__(self, registry: Registry, default: str):
        self.registry, self.default = registry, default

    def __get_pydantic_core_schema__(self, source, handler):
        def validate(value, _next):
            return self.registry.config(value, self.default)
        return core_schema.no_info_wrap_validator_function(
            validate, core_schema.any_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda v: v.model_dump(mode="json")))


_entry_points_loaded = False


def load_entry_points() -> None:
    """Import every installed package's `agentrl.plugins` entry point (once)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as err:
            raise PluginError(f"plugin entry point {point.name} ({point.value}): {err}") from err


def load_plugin(spec: str, base: Path | None = None) -> str:
    """Import a plugin: a module name (`my_pkg.plugin`) or a Python file (`my_plugin.py`, relative to
    `base` or the working directory). A file is imported as a module named after it, with its
    folder put on sys.path, so environment worker processes can import it too. Returns the spec
    as it should be recorded (a file as an absolute path)."""
    if spec.endswith(".py"):
        path = Path(spec).expanduser()
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        path = path.resolve()
        if not path.is_file():
            raise PluginError(f"plugin file {path} does not exist")
        loaded = sys.modules.get(path.stem)
        if loaded is not None:
            if Path(getattr(loaded, "__file__", "") or "").resolve() != path:
                raise PluginError(f"plugin {path}: a module named {path.stem!r} is already imported "
                                  f"from {getattr(loaded, '__file__', None)}; rename the file")
            return str(path)
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        _import(path.stem, spec)
        return str(path)
    _import(spec, spec)
    return spec


def _import(module: str, spec: str) -> None:
    try:
        importlib.import_module(module)
    except PluginError:
        raise
    except Exception as err:
        raise PluginError(f"plugin {spec}: {type(err).__name__}: {err}") from err


ENVIRONMENTS = Registry("environment", ("agentrl.envs",))
ADVANTAGES = Registry("advantage estimator", ("agentrl.advantages",))
POLICY_LOSSES = Registry("policy loss", ("agentrl.losses.policy",))
KL_ESTIMATORS = Registry("KL estimator", ("agentrl.losses.policy",))
AUX_LOSSES = Registry("auxiliary loss", ("agentrl.losses.aux", "agentrl.gcd.loss"))
SAMPLERS = Registry("sampler", ("agentrl.sampler",))
COMPONENTS = Registry("trainer component", ("agentrl.losses.reference", "agentrl.advantages.nthr",
                                            "agentrl.analysis.coupling"))
ACTORS = Registry("actor backend", ("agentrl.actor",), key="backend")

__all__ = ["ACTORS", "ADVANTAGES", "AUX_LOSSES", "COMPONENTS", "ENVIRONMENTS", "KL_ESTIMATORS", "POLICY_LOSSES", "SAMPLERS",
           "PluginError", "Registry", "load_plugin"]
