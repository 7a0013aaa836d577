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
