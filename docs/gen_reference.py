"""Write the reference pages from the code: every config field (type, default, docstring), every
CLI command and flag, every registered name per axis. Never typed by hand.

    python docs/gen_reference.py           # rewrite docs/reference/*.md
    python docs/gen_reference.py --check   # exit 1 naming each page that is stale

A field without a docstring is an error: the reference would have nothing to say about it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentrl.cli import build_parser
from agentrl.config import Config
from agentrl.registry import (ACTORS, ADVANTAGES, AUX_LOSSES, COMPONENTS, ENVIRONMENTS, KL_ESTIMATORS, POLICY_LOSSES,
                              SAMPLERS, Registry, _Choice)

REFERENCE = Path(__file__).resolve().parent / "reference"
AXES = [("environments", "env", ENVIRONMENTS), ("advantage estimators", "rl.advantage", ADVANTAGES),
        ("policy losses", "rl.loss", POLICY_LOSSES), ("KL estimators", "rl.kl_estimator", KL_ESTIMATORS),
        ("auxiliary losses", "rl.aux[]", AUX_LOSSES), ("actor backends", "rl.actor, sft.actor", ACTORS),
        ("samplers", "rl.sampler", SAMPLERS), ("trainer components", "rl.components[]", COMPONENTS)]


class UndocumentedField(ValueError):
    pass


def built_ins(registry: Registry) -> list[str]:
    """The registry's names that agentrl itself registers (plugins loaded in this process, from
    --import or installed entry points, are theirs to document)."""
    def ours(name: str) -> bool:
        entry = registry.entry(name)
        owner = entry.config if entry.config is not None else registry.get(name)
        return getattr(owner, "__module__", "").split(".")[0] == "agentrl"
    return [name for name in registry.names() if ours(name)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type_name(annotation) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    text = repr(annotation).replace("typing.", "")
    for module in ("agentrl.config.rl.", "agentrl.config.sections.", "agentrl.config.", "pydantic.main.", "annotated_types."):
        text = text.replace(module, "")
    return text


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{value!r}`"


def _choice(field) -> Registry | None:
    for meta in field.metadata:
        if isinstance(meta, _Choice):
            return meta.registry
    args = typing.get_args(field.annotation)
    for arg in args:  # list[Annotated[Section, X.field(...)]]
        for meta in getattr(arg, "__metadata__", ()):
            if isinstance(meta, _Choice):
                return meta.registry
    return None


def _section_type(annotation) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def section_rows(model: type[BaseModel], prefix: str) -> tuple[list[str], list[tuple[str, type[BaseModel]]]]:
    """The table rows of `model`'s own fields and the nested sections to document after it."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        if not field.description:
            raise UndocumentedField(f"{model.__module__}.{model.__name__}.{name} has no docstring")
        registry = _choice(field)
        if registry is not None:
            kind = f"one of the {registry.axis} sections, by `{registry.key}`"
        else:
            kind = _type_name(field.annotation)
            section = _section_type(field.annotation)
            if section is not None:
                nested.append((path, section))
        description = " ".join(field.description.split()).replace("|", "\\|")
        rows.append(f"| `{path}` | {_cell(kind)} | {_default(field)} | {description} |")
    return rows, nested


def _table(title: str, doc: str | None, rows: list[str]) -> str:
    head = f"### `{title}`\n\n" + (" ".join(doc.split()) + "\n\n" if doc else "")
    return head + "| field | type | default | description |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def config_page() -> str:
    parts = ["# Configuration reference\n",
             "Generated from the code by `docs/gen_reference.py` (`make docs`): every field of a recipe with "
             "its type, default and docstring. A section chosen by `type` (`backend` for actors) takes the "
             "fields of the registered entry it names; those are listed per entry below the recipe's own "
             "sections. Unknown keys are errors that name the field.\n"]
    queue = [("", Config)]
    seen = set()
    while queue:
        prefix, model = queue.pop(0)
        if (prefix, model) in seen:
            continue
        seen.add((prefix, model))
        rows, nested = section_rows(model, f"{prefix}." if prefix else "")
        parts.append(_table(prefix or "(top level)", model.__doc__ if model is not Config else None, rows))
        queue.extend(nested)
    for title, where, registry in AXES:
        entries = [(name, registry.entry(name)) for name in built_ins(registry)]
        entries = [(name, entry) for name, entry in entries if entry.config is not None]
        if not entries:
            continue
        parts.append(f"## {title[0].upper() + title[1:]} (`{where}`)\n")
        for name, entry in entries:
            rows, nested = section_rows(entry.config, "")
            parts.append(_table(f"{registry.key}: {name}", f"{entry.config.__doc__ or ''} Defined in "
                                f"`{entry.config.__module__}`.", rows))
            for path, section in nested:
                sub_rows, _ = section_rows(section, f"{path}.")
                parts.append(_table(f"{name}: {path}", section.__doc__, sub_rows))
    return "\n".join(parts)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest.upper()}`"
        if action.option_strings and action.nargs != 0:
            names += f" {action.metavar or action.dest.upper()}"
        default = "" if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0 else \
            f" (default `{action.default}`)"
        rows.append(f"| {names} | {_cell(' '.join((action.help or '').split()))}{default} |")
    return rows


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{prefix} {name}", helps.get(name) or "", sub))
                found.extend(_commands(sub, f"{prefix} {name}"))
    return found


def cli_page() -> str:
    parser = build_parser()
    parts = ["# CLI reference\n",
             "Generated from the argument parser by `docs/gen_reference.py`. Wrong input exits 2 with one line "
             "per problem naming the file and field, a run that cannot go on exits 1 with its cause, Ctrl-C "
             "exits 130 and SIGTERM 143 after an orderly stop; `agentrl --debug COMMAND ...` shows tracebacks.\n",
             "| command | what |\n|---|---|\n" + "\n".join(
                 f"| [`{name.strip()}`](#{name.strip().replace(' ', '-')}) | {text} |"
                 for name, text, sub in _commands(parser, "agentrl") if _flags(sub)) + "\n"]
    for name, text, sub in _commands(parser, "agentrl"):
        rows = _flags(sub)
        if not rows:
            continue
        parts.append(f"## {name.strip()}\n\n{text}\n\n```text\n{sub.format_usage().strip()}\n```\n\n"
                     "| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def registry_page() -> str:
    parts = ["# Registered names\n",
             "Generated by `docs/gen_reference.py`: every built-in name per extension axis, where it is "
             "defined, and what it is. A plugin (`--import`, the recipe's `imports:`, or the entry-point "
             "group `agentrl.plugins`) adds names the same way (see the plugins guide).\n"]
    for title, where, registry in AXES:
        rows = []
        for name in built_ins(registry):
            entry = registry.entry(name)
            target = registry.get(name)
            module = getattr(target, "__module__", "?")
            doc = inspect.getdoc(entry.config) if entry.config is not None and entry.config.__doc__ else \
                (inspect.getdoc(target) or "")
            summary = " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")
            config = f"`{entry.config.__name__}`" if entry.config is not None else "-"
            rows.append(f"| `{name}` | {config} | `{module}` | {summary} |")
        body = "| name | config class | module | what |\n|---|---|---|---|\n" + "\n".join(rows) if rows else \
            "No built-in entries: plugins only."
        parts.append(f"## {title[0].upper() + title[1:]} (`{where}`)\n\n{body}\n")
    return "\n".join(parts)


PAGES = {"config.md": config_page, "cli.md": cli_page, "registry.md": registry_page}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming each stale page, write nothing")
    parser.add_argument("--out", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    stale = []
    for name, page in PAGES.items():
        text = page()
        path = args.out / name
        if not path.is_file() or path.read_text() != text:
            stale.append(name)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        print(f"stale reference pages: {', '.join(stale)} (run python docs/gen_reference.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
