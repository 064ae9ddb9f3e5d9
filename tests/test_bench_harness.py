"""Every benchmark uses the one harness (bench/harness.py): read, not run.

A script in ``bench/`` is a benchmark when it writes a results file: it calls ``write_results``
or names ``bench/results`` (its docstring says where its table goes) or a ``.md`` file. Helpers
that write no results are left alone. For each benchmark the source is parsed and checked:

- it imports the harness (``from harness import ...``, ``import harness`` or ``bench.harness``);
- its results go through ``write_results`` (no ``write_text``/``open`` on a results path,
  a ``.md`` file or ``args.out``);
- it has no percentile of its own (a function named like one, ``numpy.percentile``/``quantile``,
  ``statistics.quantiles``) and no turn-taking of its own (a function named like one, or a
  loop over ``range(...rounds...)`` / ``range(...repeats...)``: ``harness.take_turns`` does it).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
NOT_BENCHMARKS = {"harness.py"}
# A write to a path whose source text matches this is a results file.
RESULTS_PATH = re.compile(r"results|RESULTS|\.md\b|args\.out\b")
OWN_PERCENTILE_DEF = re.compile(r"percentile|quantile|^p\d\d$", re.I)
OWN_TURNS_DEF = re.compile(r"turns|alternat", re.I)
TURN_LOOP = re.compile(r"round|repeat", re.I)
WRITES = {"write_text", "write_bytes"}


def _scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name not in NOT_BENCHMARKS)


def _is_benchmark(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) == "write_results":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "bench/results" in node.value or re.search(r"\w\.md\b", node.value)):
            return True
    return False


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _imports_harness(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("harness", "bench.harness"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "bench" and any(a.name == "harness" for a in node.names):
            return True
        if isinstance(node, ast.Import) and any(a.name in ("harness", "bench.harness") for a in node.names):
            return True
    return False


def problems(source: str) -> list[str]:
    """What keeps a benchmark's source from using the harness for what the harness does (empty: fine)."""
    tree = ast.parse(source)
    if not _is_benchmark(tree):
        return []
    found = []
    if not _imports_harness(tree):
        found.append("does not import the harness (from harness import ...)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in WRITES and isinstance(node.func, ast.Attribute) and \
                    RESULTS_PATH.search(ast.unparse(node.func.value)):
                found.append(f"line {node.lineno}: writes a results file itself "
                             f"(({ast.unparse(node.func.value)}).{name}): use harness.write_results")
            elif name == "open" and node.args and RESULTS_PATH.search(ast.unparse(node.args[0])) and \
                    any(isinstance(a, ast.Constant) and "w" in str(a.value) for a in node.args[1:2]):
                found.append(f"line {node.lineno}: opens a results file for writing: use harness.write_results")
            elif name in ("percentile", "quantile", "nanpercentile", "quantiles") and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) != "harness":
                found.append(f"line {node.lineno}: its own percentile ({ast.unparse(node.func)}): use "
                             "harness.percentile or harness.latency_summary")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if OWN_PERCENTILE_DEF.search(node.name):
                found.append(f"line {node.lineno}: defines its own percentile ({node.name}): use harness.percentile")
            elif OWN_TURNS_DEF.search(node.name):
                found.append(f"line {node.lineno}: defines its own turn-taking ({node.name}): use harness.take_turns")
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and _called_name(node.iter) == "range" \
                and any(TURN_LOOP.search(ast.unparse(a)) for a in node.iter.args):
            found.append(f"line {node.lineno}: takes turns itself ({ast.unparse(node.iter)}): use harness.take_turns")
    return found


def test_the_benchmarks_are_found():
    benchmarks = [p.name for p in _scripts() if _is_benchmark(ast.parse(p.read_text()))]
    # The six converted in issue 33, among the others: the folder is read, not an empty list.
    assert {"backup_workers.py", "bf16.py", "recompute.py", "staleness.py", "storage.py", "training.py"} <= set(benchmarks)


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_benchmark_uses_the_harness(script: Path):
    found = problems(script.read_text())
    assert not found, f"bench/{script.name} does what bench/harness.py does, its own way:\n  " + "\n  ".join(found)


# The checker itself, on small sources: each rule catches what it is for.
OLD_STYLE = '''"""writes bench/results/x.md"""
import statistics
def percentile(v, q): return sorted(v)[int(q)]
def main(args):
    for round_index in range(args.rounds):
        for side in ("a", "b"):
            pass
    (Path(args.out) / "x.md").write_text("t")
'''
NEW_STYLE = '''"""writes bench/results/x.md"""
from harness import take_turns, percentile, write_results
def main(args):
    runs = take_turns(["a", "b"], args.rounds, lambda side, r: {})
    Path(tmp / "job.yaml").write_text("model: demo")
    write_results("x", "t", args.out)
'''


def test_the_checker_flags_each_private_copy():
    found = "\n".join(problems(OLD_STYLE))
    assert "does not import the harness" in found
    assert "defines its own percentile (percentile)" in found
    assert "takes turns itself (range(args.rounds))" in found
    assert "writes a results file itself" in found
    assert "its own percentile (np.percentile)" in "\n".join(problems(
        '"""bench/results/y.md"""\nfrom harness import write_results\nimport numpy as np\nnp.percentile([1], 50)\n'))


def test_the_checker_passes_a_harness_benchmark_and_ignores_helpers():
    assert problems(NEW_STYLE) == []
    assert problems('"""A peer server the benchmarks start."""\nimport statistics\nfor r in range(rounds): pass\n') == []
