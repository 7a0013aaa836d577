"""The package's import graph: no module imports, directly or through others, one that imports it
back (function-level imports counted too: a deferred import is still a dependency)."""

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentrl"


def import_graph() -> nx.DiGraph:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("agentrl"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("agentrl")]
            else:
                continue
            graph.add_edges_from((name, module_of(t)) for t in targets if module_of(t) != name)
    return graph


def test_the_package_has_no_import_circles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"import circles: {cycles}"


def test_the_graph_sees_a_circle_when_there_is_one():
    graph = import_graph()
    assert graph.has_edge("agentrl.trainer", "agentrl.components")
    graph.add_edge("agentrl.components", "agentrl.trainer")
    assert any(len(c) > 1 for c in nx.strongly_connected_components(graph))


LAYERS = [  # top to bottom: a module imports only from its own layer or the ones below it
    ("commands", ["cli", "compare", "plot", "serve", "plan"]),
    ("pipeline", ["pipeline"]),
    ("trainer", ["trainer", "sft", "dagger", "evaluate", "checkpoint", "tracking", "provenance"]),
    ("methods", ["advantages", "losses", "components", "critic", "gcd", "analysis"]),
    ("actors, samplers, environments", ["actor", "sampler", "envs", "models", "forward", "data", "rollout.collect", "rollout.ahead",
                                        "kernels"]),
    ("config, registry, records", ["config", "recipe", "registry", "rollout", "packing", "prompting", "files", "errors",
                                   "distributed", "raycluster", "seeding", "progress", "stats", "metrics", "envs.base"]),
]


def layer_of(module: str) -> int:
    name = module.removeprefix("agentrl.")
    best = None
    for depth, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (depth, prefix)
    assert best is not None, f"{module} is in no layer of tests/test_layout.py"
    return best[0]


def upward_imports(graph) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, b in graph.edges if a != "agentrl" and layer_of(b) < layer_of(a)]


def test_no_module_imports_from_a_layer_above_its_own():
    assert not upward_imports(import_graph())


def test_the_layers_see_an_upward_import_when_there_is_one():
    graph = import_graph()
    graph.add_edge("agentrl.config", "agentrl.trainer")
    assert upward_imports(graph) == ["agentrl.config (config, registry, records) imports agentrl.trainer (trainer)"]
