"""Running the suite on two pytest-xdist workers (``./scripts/test`` passes ``-n 2 --dist loadgroup``)
without starting anything expensive twice.

Groups, decided while collecting (every worker collects the same way, so they agree):

- A session fixture that keeps a process running while tests use it (a generator fixture that
  starts one, as tests/classify.py reads it: the platform, the Ray cluster, PostgreSQL, the
  browser, the storage server, the serving tests' shared servers) is *pinned*: every test that
  uses it, directly or through other fixtures, runs in one worker, so it starts once per run.
- A test module is never split: its module-scoped fixtures (often a server too) start once, and
  its tests keep the order they are written in.
- So modules are joined with the pinned fixtures their tests use (union-find); each joined set
  is one ``xdist_group``. Modules that use no pinned fixture are a group each, and xdist hands
  groups to whichever worker is free, the largest first.
- Within a group, modules run in an order that keeps each pinned fixture's users together, the
  costliest to keep running (``KEEP_SHORT``) first (``order_items``), and a pinned fixture is stopped
  after the group's last test that uses it (``release_finished_group``), not at the group's end:
  the one group that holds the platform, the Ray cluster and the storage servers runs for most of the
  run, and an idle Ray cluster costs CPU the other worker needs.

Session fixtures that only *write files* (the demo model, the platform's tiny models, TF
Serving's generated test models) are built once per run for both workers with ``build_once``:
the first worker builds under a lock in the run's shared temp dir, the other waits and reuses.

Other state two workers could share: ports (``modelyard.ports`` hands out, in each worker and
in every process it starts, only ports of its own residue class: ``MODELYARD_PORT_SLICE``),
temp dirs (xdist gives each worker its own ``--basetemp``), and environment variables (each
worker is its own process).
"""
from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests.classify import _fixturedefs, _requested_fixtures, _starts_process

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1"... or "" without xdist


def worker_port_slice() -> None:
    """In an xdist worker, set ``MODELYARD_PORT_SLICE`` (modelyard.ports) to this worker's residue class,
    so neither this worker nor anything it starts (they inherit it) picks a port another worker picks."""
    if WORKER and "MODELYARD_PORT_SLICE" not in os.environ:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        os.environ["MODELYARD_PORT_SLICE"] = f"{int(WORKER.removeprefix('gw'))}/{count}"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> tuple[Path, object]:
    """``build(directory)`` once per test run, whichever worker asks first; returns the directory and
    what ``build`` returned (JSON-able), the same in every worker. Without xdist it simply builds."""
    if not WORKER:
        directory = tmp_path_factory.mktemp(name)
        return directory, build(directory)
    shared = tmp_path_factory.getbasetemp().parent / "shared"  # the run's base temp, above every worker's
    directory, done = shared / name, shared / f"{name}.json"
    with _locked(shared / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build that failed half-way
            directory.mkdir(parents=True)
            value = build(directory)
            done.write_text(json.dumps({"value": value}))
        return directory, json.loads(done.read_text())["value"]


# ----------------------------------------------------------------------------- groups
def _session_defs(item: pytest.Item):
    """Every session-scoped fixture definition ``item`` may use (its closure and what its fixtures
    may ask for by ``request.getfixturevalue``)."""
    seen, found = set(), []
    infos = getattr(item, "_fixtureinfo", None)
    todo = [d for name in item.fixturenames for d in (infos.name2fixturedefs.get(name, ()) if infos else ())]
    while todo:
        fixturedef = todo.pop()
        if fixturedef in seen:
            continue
        seen.add(fixturedef)
        if fixturedef.scope == "session":
            found.append(fixturedef)
        for name in _requested_fixtures(fixturedef.func):
            todo.extend(_fixturedefs(item, name))
    return found


def _pinned(fixturedef) -> bool:
    """A session fixture that keeps a process running while the tests use it."""
    func = inspect.unwrap(fixturedef.func)
    return inspect.isgeneratorfunction(func) and _starts_process(func) is not None


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pinned_fixtures(item: pytest.Item) -> list[str]:
    """The names of the pinned session fixtures ``item`` uses."""
    return sorted({d.argname for d in _session_defs(item) if _pinned(d)})


# Session fixtures that leave something in the worker's process for every later test: Playwright's sync
# API keeps its asyncio loop marked running in the main thread, so a later test's asyncio.run() fails
# ("cannot be called from a running event loop"). Their group is handed out after every other group.
RUN_LAST = ("browser",)


def runs_last(group: str) -> bool:
    """Whether the group (as ``assign_groups`` names it) must be the last one its worker runs."""
    return group.split("+", 1)[0] in RUN_LAST


GROUP_FIXTURES: dict[str, set[str]] = {}  # group -> the pinned session fixtures its tests use (assign_groups)


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker else None


def _controller_dist(config) -> str | None:
    """The controller's ``--dist`` (a worker's own config says "no"), from the argv xdist hands it."""
    argv = list(getattr(config, "workerinput", {}).get("mainargv", ()))
    for i, arg in enumerate(argv):
        if arg == "--dist" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--dist="):
            return arg.split("=", 1)[1]
    return None


def _finish(item: pytest.Item, names) -> None:
    """Stop the session fixtures ``names`` if they are running (their dependents first: pytest registered
    them with it)."""
    manager = item.session._fixturemanager
    for name in sorted(names):
        for fixturedef in manager._arg2fixturedefs.get(name, ()):
            if fixturedef.scope == "session" and fixturedef.cached_result is not None:
                fixturedef.finish(item._request)


def release_finished_group(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After ``item``'s teardown: under ``--dist loadgroup`` a group's tests run one after another in one
    worker, in collection order, so a pinned session fixture (the platform, the Ray cluster,
    PostgreSQL...) that no later test of this group uses is stopped now instead of idling until the run
    ends (an idle two-node Ray cluster alone uses about 5 CPU-seconds a minute): all of the group's when
    the next test is another group's, else those whose last user ``item`` was."""
    if not WORKER or nextitem is None or _controller_dist(item.config) != "loadgroup":
        return
    group = _group(item)
    if group is None:
        return
    if _group(nextitem) != group:
        _finish(item, GROUP_FIXTURES.get(group, ()))
        return
    _finish(item, [name for name, nodeid in _last_users(item.session).get(group, {}).items() if nodeid == item.nodeid])


# Pinned fixtures that cost most to keep running while idle: within a group their users run first and
# together, so they stop early (release_finished_group). The rest follow by how few modules use them.
KEEP_SHORT = ("ray_cluster",)

PINNED: dict[str, list[str]] = {}  # test id -> the pinned fixtures it uses (assign_groups)
_LAST_USERS: dict[str, dict[str, str]] = {}  # group -> {pinned fixture: its last user's test id} (_last_users)


def _last_users(session: pytest.Session) -> dict[str, dict[str, str]]:
    """{group: {pinned fixture: the test id of the group's last test using it}}, in the order the tests
    run (``session.items`` once collection is done: pytest may reorder after ``order_items``)."""
    if not _LAST_USERS:
        for item in session.items:
            for name in PINNED.get(item.nodeid, ()):
                _LAST_USERS.setdefault(_group(item) or "", {})[name] = item.nodeid
    return _LAST_USERS


def order_items(items: list[pytest.Item], pinned: dict[str, list[str]]) -> None:
    """Reorder ``items`` in place: groups stay where their first test was and each group's modules are
    ordered so the tests of each pinned fixture are together (a reflected binary code over the fixtures,
    ``KEEP_SHORT`` ones as the leading digits, so each of those is one run, first); a module's tests
    keep their order. ``pinned``: {test id: the pinned fixtures it uses}. Every worker collects the
    same, so every worker agrees."""
    groups: dict[str, list[str]] = {}  # group -> its modules, in collection order
    uses: dict[tuple[str, str], set[str]] = {}  # (group, module) -> pinned fixtures its tests use
    for item in items:
        key = (_group(item) or "", _module(item))
        if key not in uses:
            groups.setdefault(key[0], []).append(key[1])
            uses[key] = set()
        uses[key].update(pinned.get(item.nodeid, ()))

    def rank(group: str, module: str) -> int:
        modules = groups[group]
        fixtures = set().union(*(uses[(group, m)] for m in modules))
        counts = {f: sum(f in uses[(group, m)] for m in modules) for f in fixtures}
        digits = sorted(counts, key=lambda f: (f not in KEEP_SHORT, KEEP_SHORT.index(f) if f in KEEP_SHORT else 0,
                                               counts[f], f))
        # The module's digits (1: uses the fixture) read as a reflected binary (Gray) code: sorted by it,
        # each digit's 1s come in as few runs as can be, the next digit's one run in the middle of the
        # previous one's. The leading digit is inverted (0: uses) so its users come first.
        value, previous = 0, 0
        for i, f in enumerate(digits):
            used = f in uses[(group, module)]
            value_bit = (used if i else not used) ^ previous  # Gray to binary: b_i = g_i xor b_(i-1)
            value = value * 2 + value_bit
            previous = value_bit
        return value

    group_first = {g: i for i, g in enumerate(groups)}
    ranks = {(g, m): (rank(g, m), groups[g].index(m)) for g in groups for m in groups[g]}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (group_first[_group(it) or ""], ranks[(_group(it) or "", _module(it))],
                               position[id(it)]))


def assign_groups(items: list[pytest.Item]) -> dict[str, list[str]]:
    """Mark each item ``xdist_group`` and order them (``order_items``); returns {group: its modules}
    (for ``--collect-only`` views)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    pinned = {item.nodeid: pinned_fixtures(item) for item in items}
    PINNED.clear()
    PINNED.update(pinned)
    _LAST_USERS.clear()
    for item in items:
        module = "module:" + _module(item)
        find(module)
        for name in pinned[item.nodeid]:
            union(module, "fixture:" + name)
    members: dict[str, list[str]] = {}
    for node in parent:
        members.setdefault(find(node), []).append(node)
    names = {}
    for root, nodes in members.items():
        fixtures = sorted(n.split(":", 1)[1] for n in nodes if n.startswith("fixture:"))
        modules = sorted(n.split(":", 1)[1] for n in nodes if n.startswith("module:"))
        fixtures.sort(key=lambda name: name not in RUN_LAST)  # a group's name starts with what makes it last
        names[root] = ("+".join(fixtures[:3]) + ("+more" if len(fixtures) > 3 else "")) if fixtures else modules[0]
    groups: dict[str, list[str]] = {}
    GROUP_FIXTURES.clear()
    for root, nodes in members.items():
        GROUP_FIXTURES[names[root]] = {n.split(":", 1)[1] for n in nodes if n.startswith("fixture:")}
    for item in items:
        group = names[find("module:" + _module(item))]
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, [])
        if _module(item) not in groups[group]:
            groups[group].append(_module(item))
    order_items(items, pinned)
    return groups


# ----------------------------------------------------------------------------- balance
DURATIONS = Path(__file__).with_name("durations.json")  # {test id: seconds} of a whole run, see main()
UNKNOWN_S = 2.0  # a test not in DURATIONS yet (most take well under that; a new e2e one takes more)


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def next_group(queue: dict[str, dict], cost: Callable[[dict], float]) -> str:
    """The group a free worker gets next: the costliest one, except that a ``runs_last`` group (nothing
    may run after it on its worker) waits until the rest of the queue would take no longer than it: then
    it goes, and the other worker takes the rest, so neither idles while the other ends the run."""
    ordinary = [group for group in queue if not runs_last(group)]
    last = [group for group in queue if runs_last(group)]
    if last and (not ordinary or sum(cost(queue[g]) for g in ordinary) <= max(cost(queue[g]) for g in last)):
        return max(last, key=lambda group: cost(queue[group]))
    return max(ordinary, key=lambda group: cost(queue[group]))


def make_scheduler(config, log):
    """``--dist loadgroup`` that hands a free worker the group expected to take longest (from
    ``tests/durations.json``) rather than the one with most tests: longest first is what keeps two
    workers ending together. None for any other ``--dist``."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    durations = load_durations()

    def seconds(nodeid: str) -> float:
        nodeid = nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid
        return durations.get(nodeid, UNKNOWN_S)

    def cost(work_unit: dict) -> float:
        return sum(seconds(nodeid) for nodeid in work_unit)

    class LongestFirst(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # Every test is in a group (tests/conftest.py marks them all), so a test id without its
            # "@group" means this pytest ignored xdist's renaming: every group would be split over the
            # workers silently (two Ray clusters, one module's tests on both workers).
            if nodeid.rfind("@") <= nodeid.rfind("]"):
                raise pytest.UsageError(
                    f"--dist loadgroup: {nodeid} has no group. This pytest ({pytest.__version__}) does not "
                    "take pytest-xdist's renaming of grouped tests; install the versions that pyproject.toml's "
                    "test extra names: pip install -e '.[test]'")
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if self.workqueue:
                self.workqueue.move_to_end(next_group(self.workqueue, cost), last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def durations_from_log(text: str) -> dict[str, float]:
    """{test id: setup + call + teardown seconds} from a log of ``pytest --durations=0``."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0].endswith("s") and parts[1] in ("setup", "call", "teardown"):
            try:
                seconds = float(parts[0][:-1])
            except ValueError:
                continue
            nodeid = parts[2].strip()
            if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's "@group" suffix (loadgroup)
                nodeid = nodeid.rsplit("@", 1)[0]
            found[nodeid] = round(found.get(nodeid, 0.0) + seconds, 2)
    return found


def main(argv: list[str] | None = None) -> int:
    """``python3 -m tests.parallel LOG``: write tests/durations.json from the log of a whole run with
    ``--durations=0 --durations-min=0`` (./scripts/test --durations=0 --durations-min=0 > LOG: every phase,
    also those under pytest's default 5 ms), so the workers stay balanced as tests change."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    found = durations_from_log(args.log.read_text(errors="replace"))
    if not found:
        parser.error(f"{args.log}: no --durations=0 lines")
    DURATIONS.write_text(json.dumps(dict(sorted(found.items())), indent=0) + "\n")
    print(f"{DURATIONS}: {len(found)} tests, {sum(found.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------- the controller's view
class WorkerTimes:
    """In the xdist controller: per worker, its tests, the seconds they took (setup + call + teardown)
    and when its last test ended; printed at the end so CI's log shows how balanced the run was."""

    def __init__(self) -> None:
        import time

        self.start = time.monotonic()
        self.seconds: dict[str, float] = {}
        self.tests: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def add(self, report) -> None:
        import time

        node = getattr(report, "node", None)  # set by xdist on reports it relays
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if worker is None:
            return
        self.seconds[worker] = self.seconds.get(worker, 0.0) + report.duration
        if report.when == "call":
            self.tests[worker] = self.tests.get(worker, 0) + 1
        self.last[worker] = time.monotonic() - self.start

    def lines(self) -> list[str]:
        return [f"{w}: {self.tests.get(w, 0)} tests, {self.seconds[w]:.0f} s in tests, last one ended at "
                f"{int(self.last[w]) // 60}m{int(self.last[w]) % 60:02d}s" for w in sorted(self.seconds)]


TIMES = WorkerTimes()
