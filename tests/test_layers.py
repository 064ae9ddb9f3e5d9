"""The layer rules of docs/architecture.md, checked on the source: who may import whom.

Every import counts, including those inside functions (a lazy import is still a dependency).
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "modelyard"

# Packages that sit above ``model`` and must never be imported by it.
CAPABILITIES = ("serving", "edge", "training", "platform", "batch", "tuning", "web")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``modelyard`` module ``path`` imports, resolved to the deepest name that is a module."""
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "modelyard" or name.startswith("modelyard.")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target in _imports(path) if target in modules and target != name}
    return graph


def _unit(module: str) -> str:
    """The node of the package graph: a subpackage collapses into one node; a package's own
    top-level modules stay single (``serving.metrics`` is a leaf that ``serving.manager`` may use)."""
    parts = module.split(".")
    path = PACKAGE_ROOT.parent.joinpath(*parts)
    if path.is_dir():  # a package's __init__
        return module
    for depth in range(len(parts) - 1, 1, -1):
        prefix = parts[:depth]
        if depth >= 3 or (depth == 2 and prefix[1] not in ("serving", "model")):
            if PACKAGE_ROOT.parent.joinpath(*prefix).is_dir():
                return ".".join(prefix)
    return module


def test_model_layer_imports_no_capability():
    offenders = {
        module: sorted(t for t in targets if t.split(".")[1] in CAPABILITIES)
        for module, targets in _graph().items()
        if module.startswith("modelyard.model")
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_protocol_adapters_do_not_import_transport():
    offenders = {
        module: sorted(t for t in targets if t.startswith("modelyard.serving.transport"))
        for module, targets in _graph().items()
        if module.startswith("modelyard.serving.protocol")
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_import_cycles_between_packages():
    edges: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        for target in targets:
            a, b = _unit(module), _unit(target)
            if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
                edges.setdefault(a, set()).add(b)
    # Tarjan-free check: a cycle exists iff some node reaches itself.
    cycles = []
    for start in sorted(edges):
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join(trail + [start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
    assert cycles == []


def test_every_package_says_what_it_holds_and_may_import():
    missing = [str(init.relative_to(PACKAGE_ROOT)) for init in sorted(PACKAGE_ROOT.rglob("__init__.py"))
               if "May import" not in (ast.get_docstring(ast.parse(init.read_text())) or "")]
    assert not missing, f"package docstrings without a 'May import' line: {missing}"
