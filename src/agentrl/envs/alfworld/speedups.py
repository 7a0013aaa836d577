"""TextWorld's PDDL engine (ALFWorld) with its pure parses and translations cached: the same
games move for move, steps 12x and resets 2x faster (`benchmarks/alfworld_engine.py`).

Profiled on 2 cores (L0 games, random admissible moves), a step spent about 70% of its time in
TatSu re-parsing the same strings (every admissible action's command template and every grammar
condition, on every step) and most of the rest deep-copying entity records into the context of
every symbol it derives. A reset translated the same PDDL problem to SAS four times (`load` and
`reset` each build a `PddlState`, which translates twice). Cached here by their text:
- the text grammar's symbol parses (copied on the way out: the engine writes a context into each
  symbol it gets);
- conjunctive-query parses (a fresh `Rule` around the cached preconditions; nothing mutates them);
- PDDL -> SAS translations, the few most recent (the engine only reads the translated task);
and `copy_context` copies the context's dicts rather than the records in them (`shallow_context`).

`install()` patches the module-level functions that the engine looks up at call time; the
ALFWorld environment installs it when it starts. `uninstall()` restores them (the equality test
plays the same games both ways).
"""

from __future__ import annotations

import copy
import functools

_ORIGINALS: dict = {}


def install() -> None:
    if _ORIGINALS:
        return
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    _ORIGINALS.update(textgen=textgen._parse_and_convert, copy_context=textgen.copy_context,
                      query=Rule.__dict__["parse_conjunctive_query"], pddl2sas=fast_downward.pddl2sas)
    parse_symbols = functools.lru_cache(maxsize=None)(
        lambda text, rule_name: _ORIGINALS["textgen"](text, rule_name=rule_name))

    def cached_symbols(text, rule_name, trace=False):
        return copy.deepcopy(parse_symbols(text, rule_name))

    query = functools.lru_cache(maxsize=None)(_ORIGINALS["query"].__func__.__get__(Rule))

    def cached_query(cls, expr):
        rule = query(expr)
        return Rule(rule.name, rule.preconditions, rule.postconditions)

    translate = functools.lru_cache(maxsize=8)(
        lambda domain, problem, optimize: _ORIGINALS["pddl2sas"](domain, problem, optimize=optimize))

    def cached_pddl2sas(domain, problem, verbose=False, optimize=False):
        return translate(domain, problem, optimize)

    textgen._parse_and_convert = cached_symbols
    textgen.copy_context = shallow_context
    Rule.parse_conjunctive_query = classmethod(cached_query)
    fast_downward.pddl2sas = cached_pddl2sas


def shallow_context(context: dict) -> dict:
    """TextWorld's `copy_context` deep-copies the variables (entity records) and the mapping for
    every symbol it derives; derivation only adds keys to the two dicts and reads the records (the
    grammar's expressions are `{r.name}`-style reads), so copying the dicts is enough."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}


def uninstall() -> None:
    if not _ORIGINALS:
        return
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    textgen._parse_and_convert = _ORIGINALS["textgen"]
    textgen.copy_context = _ORIGINALS["copy_context"]
    Rule.parse_conjunctive_query = _ORIGINALS["query"]
    fast_downward.pddl2sas = _ORIGINALS["pddl2sas"]
    _ORIGINALS.clear()
