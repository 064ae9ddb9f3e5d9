"""Which tests are ``e2e``: they start a process (a server, the platform, PostgreSQL, Ray, a
browser, the ``modelyard`` command). The others make ``./scripts/test --quick``.

Nobody has to remember to mark a test: ``classify`` reads the code the test runs before it
runs — the test function, every fixture it uses (its whole closure, so ``grpc_target`` reaching
``testdata_server`` counts), and the helpers they call that are defined under ``tests/`` (or in
``modelyard`` itself), followed by name through each function's globals — and marks it ``e2e``
when any of them names a process starter (``subprocess``, ``multiprocessing``, Playwright,
Ray, ``os.fork``...). An explicit ``@pytest.mark.e2e`` still works for what reading misses.

What reading misses is caught when it happens: ``guard`` wraps ``subprocess.Popen`` while a test
classified quick runs, and such a test fails saying it started a process and how to mark it,
so ``--quick`` stays free of processes and the classification is checked on every run.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SOURCE = TESTS.parent / "src" / "modelyard"
# The callables that start a child process, by module and name (a module's exceptions and
# constants, e.g. ``subprocess.TimeoutExpired``, are not).
STARTERS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
           "spawnv", "spawnl"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "pty": {"spawn", "fork"},
    "playwright.sync_api": {"sync_playwright"},
    "playwright.async_api": {"async_playwright"},
    "ray": {"init"},
}
E2E_REASON = "starts a process (a server, the platform, PostgreSQL, Ray, a browser or the modelyard command)"


def _ours(obj) -> bool:
    """Code of this test suite (tests and their helpers): read it further. The package's own
    code is not followed (``batch_predict`` names Ray for its Ray engine, used or not): what it
    starts is the guard's to catch."""
    try:
        path = Path(inspect.getsourcefile(obj) or "")
    except TypeError:
        return False
    return TESTS in path.parents


def _starter(chain: list[str], scope: dict) -> str | None:
    """``module.name`` when the dotted ``chain`` names a process starter in ``scope``, else None."""
    head = scope.get(chain[0])
    if isinstance(head, types.ModuleType):
        module, names = head.__name__, chain[1:2]
    elif head is not None and isinstance(getattr(head, "__name__", None), str):  # a function, or a stand-in
        module, names = getattr(head, "__module__", "") or "", [head.__name__]
    else:
        return None
    for top, starters in STARTERS.items():
        if (module == top or module.startswith(top + ".") and top != "os") and names and names[0] in starters:
            return f"{top}.{names[0]}"
    return None


@functools.lru_cache(maxsize=None)
def _names(func) -> list[list[str]]:
    """Every dotted name the function's source uses (``a.b.c`` as ``[a, b, c]``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    chains = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                chains.append([node.id] + parts[::-1])
        elif isinstance(node, ast.Name):
            chains.append([node.id])
        elif isinstance(node, ast.Import):  # imports inside the function: the name bound, what to
            for alias in node.names:
                if alias.asname:
                    chains.append(["<import>", alias.asname, alias.name, ""])
                else:
                    top = alias.name.split(".")[0]
                    chains.append(["<import>", top, top, ""])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                chains.append(["<import>", alias.asname or alias.name, node.module, alias.name])
    return chains


def _resolve(chain: list[str], scope: dict):
    """The object a dotted name of the function names, followed through modules and our classes."""
    obj = scope.get(chain[0])
    for attr in chain[1:]:
        if not (isinstance(obj, types.ModuleType) or isinstance(obj, type) and _ours(obj)):
            break
        try:
            obj = getattr(obj, attr) if isinstance(obj, types.ModuleType) else inspect.getattr_static(obj, attr)
        except AttributeError:
            break
    return obj


def _imported(module: str, name: str):
    """What ``import module`` (``name`` empty) or ``from module import name`` binds, without importing
    anything heavy: this suite's own modules are imported (to be read further), modules already
    loaded are used, and any other stands in by its name (``ray``, ``playwright.sync_api``: enough
    to tell a starter), never loaded for the sake of reading (Ray alone costs seconds)."""
    if module == "tests" or module.startswith("tests."):
        try:
            loaded = importlib.import_module(module)
            return getattr(loaded, name, None) if name else loaded
        except ImportError:
            return None
    loaded = sys.modules.get(module)
    if loaded is not None:
        return getattr(loaded, name, None) if name else loaded
    if not name:
        return types.ModuleType(module)
    stand_in = types.SimpleNamespace(__module__=module, __name__=name)
    return stand_in if any(module == top or module.startswith(top + ".") for top in STARTERS) else None


@functools.lru_cache(maxsize=None)
def _starts_process(func) -> str | None:
    """The starter ``func`` reaches (its dotted name), or None; follows this repository's code only."""
    seen: set = set()
    todo = [func]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if isinstance(current, type):  # its methods, and those it inherits from our classes
            for klass in current.__mro__:
                if _ours(klass):
                    todo.extend(v for v in vars(klass).values()
                                if inspect.isfunction(v) or isinstance(v, (property, staticmethod, classmethod)))
            continue
        if isinstance(current, (staticmethod, classmethod)):
            todo.append(current.__func__)
            continue
        if isinstance(current, property):
            todo.extend(f for f in (current.fget, current.fset) if f is not None)
            continue
        current = inspect.unwrap(current)
        scope = dict(getattr(current, "__globals__", {}))
        if current.__closure__:
            for name, cell in zip(current.__code__.co_freevars, current.__closure__):
                try:
                    scope[name] = cell.cell_contents
                except ValueError:
                    pass
        for chain in _names(current):
            if chain[0] == "<import>":  # an import inside the function: bind the name it makes
                _, bound, module, name = chain
                chain = [bound]
                scope[bound] = _imported(module, name)
                if scope[bound] is None:
                    continue
            starter = _starter(chain, scope)
            if starter:
                return starter
            obj = _resolve(chain, scope)
            if isinstance(obj, (staticmethod, classmethod)):
                obj = obj.__func__
            if isinstance(obj, property) and obj.fget is not None:
                obj = obj.fget
            if (inspect.isfunction(obj) or isinstance(obj, type)) and _ours(obj):
                todo.append(obj)
    return None


def e2e_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is e2e (the starter it reaches, through which fixture), or None if it is quick."""
    if item.get_closest_marker("e2e") is not None:
        return "marked e2e"
    functions = [("the test", getattr(item, "function", None))]
    infos = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        for fixturedef in (infos.name2fixturedefs.get(name, ()) if infos else ()):
            functions.append((f"fixture {name}", fixturedef.func))
    seen = set()
    while functions:
        where, func = functions.pop(0)
        if func is None or func in seen or not _ours(func):
            continue
        seen.add(func)
        starter = _starts_process(func)
        if starter:
            return f"{where} reaches {starter}"
        # ``request.getfixturevalue(name)``: the fixtures it may ask for are among its strings.
        for name in _requested_fixtures(func):
            for fixturedef in _fixturedefs(item, name):
                functions.append((f"fixture {name} (through {where})", fixturedef.func))
    return None


@functools.lru_cache(maxsize=None)  # asked once per test for each fixture: read each once
def _requested_fixtures(func) -> list[str]:
    """The string constants of a function that calls ``getfixturevalue`` (the names it may ask for)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    if not any(isinstance(n, ast.Attribute) and n.attr == "getfixturevalue" for n in ast.walk(tree)):
        return []
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.isidentifier()]


def _fixturedefs(item: pytest.Item, name: str) -> list:
    """The fixture definitions ``name`` resolves to where ``item`` is, with their own fixtures' too."""
    manager = item.session._fixturemanager
    found, todo = [], [name]
    while todo:
        argname = todo.pop()
        for fixturedef in manager.getfixturedefs(argname, item) or ():
            if fixturedef not in found:
                found.append(fixturedef)
                todo.extend(fixturedef.argnames)
    return found


def classify(items: list[pytest.Item]) -> None:
    """Mark every test that starts a process ``e2e`` (``-m "not e2e"`` is ``--quick``)."""
    for item in items:
        reason = e2e_reason(item)
        if reason is not None and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e(reason=reason))


class _PopenGuard:
    """While a quick test runs, starting a process fails it (the classifier missed a path)."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.original = subprocess.Popen.__init__

    def install(self) -> None:
        guard = self

        @functools.wraps(self.original)
        def init(popen, args, *rest, **kwargs):
            # platform.uname() runs `uname -p` (TensorFlow's first import in a process asks it): a probe
            # of this machine, not a process the test starts.
            if guard.item is not None and list(args)[:1] != ["uname"]:
                item, guard.item = guard.item, None  # report once; let the test's own cleanup run
                raise AssertionError(
                    f"{item.nodeid} is classified quick (no process) but started one: {args!r}. "
                    "Mark it @pytest.mark.e2e, or start the process through a fixture or helper "
                    "under tests/ (tests/classify.py finds those by reading them)")
            return guard.original(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = init


GUARD = _PopenGuard()


@contextlib.contextmanager
def quick_guard(item: pytest.Item):
    """Around one test's setup, call and teardown: quick tests may not start processes."""
    GUARD.item = None if item.get_closest_marker("e2e") is not None else item
    try:
        yield
    finally:
        GUARD.item = None
