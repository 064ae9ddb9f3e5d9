"""The layer rules of docs/architecture.md, checked on the source: who may import whom.

Every import counts, including those inside functions: a lazy import is still a dependency
(it only moves the moment the circle bites to the first call), so moving an import into a
function never makes a circle acceptable. ``TYPE_CHECKING`` blocks count too: they are read
by whoever reads the code and by type checkers, which the layers are for.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "src" / "modelyard"

# Packages that sit above ``model`` and must never be imported by it.
CAPABILITIES = ("serving", "edge", "training", "platform", "batch", "tuning", "web")


def _module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = PACKAGE_ROOT) -> set[str]:
    """Every name under ``root``'s package that ``path`` imports: ``from a import b`` names
    ``a.b`` when ``b`` is a module there, else ``a`` (callers keep the names that are modules)."""
    top = root.name
    found = set()
    package = _module_name(path, root)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(root.parent.joinpath(*sub.split("."))) else base)
    return {name for name in found if name == top or name.startswith(top + ".")}


def _is_module(path: Path) -> bool:
    """A package, a Python file or a C extension (its source: the built file may be missing)."""
    return path.is_dir() or any(path.with_name(path.name + suffix).is_file() for suffix in (".py", ".c"))


@functools.lru_cache(maxsize=None)  # every test reads the same tree: parse it once per run
def _graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``root``'s package it imports (itself left out). Read-only: cached."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target in _imports(path, root) if target in modules and target != name}
    return graph


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each as the path
    ``[a, b, ..., a]`` that walks it, sorted; empty when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        # Recursive is fine: the package is a few hundred modules, far under the recursion limit.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_walk(graph, group) for group in groups)


def _walk(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle through the group's first module, staying inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        after = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    after.append(nxt)
        frontier = after
    raise AssertionError(f"no circle through {start}")  # pragma: no cover (a group always has one)


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


def test_no_import_circle_between_modules():
    """No two modules import each other, directly or through others, files of one package included.
    Break a circle from one side (the caller hands the lower module what it needs, as the
    transports take their TLS guard), or move what both need into a module both use."""
    circles = [" -> ".join(c) for c in module_cycles(_graph())]
    assert circles == [], "import circles:\n" + "\n".join(circles)


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "fakepkg"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_circle_checker_reports_two_files_of_one_package(tmp_path):
    package = _fake_package(tmp_path, {
        "sub/__init__.py": "",
        "sub/a.py": "from fakepkg.sub.b import thing\n",
        # the lazy import closes the circle: it counts
        "sub/b.py": "thing = 1\ndef later():\n    from . import a\n    return a\n",
        "c.py": "from fakepkg.sub import a\n",  # leads into the circle, is not part of it
    })
    assert module_cycles(_graph(package)) == [["fakepkg.sub.a", "fakepkg.sub.b", "fakepkg.sub.a"]]


def test_circle_checker_reports_a_longer_circle_and_passes_a_clean_package(tmp_path):
    looped = _fake_package(tmp_path / "looped", {
        "a.py": "import fakepkg.b\n", "b.py": "from fakepkg import c\n", "c.py": "from .a import x\n",
    })
    assert module_cycles(_graph(looped)) == [["fakepkg.a", "fakepkg.b", "fakepkg.c", "fakepkg.a"]]
    clean = _fake_package(tmp_path / "clean", {
        "a.py": "import fakepkg.b\n", "b.py": "from fakepkg import c\n", "c.py": "import os\n",
    })
    assert module_cycles(_graph(clean)) == []


# The platform's parts, lowest first: each may import only the parts before it (and itself).
# ``storage`` is a leaf the job code asks for paths; the top-level modules (app, server, the CLIs)
# wire the parts together and may import any of them.
PLATFORM_PARTS = {
    "api": set(),
    "storage": {"api"},  # the one token rule (api.bearer, a leaf)
    "state": {"api"},
    "dataplane": {"api", "state"},
    "resources": {"api", "state", "dataplane"},
    "jobs": {"api", "state", "dataplane", "resources", "storage"},
}


def _platform_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "platform" and parts[2] in PLATFORM_PARTS else None


def test_platform_parts_import_only_the_parts_below_them():
    offenders = set()
    for module, targets in _graph().items():
        part = _platform_part(module)
        if part is None:
            continue
        for target in targets:
            other = _platform_part(target)
            if target.startswith("modelyard.platform") and other is None:
                offenders.add(f"{module} -> {target} (a top-level platform module)")
            elif other is not None and other != part and other not in PLATFORM_PARTS[part]:
                offenders.add(f"{module} -> {target}")
    assert sorted(offenders) == []
