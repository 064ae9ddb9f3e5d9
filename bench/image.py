"""The images of scripts/image (issue 49): build time, size, start to first answer, throughput in a container.

    python3 bench/image.py                  # build from clean, then the rest (~15-20 min on a shared 2-core machine)
    python3 bench/image.py --build cached   # the images as they are (scripts/image --if-changed), then the rest
    python3 bench/image.py --build cached --starts 2 --seconds 3 --rounds 1 --out /tmp/image.md   # a smoke run

- build: `scripts/image` after removing its images, the cached base file system and the context (the
  wheelhouse pip makes again from pip's own cache); the step times are the script's.
- size: each image as podman holds it (uncompressed) and as a registry would store it: `skopeo copy
  --dest-compress` into an OCI layout (gzip), the blobs summed. modelyard-serving (:latest) holds no
  TensorFlow (SavedModels run on the graph runtime); :full does.
- start to first answer: `podman run -d` of the textbook's line until the first 200 predict, with a cache
  volume mounted at ~/.cache (a "cached model": what the :full image's LiteRT conversions are kept in; the
  graph runtime needs none), and the first start without it.
- throughput: the same wrk client (bench/serving.py's) against `modelyard serve` on the host (its default
  runtime: LiteRT where TensorFlow converts the model) and in the container (the graph runtime: the image holds
  no TensorFlow), one batch-1 digits image per request, taking turns (harness.take_turns). The container is
  reached through `-p` (the textbook's line; like a Kubernetes Service, a NAT into the container's own network
  namespace over a veth pair), which the target is measured on; a second container of the same image on the
  host's network (`--network=host`, no NAT or veth) is measured in the same turns, to show what the container
  network costs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from harness import (REPO, ensure_tool, log, machine, markdown_table, median, modelyard_serve, take_turns,
                     write_results)
from modelyard.ports import free_port
from serving import rest_load

SERVING, PLATFORM = "localhost/modelyard-serving:latest", "localhost/modelyard-platform:latest"
SERVING_FULL = "localhost/modelyard-serving:full"
# tensorflow/serving's CPU image's compressed size as published (Docker Hub's tags page shows it per tag), in MB;
# None: no published figure could be read from here (see TF_SERVING_SIZE), and the size line says so instead
# of comparing against a guess.
TF_SERVING_PUBLISHED_MB: float | None = None
TF_SERVING_TARGET = "published figure not found from here"
TF_SERVING_SIZE = """## tensorflow/serving's size

Docker Hub's tags page (https://hub.docker.com/r/tensorflow/serving/tags) publishes each tag's compressed size.
No registry is reachable from this machine, and no stored copy of that page, nor any other published compressed
size of the CPU image (`latest` or a 2.x tag), was found. Searched (2026-11-29, the search tool's docs, pages,
issues and code corpora): Docker Hub tag and layer pages of tensorflow/serving (the stored Docker Hub pages are
other repositories'); tensorflow/serving's issues on image sizes (#138, #963, #1813, #1854, #1961, #2136: build
images, GPU sizes as screenshots, or tags without sizes); `docker images` listings and registry manifests quoting
tensorflow/serving; blog posts and tutorials on TF Serving image sizes. What was found: public `docker images`
listings give the uncompressed size of `tensorflow/serving:latest`, 215-229 MB (2019 tutorials) and 459 MB (a
2023 one), an upper bound of the compressed size; the CPU build of the model server alone (tensorflow-serving
2.14.1, https://anaconda.org/channels/rocketce/packages/tensorflow-serving/files, linux-ppc64le) is a 69 MB conda
archive; the image's Dockerfile (tensorflow/serving, tensorflow_serving/tools/docker/Dockerfile) adds that binary
and ca-certificates to an Ubuntu base, whose layer is 28.6 MB compressed for ubuntu:20.04 on amd64
(docker-library/repo-info, repos/ubuntu/remote/20.04.md). So tensorflow/serving's compressed CPU image is likely
near 100 MB; modelyard-serving's is measured above, and the line is not called met without the published figure.
`localhost/modelyard-serving:full` keeps TensorFlow for SavedModels whose ops the graph runtime lacks."""
CONF = REPO / "build" / "image" / "containers.conf"


def podman_env() -> dict:
    return {**os.environ, **({"CONTAINERS_CONF": str(CONF)} if CONF.is_file() else {})}


def podman(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def build(mode: str) -> list[tuple[str, float, list[str]]]:
    """(what, seconds of scripts/image, its step lines) per run of it. From clean: first the serving image
    alone (`--serving-only`: the base file system, the wheelhouse, the serving image), then the other two
    (the base, the wheelhouse and the serving image's layers reused): together, every image from clean."""
    if mode == "clean":
        for image in (SERVING, SERVING_FULL, PLATFORM, "localhost/modelyard-base:bookworm"):
            subprocess.run(["podman", "rmi", "--force", image], env=podman_env(), capture_output=True)
        subprocess.run(["podman", "image", "prune", "--all", "--force"], env=podman_env(), capture_output=True)
        shutil.rmtree(REPO / "build" / "image", ignore_errors=True)
        runs = [("serving image from clean", ["--serving-only"]),
                ("then serving:full and platform", [])]
    else:
        runs = [("cached (--if-changed)", ["--if-changed"])]
    out = []
    for label, flags in runs:
        start = time.monotonic()
        done = subprocess.run([str(REPO / "scripts" / "image"), *flags], cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if done.returncode:
            sys.exit(done.stdout[-3000:] + done.stderr[-3000:])
        out.append((label, seconds, [line for line in done.stdout.splitlines() if line.startswith("scripts/image:")]))
        log(f"build, {label}: {seconds:.0f} s")
    return out


def sizes(image: str) -> tuple[int, int]:
    """(uncompressed bytes as podman holds it, gzip-compressed bytes of config, manifest and layers)."""
    uncompressed = int(podman("image", "inspect", "--format", "{{.Size}}", image).strip())
    with tempfile.TemporaryDirectory(dir=REPO / "build") as layout:
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-compress", "--dest-compress-format", "gzip",
                        f"containers-storage:{image}", f"oci:{layout}:bench"], env=podman_env(), check=True)
        blobs = Path(layout, "blobs", "sha256")
        compressed = sum(p.stat().st_size for p in blobs.iterdir())
    return uncompressed, compressed


def predict_body() -> bytes:
    from modelyard.demo import demo_predict_body

    return demo_predict_body(1).encode()


def first_answer(models: Path, cache_volume: str | None, body: bytes) -> float:
    """Seconds from `podman run -d` to the first 200 predict."""
    name, rest = f"bench-image-{uuid.uuid4().hex[:8]}", free_port()
    cache = ["-v", f"{cache_volume}:/home/modelyard/.cache"] if cache_volume else []
    url = f"http://127.0.0.1:{rest}/v1/models/my_mnist_model:predict"
    start = time.monotonic()
    podman("run", "-d", "--rm", "--name", name, *cache, "-v", f"{models}:/models/my_mnist_model",
           "-p", f"127.0.0.1:{rest}:8501", "-e", "MODEL_NAME=my_mnist_model", SERVING)
    try:
        while time.monotonic() - start < 300:
            try:
                request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=5) as answer:
                    if answer.status == 200:
                        return time.monotonic() - start
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(podman("logs", name)[-3000:])
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], env=podman_env(), capture_output=True)


def wait_available(port: int, timeout: float = 120) -> None:
    """Until the container's model status answers on ``port``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/my_mnist_model", timeout=2)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no model status on port {port} after {timeout:.0f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", choices=("clean", "cached", "skip"), default="clean")
    parser.add_argument("--starts", type=int, default=5, help="cached starts to time (median)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds per throughput run")
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (each side once per round)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", default=None, help="results file (default bench/results/image.md)")
    args = parser.parse_args(argv)
    ensure_tool("wrk")
    ensure_tool("skopeo")
    from modelyard.demo import ensure_demo_model

    started, load_start = machine(), os.getloadavg()
    builds = [] if args.build == "skip" else build(args.build)
    build_seconds = sum(seconds for _label, seconds, _steps in builds)

    work = Path(tempfile.mkdtemp(prefix="bench-image-"))
    demo = ensure_demo_model(log=lambda _m: None)
    models = work / "my_mnist_model"
    shutil.copytree(demo / "0001", models / "0001")
    body = predict_body()
    volume = f"bench-image-cache-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", volume)
    try:
        uncached = first_answer(models, None, body)
        first_answer(models, volume, body)  # fills the cache volume
        cached = [first_answer(models, volume, body) for _ in range(args.starts)]
        log(f"first answer: {uncached:.1f} s without the cache, cached median {median(cached):.2f} s {cached}")

        # Throughput: the same wrk against the host's server and the containers', taking turns.
        container, rest = f"bench-image-{uuid.uuid4().hex[:8]}", free_port()
        hostnet, hostnet_rest, hostnet_grpc = f"bench-image-{uuid.uuid4().hex[:8]}", free_port(), free_port()
        podman("run", "-d", "--name", container, "-v", f"{volume}:/home/modelyard/.cache", "-v",
               f"{models}:/models/my_mnist_model", "-p", f"127.0.0.1:{rest}:8501", "-e", "MODEL_NAME=my_mnist_model",
               SERVING)
        podman("run", "-d", "--name", hostnet, "--network=host", "-v", f"{models}:/models/my_mnist_model",
               "-e", "MODEL_NAME=my_mnist_model", SERVING, f"--port={hostnet_grpc}", f"--rest_api_port={hostnet_rest}")
        host = modelyard_serve("host", models, work / "host.log", model="my_mnist_model")
        try:
            with host:
                for port in (rest, hostnet_rest):
                    wait_available(port)
                urls = {"host": host.predict_url,
                        "container": f"http://127.0.0.1:{rest}/v1/models/my_mnist_model:predict",
                        "container, --network=host": f"http://127.0.0.1:{hostnet_rest}/v1/models/my_mnist_model:predict"}
                for side in urls:  # warm all
                    rest_load("wrk", urls[side], body, args.concurrency, 2, work)
                runs = take_turns(list(urls), args.rounds,
                                  lambda side, _r: rest_load("wrk", urls[side], body, args.concurrency,
                                                             args.seconds, work))
        finally:
            for name in (container, hostnet):
                subprocess.run(["podman", "rm", "--force", "--time", "0", name], env=podman_env(), capture_output=True)
    finally:
        subprocess.run(["podman", "volume", "rm", "--force", volume], env=podman_env(), capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    load_end = os.getloadavg()
    # Sizes last: they do not depend on the load, the throughput does (measured nearer the load said above).
    size_rows = []
    for image in (SERVING, SERVING_FULL, PLATFORM):
        uncompressed, compressed = sizes(image)
        size_rows.append((image, f"{uncompressed / 1e6:.0f}", f"{compressed / 1e6:.0f}"))
        log(f"{image}: {uncompressed / 1e6:.0f} MB, {compressed / 1e6:.0f} MB compressed")
    rps = {side: median(r["rps"] for r in results) for side, results in runs.items()}
    errors = {side: sum(r["errors"] for r in results) for side, results in runs.items()}
    # The target's ratio: each round's container / host (measured back to back, the container between the host
    # and the second container in every round), the median over the rounds; a ratio of the sides' medians would
    # mix rounds run at different loads when the shared machine's load moves during the run.
    paired = {side: median(r["rps"] / h["rps"] for r, h in zip(runs[side], runs["host"]))
              for side in ("container", "container, --network=host")}
    ratio = paired["container"]
    hostnet = rps["container, --network=host"]
    serving_compressed = float(size_rows[0][2])
    if TF_SERVING_PUBLISHED_MB is None:
        size_met = "not established (see below)"
    else:
        size_met = "yes" if serving_compressed <= TF_SERVING_PUBLISHED_MB else "no"
    build_met = ("yes" if build_seconds <= 300 else "no") if args.build == "clean" else "not a clean build"
    text = "\n".join([
        "# The images (issue 49)", "", started, "",
        f"`{' '.join(['python3', 'bench/image.py', *(argv if argv is not None else sys.argv[1:])])}`", "",
        f"Load average (1, 5, 15 min) at the start {load_start[0]:.1f}, {load_start[1]:.1f}, {load_start[2]:.1f}; "
        f"at the end {load_end[0]:.1f}, {load_end[1]:.1f}, {load_end[2]:.1f} (2 cores shared with other work).", "",
        "| measure | target | measured | met |", "| --- | --- | ---: | --- |",
        f"| build ({args.build}), all three images | <= 300 s from clean | {build_seconds:.0f} s | {build_met} |",
        *([f"| build from clean, the serving image alone (`scripts/image --serving-only`) | | {builds[0][1]:.0f} s | |"]
          if args.build == "clean" else []),
        f"| serving image, compressed | <= tensorflow/serving's ({TF_SERVING_TARGET}) | {serving_compressed:.0f} MB "
        f"| {size_met} |",
        f"| start to first answer, cached model | <= 3 s | {median(cached):.2f} s (median of {len(cached)}; "
        f"{min(cached):.2f}-{max(cached):.2f}) | {'yes' if median(cached) <= 3 else 'no'} |",
        f"| start to first answer, first start (no cache volume) | | {uncached:.1f} s | |",
        f"| REST predicts/s, container (`-p`) / host, each round's ratio, median | >= 0.9 | {ratio:.2f} (medians "
        f"{rps['container']:.0f} / {rps['host']:.0f} = {rps['container'] / rps['host']:.2f}) | "
        f"{'yes' if ratio >= 0.9 else 'no'} |",
        f"| REST predicts/s, container (`--network=host`) / host, likewise | | "
        f"{paired['container, --network=host']:.2f} (medians {hostnet:.0f} / {rps['host']:.0f} = "
        f"{hostnet / rps['host']:.2f}) | |",
        "", "## Build steps", "",
        *[line for label, seconds, steps in builds
          for line in (f"{label}: {seconds:.0f} s", "", "```text", *steps, "```", "")],
        "## Sizes (MB)", "", markdown_table(["image", "uncompressed", "compressed (gzip layers)"], size_rows), "",
        "## Throughput runs", "",
        markdown_table(["side", "round", "requests/s", "/ host's that round", "p50 ms", "p99 ms", "errors"],
                       [(side, i + 1, f"{r['rps']:.0f}", f"{r['rps'] / runs['host'][i]['rps']:.2f}",
                         f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", r["errors"])
                        for side, results in runs.items() for i, r in enumerate(results)]),
        "", f"{args.rounds} rounds; wrk, 1 thread, {args.concurrency} connections, {args.seconds:g} s per "
        "run, one digits image per request; the sides take turns (the order reversed every other round); errors: "
        + ", ".join(f"{side} {count}" for side, count in errors.items()) + ". The host's server runs its default "
        "runtime (LiteRT, TensorFlow converting the model at load); the image holds no TensorFlow and runs the "
        "graph runtime (src/modelyard/model/graph, its dense layers in C: bench/graph_runtime.py compares the two "
        "runtimes on the host).",
        "", TF_SERVING_SIZE,
    ])
    write_results("image", text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
