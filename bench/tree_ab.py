"""Two source trees of modelyard, same REST load, taking turns: does a refactor cost throughput?

    python3 bench/tree_ab.py --old /path/to/old/checkout --new . [--rounds 5] [--seconds 5]

Each tree's ``modelyard serve`` (its ``src`` first on PYTHONPATH, C extensions as built in
it) serves the demo digits model; wrk sends the digits predict at c=32 to one, then the
other, ``--rounds`` times. The table (medians and every round) goes to
``bench/results/tree_ab.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import rest_load  # noqa: E402  (the serving benchmark's wrk helper)

from modelyard.ports import free_port  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def start(tree: Path, base_path: str, log: Path) -> tuple[subprocess.Popen, int]:
    rest, grpc = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelyard", "serve", "--model_name", "m", "--model_base_path", base_path,
         "--rest_api_port", str(rest), "--port", str(grpc)],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{rest}/v1/models/m", timeout=1).ok:
                return proc, rest
        except requests.ConnectionError:
            time.sleep(0.3)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"server from {tree} did not start; see {log}")


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
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as work:
        for name in trees:
            (Path(work) / name).mkdir()
        servers = {name: start(tree, base_path, Path(work) / f"{name}.log") for name, tree in trees.items()}
        try:
            for round_no in range(args.rounds):
                order = list(trees) if round_no % 2 == 0 else list(reversed(list(trees)))
                for name in order:
                    url = f"http://127.0.0.1:{servers[name][1]}/v1/models/m:predict"
                    r = rest_load("wrk", url, body, args.concurrency, args.seconds, Path(work) / name)
                    runs[name].append(r)
                    print(f"round {round_no + 1}/{args.rounds} {name}: {r['rps']:,.0f} req/s, "
                          f"p99 {r['p99_ms']:.2f} ms, errors {r['errors']}", file=sys.stderr)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(10)
    med = {name: statistics.median(r["rps"] for r in rs) for name, rs in runs.items()}
    lines = [
        f"# Tree A/B: REST digits predict, c={args.concurrency}, {args.rounds} rounds x {args.seconds:g} s, taking turns",
        "",
        "| tree | median req/s | rounds (req/s) | median p99 ms | errors |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, tree in trees.items():
        rs = runs[name]
        rounds = ", ".join(f"{r['rps']:,.0f}" for r in rs)
        p99 = statistics.median(r["p99_ms"] for r in rs)
        lines.append(f"| {name} ({tree.name}) | {med[name]:,.0f} | {rounds} | {p99:.2f} | {sum(r['errors'] for r in rs)} |")
    lines += ["", f"new / old = {med['new'] / med['old']:.3f}", ""]
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
