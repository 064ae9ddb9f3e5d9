"""The graph runtime (TensorFlow-free NumPy executor) against the default runtime (LiteRT here), on the host.

    python3 bench/graph_runtime.py                        # 3 rounds of 10 s per server, both models
    python3 bench/graph_runtime.py --seconds 3 --rounds 1 --out /tmp/g.md   # a smoke run

Issue 49's throughput line (container >= 0.9x the host) compares the serving image, which runs SavedModels on
the graph runtime, with `modelyard serve` on the host, which runs them on LiteRT. This measures the runtimes
without containers: `modelyard serve` with the default runtime and with `--runtime graph`, the same wrk client
(bench/serving.py's), one batch-1 request per call, the servers taking turns (harness.take_turns), for
- demo: the Quickstart's `my_mnist_model` (uint8 image, Rescaling, Flatten, Dense relu, Dense softmax);
- mlp: the textbook's MNIST MLP (float32 28x28, Flatten, Dense 300 relu, Dense 100 relu, Dense 10 softmax),
  exported with `model.export` as its notebook does.
It also times `servable.run` in this process (no server): the runtime's own cost per request.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import timeit
from pathlib import Path

from harness import REPO, command_line, log, machine, markdown_table, median, modelyard_serve, take_turns, write_results
from serving import rest_load

sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RUNTIMES = ("default", "graph")


def export_mlp(root: Path) -> Path:
    """The textbook's MNIST MLP (untrained: the weights do not change the cost), exported as version 1."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                              keras.layers.Dense(300, activation="relu"), keras.layers.Dense(100, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    path = root / "mlp"
    model.export(str(path / "1"), verbose=False)
    return path


def models(work: Path) -> dict[str, tuple[Path, bytes, dict]]:
    """name -> (model base path, REST body, {input alias: one instance as an array})."""
    from modelyard.demo import demo_instances, ensure_demo_model

    images = demo_instances(1)
    demo = work / "demo"
    shutil.copytree(ensure_demo_model(log=lambda _m: None) / "0001", demo / "1")
    pixels = (images / 255.0).astype("float32")
    return {"demo": (demo, json.dumps({"instances": images.tolist()}, separators=(",", ":")).encode(), {"image": images}),
            "mlp": (export_mlp(work), json.dumps({"instances": pixels.round(4).tolist()}, separators=(",", ":")).encode(),
                    {"keras_tensor": pixels})}


def in_process_us(path: Path, inputs: dict, number: int) -> dict[str, tuple[str, float]]:
    """runtime -> (servable class, microseconds per ``run`` of serving_default, best of 3)."""
    from modelyard.model.runtime.choose_runtime import choose_runtime, graph_servable
    from modelyard.model.runtime.tf_session import load_saved_model

    out = {}
    for runtime in RUNTIMES:
        servable = graph_servable(path, "graph") if runtime == "graph" else choose_runtime(load_saved_model(path),
                                                                                            "auto")
        sig = servable.signatures["serving_default"]
        outputs = tuple(sig.outputs)
        servable.run(sig, inputs, outputs)
        best = min(timeit.repeat(lambda: servable.run(sig, inputs, outputs), number=number, repeat=3)) / number
        out[runtime] = (type(servable).__name__, best * 1e6)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (each server once per round)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--models", default="demo,mlp")
    parser.add_argument("--out", default=None, help="results file (default bench/results/graph_runtime.md)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-graph-runtime-"))
    try:
        all_models = models(work)
        chosen = {name: all_models[name] for name in args.models.split(",")}
        micro = {name: in_process_us(path / "1", inputs, 5000) for name, (path, _body, inputs) in chosen.items()}
        for name, row in micro.items():
            log(f"{name} in process: {row}")
        runs: dict[tuple[str, str], list[dict]] = {}
        for name, (path, body, _inputs) in chosen.items():
            servers = {runtime: modelyard_serve(runtime, path, work / f"{name}-{runtime}.log",
                                                *(["--runtime", "graph"] if runtime == "graph" else []), model=name)
                       for runtime in RUNTIMES}
            for server in servers.values():
                server.__enter__()
            try:
                for runtime, server in servers.items():  # warm both
                    rest_load("wrk", server.predict_url, body, args.concurrency, 2, work)
                turns = take_turns(list(RUNTIMES), args.rounds,
                                   lambda runtime, _r: rest_load("wrk", servers[runtime].predict_url, body,
                                                                 args.concurrency, args.seconds, work))
                for runtime, results in turns.items():
                    runs[(name, runtime)] = results
            finally:
                for server in servers.values():
                    server.__exit__(None, None, None)
            (work / "post.lua").unlink(missing_ok=True)  # the next model's body
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()

    summary = []
    for name in chosen:
        rps = {rt: median(r["rps"] for r in runs[(name, rt)]) for rt in RUNTIMES}
        p50 = {rt: median(r["p50_ms"] for r in runs[(name, rt)]) for rt in RUNTIMES}
        summary.append((name, f"{rps['default']:.0f}", f"{rps['graph']:.0f}", f"{rps['graph'] / rps['default']:.2f}",
                        f"{p50['default']:.2f} / {p50['graph']:.2f}",
                        f"{micro[name]['default'][1]:.1f} ({micro[name]['default'][0]})",
                        f"{micro[name]['graph'][1]:.1f}"))
    text = "\n".join([
        "# The graph runtime against the default runtime, on the host (issue 49)", "", machine(), "",
        f"`{command_line()}`", "",
        f"Load average (1, 5, 15 min) at the start {load_start[0]:.1f}, {load_start[1]:.1f}, {load_start[2]:.1f}; "
        f"at the end {load_end[0]:.1f}, {load_end[1]:.1f}, {load_end[2]:.1f} (2 cores shared with other work).", "",
        markdown_table(["model", "default req/s", "graph req/s", "graph / default", "p50 ms default / graph",
                        "servable.run us, default", "servable.run us, graph"], summary), "",
        f"Medians of {args.rounds} rounds; wrk, 1 thread, {args.concurrency} connections, {args.seconds:g} s per run, "
        "one batch-1 request per call; servable.run: best of 3 x 5000 calls in the bench's own process.", "",
        "## Runs", "",
        markdown_table(["model", "runtime", "round", "requests/s", "p50 ms", "p99 ms", "errors"],
                       [(name, rt, i + 1, f"{r['rps']:.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", r["errors"])
                        for (name, rt), results in runs.items() for i, r in enumerate(results)]),
    ])
    write_results("graph_runtime", text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
