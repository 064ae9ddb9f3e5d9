"""tests/parallel.py: the groups that keep each expensive session fixture in one xdist worker, the
builds shared by the workers, and the durations that balance them."""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from tests import parallel


def _group(item: pytest.Item) -> str:
    marks = [m.args[0] for m in item.iter_markers("xdist_group")]
    assert len(marks) == 1, f"{item.nodeid}: xdist_group marks {marks}"
    return marks[0]


def test_every_test_of_a_pinned_fixture_and_of_a_module_is_in_one_group(request):
    # Over whatever this run collected (the whole suite in ./scripts/test).
    by_fixture: dict[str, set[str]] = {}
    by_module: dict[str, set[str]] = {}
    for item in request.session.items:
        group = _group(item)
        by_module.setdefault(item.nodeid.split("::")[0], set()).add(group)
        for name in parallel.pinned_fixtures(item):
            by_fixture.setdefault(name, set()).add(group)
    assert {m: g for m, g in by_module.items() if len(g) > 1} == {}
    assert {f: g for f, g in by_fixture.items() if len(g) > 1} == {}


def test_the_suites_process_fixtures_are_pinned_and_file_builders_are_not(request):
    from tests.classify import _fixturedefs

    def pinned(name: str) -> bool:
        return any(parallel._pinned(d) for d in _fixturedefs(request.node, name) if d.argname == name)

    for name in ("gcs_emulator", "monitoring_config", "tiny_models", "demo_cache", "generated_tfserving"):
        assert _fixturedefs(request.node, name), name
    assert pinned("gcs_emulator")  # a storage process the tests talk to
    assert not pinned("tiny_models") and not pinned("demo_cache") and not pinned("monitoring_config")


def test_the_browsers_group_is_handed_out_last(request):
    # Playwright's sync API leaves its loop marked running in the worker: nothing may run after it there.
    # Over whatever this run collected (the whole suite in ./scripts/test: the web tests' one group).
    groups = {_group(item) for item in request.session.items if "browser" in item.fixturenames}
    assert all(parallel.runs_last(g) for g in groups), groups
    browser = min(groups, default="browser+demo_server")
    cost = len
    tests = {str(i): False for i in range(10)}
    big, small = dict(list(tests.items())[:8]), dict(list(tests.items())[8:])
    queue = {browser: dict(tests), "big": big, "small": small, "tiny": {}}
    # The rest (8 + 2 + 1) would take longer than the browser's group (10): it waits; the costliest goes first.
    assert parallel.next_group({**queue, "one more": {"x": False}}, cost) == "big"
    # Once the rest is no longer than the browser's group, the browser's goes, the other worker takes the rest.
    assert parallel.next_group(queue, cost) == browser
    assert parallel.next_group({browser: queue[browser], "tiny": {}}, cost) == browser
    assert parallel.next_group({browser: queue[browser]}, cost) == browser
    assert parallel.next_group({"small": small, "tiny": {}}, cost) == "small"


def _build_in(args) -> str:
    base, worker, log = args
    os.environ["PYTEST_XDIST_WORKER"] = worker
    import importlib

    module = importlib.reload(parallel)

    class Factory:
        def getbasetemp(self):
            return Path(base) / f"popen-{worker}"

    def build(directory: Path) -> str:
        with open(log, "a") as f:
            f.write(worker + "\n")
        (directory / "model.txt").write_text("built")
        return str(directory / "model.txt")

    directory, value = module.build_once(Factory(), "thing", build)
    assert Path(value).read_text() == "built" and Path(value).parent == directory
    return value


def test_build_once_builds_once_for_every_worker(tmp_path):
    log = tmp_path / "builds.log"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        values = pool.map(_build_in, [(str(tmp_path), "gw0", str(log)), (str(tmp_path), "gw1", str(log))])
    assert values[0] == values[1]
    assert len(log.read_text().split()) == 1  # the second worker waited and reused the first's


def test_durations_from_a_log_sum_each_tests_phases_and_drop_xdists_group_suffix():
    log = """============================= slowest durations ==============================
12.50s call     tests/platform/test_cli.py::test_a@gcs_emulator+guarded+platform+more
1.25s setup    tests/platform/test_cli.py::test_a@gcs_emulator+guarded+platform+more
0.01s teardown tests/x.py::test_b[a b@c]
3 passed in 1.00s"""
    assert parallel.durations_from_log(log) == {"tests/platform/test_cli.py::test_a": 13.75, "tests/x.py::test_b[a b@c]": 0.01}



_MINI_CONFTEST = '''
import os, subprocess, pytest
from tests.parallel import assign_groups, release_finished_group

def note(line):
    with open(os.environ["EVENTS"], "a") as f:
        f.write(line + "\\n")

@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "600"])
    note("start")
    yield proc
    proc.kill()
    proc.wait()
    note("stop")

def pytest_collection_modifyitems(items):
    assign_groups(items)

@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    release_finished_group(item, nextitem)
    return result
'''


def _events_of_run(folder: Path, *modules: str) -> list[str]:
    """Run ``modules`` in ``folder`` (its conftest: _MINI_CONFTEST) on one xdist worker under ``--dist
    loadgroup``; returns the lines its fixtures and tests noted, in order."""
    import subprocess
    import sys

    events = folder / "events"
    env = {**os.environ, "EVENTS": str(events), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist",
                           "loadgroup", *modules], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return events.read_text().splitlines()


def test_a_groups_process_fixture_stops_after_its_last_test_not_at_the_end(tmp_path):
    (tmp_path / "conftest.py").write_text(_MINI_CONFTEST)
    (tmp_path / "test_uses_server.py").write_text(
        "from conftest import note\n"
        "def test_one(server): note('server test')\n"
        "def test_two(server): note('server test')\n")
    (tmp_path / "test_other.py").write_text(
        "from conftest import note\n" + "".join(f"def test_{i}(): note('other test')\n" for i in range(3)))
    seen = _events_of_run(tmp_path, "test_uses_server.py", "test_other.py")
    assert seen.count("start") == 1 and seen.count("stop") == 1, seen
    served = [i for i, line in enumerate(seen) if line == "server test"]
    others = [i for i, line in enumerate(seen) if line == "other test"]
    stop = seen.index("stop")
    assert len(served) == 2 and len(others) == 3, seen
    # The server's module is collected first, so its group runs first: it stops before the other group begins
    # (it used to stop at the session's end, after every other test).
    assert served[-1] < stop < others[0], seen


_TWO_FIXTURES = """

@pytest.fixture(scope="session")
def ray_cluster():  # named as tests/parallel.KEEP_SHORT names the costly one; a plain process here
    proc = subprocess.Popen(["sleep", "600"])
    note("cluster start")
    yield proc
    proc.kill()
    proc.wait()
    note("cluster stop")
"""


def test_a_costly_fixture_runs_first_in_its_group_and_stops_after_its_last_user(tmp_path):
    """One group (every module uses ``server``); only the last module collected uses the costly
    ``ray_cluster``: it runs first, and the cluster stops right after it, while the group goes on."""
    (tmp_path / "conftest.py").write_text(_MINI_CONFTEST + _TWO_FIXTURES)
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "from conftest import note\n" + "".join(f"def test_{i}(server): note('{name}')\n" for i in range(2)))
    (tmp_path / "test_c.py").write_text(
        "from conftest import note\n" + "".join(f"def test_{i}(server, ray_cluster): note('c')\n" for i in range(2)))
    seen = _events_of_run(tmp_path, "test_a.py", "test_b.py", "test_c.py")
    tests = [line for line in seen if line in ("a", "b", "c")]
    assert tests == ["c", "c", "a", "a", "b", "b"], seen  # the cluster's module first, the others in order
    assert seen.count("cluster start") == 1 and seen.count("cluster stop") == 1, seen
    assert seen.index("cluster stop") < seen.index("a"), seen  # stopped once its last user was done
    assert seen.count("start") == 1 and seen.index("stop") > len(seen) - 2, seen  # the shared one at the end
