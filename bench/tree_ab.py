"""Two source trees of modelyard, same REST load, taking turns: does a refactor cost throughput?

    python3 bench/tree_ab.py --old /path/to/old/checkout --new . [--rounds 5] [--seconds 5]

Each tree's ``modelyard serve`` (its ``src`` first on PYTHONPATH, C extensions as built in
it) serves the demo digits model; wrk sends the digits predict at c=32 to one, then the
other, ``--rounds`` times. The table (medians and every round) goes to
``bench/results/tree_ab.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine, markdown_table, median, modelyard_serve, take_turns, write_results  # noqa: E402
from serving import rest_load  # noqa: E402  (the serving benchmark's wrk helper)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, type=Path, help="checkout before the change")
    p.add_argument("--new", default=Path("."), type=Path, help="checkout after the change (default: .)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", type=Path, default=RESULTS / "tree_ab.md")
    args = p.parse_args()

    from modelyard import demo

    base_path = str(demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr)))
    body = ('{"instances": ' + str(demo.demo_instances(1).tolist()) + "}").encode()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    started_on = machine()
    with tempfile.TemporaryDirectory() as work, contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(modelyard_serve(f"{name} tree's modelyard serve", base_path,
                                                             Path(work) / f"{name}.log", source=tree, timeout=120))
                   for name, tree in trees.items()}
        for name in trees:
            (Path(work) / name).mkdir()

        def one_run(name: str, _round: int) -> dict:
            return rest_load("wrk", servers[name].predict_url, body, args.concurrency, args.seconds, Path(work) / name)

        def show(name: str, round_no: int, r: dict) -> None:
            print(f"round {round_no + 1}/{args.rounds} {name}: {r['rps']:,.0f} req/s, "
                  f"p99 {r['p99_ms']:.2f} ms, errors {r['errors']}", file=sys.stderr)

        runs = take_turns(list(trees), args.rounds, one_run, show)
    med = {name: median(r["rps"] for r in rs) for name, rs in runs.items()}
    table = markdown_table(
        ["tree", "median req/s", "rounds (req/s)", "median p99 ms", "errors"],
        [[f"{name} ({tree.name})", f"{med[name]:,.0f}", ", ".join(f"{r['rps']:,.0f}" for r in runs[name]),
          f"{median(r['p99_ms'] for r in runs[name]):.2f}", sum(r["errors"] for r in runs[name])]
         for name, tree in trees.items()], align="lllll")
    lines = [
        f"# Tree A/B: REST digits predict, c={args.concurrency}, {args.rounds} rounds x {args.seconds:g} s, taking turns",
        "",
        f"`python3 bench/tree_ab.py --old {args.old} --new {args.new}` on {started_on}.",
        "",
        table,
        "",
        f"new / old = {med['new'] / med['old']:.3f}",
    ]
    write_results("tree_ab", "\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
