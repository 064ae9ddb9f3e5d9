"""Control-plane scale: create thousands of endpoints through the REST API while a client predicts.

    python3 bench/endpoints_scale.py                    # 3,000 endpoints, writes bench/results/endpoints_scale.md
    python3 bench/endpoints_scale.py --endpoints 300 --out /tmp/es.md     # a quick check

One `modelyard platform` (temporary store, SQLite) deploys the digits demo model (version 0001, one
replica) on one endpoint. A predict client (its own process, one keep-alive connection, one batch-1
image per request, back to back) runs throughout. Three windows take turns, ``--turns`` rounds (10),
the order reversed every other round: **idle** (the client alone), **control** (``--creators`` threads
sending as many POSTs at the same pace to a null server: what the clients' own CPU and the kernel cost
the predicts on this machine), and **creating** (the same threads create ``--endpoints`` / ``--turns``
endpoints with ``POST .../endpoints``, each on its own keep-alive connection). Creations are paced at
``--rate`` a second (default 120: 3,000 in 25 s, inside the target's 30 s); ``--rate 0`` sends them as
fast as the platform answers. Each round's windows are seconds apart, so the result is each round's
p99 ratios (creating / idle, creating / control, control / idle), their median and their spread, as
well as every window pooled. ``--compare-writer`` (root) adds a fourth window each round: as many
creations with the platform's store writer at SCHED_IDLE instead of its normal CPU policy
(``dataplane/priority.py`` says why that is not its default). A last step lists the endpoints by pages of 100 (``pageSize``/``pageToken``)
and times one filtered list.

Issue 43's target: 3,000 endpoints created in <= 30 s with predict p99 <= 1.2 x its idle value.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode, urlparse

ROOT = Path(__file__).resolve().parent
PARENT = "projects/local/locations/us-central1"
DATAPLANE_MODULE = "modelyard.platform.dataplane.process"
SIDES = ("idle", "control", "creating")
WRITER_IDLE = "creating, writer SCHED_IDLE"  # --compare-writer's side
WRITER_THREAD = "store-writer"  # its name in ps -L (dataplane/priority.py)
TARGET = 1.2  # issue 43: predict p99 while creating <= 1.2x idle
EXCESS_MS = 1.0  # the target proposed instead: creating p99 <= 1.2x control p99 + this (median of the rounds)

sys.path.insert(0, str(ROOT))
from harness import (latency_summary, log, machine, markdown_table, median, modelyard_platform,  # noqa: E402
                     command_line, take_turns, write_results)


class Conn:
    """One keep-alive HTTP connection to the platform."""

    def __init__(self, base: str) -> None:
        u = urlparse(base)
        self.c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.c.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = self.c.getresponse()
        return r.status, r.read()

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        status, data = self.call(method, path, json.dumps(body).encode() if body is not None else None)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return json.loads(data)


def wait(conn: Conn, op: dict) -> dict:
    while not op.get("done"):
        time.sleep(0.2)
        op = conn.json("GET", f"/v1/{op['name']}")
    if "error" in op:
        raise RuntimeError(op["error"])
    return op["response"]


def predictor(base: str, endpoint: str, body: bytes, stop, out) -> None:
    """Predicts back to back until ``stop``; sends [(sent at, seconds, status)] to ``out``."""
    conn = Conn(base)
    path = f"/v1/{PARENT}/endpoints/{endpoint}:predict"
    seen = []
    while not stop.is_set():
        sent = time.time()
        t0 = time.perf_counter()
        status, _ = conn.call("POST", path, body)
        seen.append((sent, time.perf_counter() - t0, status))
    out.send(seen)


def null_server(port_out) -> None:
    """An HTTP server that answers every request with a done operation and does nothing else (its own
    process): the creators' load without the platform's work, for the control phase."""
    import asyncio

    import httptools

    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n"
              b'{"done": true}')

    class Proto(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(answer)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve())


def create_all(base: str, count: int, creators: int, rate: float = 0.0, first: int = 0) -> tuple[float, list[str]]:
    """(wall seconds, failures) of ``count`` endpoint creations by ``creators`` threads (named from number
    ``first`` on); ``rate`` > 0: the i-th is sent no earlier than i / rate seconds after the first (else as
    fast as they answer)."""
    failures: list[str] = []
    lock = threading.Lock()
    next_i = iter(range(count))

    def run() -> None:
        conn = Conn(base)
        while True:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            if rate > 0:
                time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            n = first + i
            status, data = conn.call("POST", f"/v1/{PARENT}/endpoints",
                                     json.dumps({"displayName": f"scale-{n:05d}", "labels": {"n": str(n % 10)}}).encode())
            if status != 200 or not json.loads(data).get("done"):
                with lock:
                    failures.append(f"{status} {data[:200]!r}")

    threads = [threading.Thread(target=run) for _ in range(creators)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, failures


def cpu_snapshot(platform_pid: int, state_dir: Path, client_pid: int, null_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of each part: the platform's event-loop thread and its other
    threads, its replicas (processes naming its state directory), the predict client, this process
    (the creators) and the null server."""
    import psutil

    out = {"platform: event-loop thread": 0.0, "platform: other threads": 0.0, "data-plane process": 0.0,
           "replica": 0.0, "predict client": 0.0, "creators (this process)": 0.0, "null server": 0.0}
    platform = psutil.Process(platform_pid)
    for t in platform.threads():
        out["platform: event-loop thread" if t.id == platform_pid else "platform: other threads"] += t.user_time + t.system_time
    marker = str(state_dir)
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] != platform_pid and marker in cmdline:
            role = "data-plane process" if DATAPLANE_MODULE in cmdline else "replica"
            out[role] += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    for pid, role in ((client_pid, "predict client"), (None, "creators (this process)"), (null_pid, "null server")):
        times = psutil.Process(pid).cpu_times()
        out[role] += times.user + times.system
    return out


def store_writer(platform_pid: int) -> int:
    """The thread id of the platform's store writer (named by dataplane/priority.py)."""
    for tid in os.listdir(f"/proc/{platform_pid}/task"):
        if Path(f"/proc/{platform_pid}/task/{tid}/comm").read_text().strip() == WRITER_THREAD:
            return int(tid)
    raise SystemExit(f"the platform (pid {platform_pid}) has no thread named {WRITER_THREAD}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=3000)
    ap.add_argument("--creators", type=int, default=8, help="threads creating endpoints at once")
    ap.add_argument("--rate", type=float, default=120.0,
                    help="creations per second (3,000 in 25 s; 0: as fast as the platform answers)")
    ap.add_argument("--idle-seconds", type=float, default=None,
                    help="each round's idle window (default: as long as a round's creation at --rate, else 5)")
    ap.add_argument("--turns", type=int, default=10,
                    help="rounds of idle / control / creating windows (--endpoints split evenly over them)")
    ap.add_argument("--compare-writer", action="store_true",
                    help="a fourth window each round: as many creations with the platform's store writer at SCHED_IDLE "
                         "instead of the normal CPU policy (dataplane/priority.py); needs root (raising a thread back "
                         "from SCHED_IDLE after the window takes CAP_SYS_NICE)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/endpoints_scale.md)")
    args = ap.parse_args()
    sides = SIDES + ((WRITER_IDLE,) if args.compare_writer else ())
    creating_sides = [side for side in sides if side.startswith("creating")]
    if args.compare_writer and os.geteuid() != 0:
        ap.error("--compare-writer needs root: a thread at SCHED_IDLE is raised back only with CAP_SYS_NICE")
    if args.idle_seconds is None:
        args.idle_seconds = (args.endpoints // args.turns) / args.rate if args.rate > 0 else 5.0

    from modelyard import demo

    start_load = os.getloadavg()[0]
    base_dir = demo.ensure_demo_model(log=lambda m: print(m, file=sys.stderr))
    body = demo.demo_predict_body(1).encode()
    with tempfile.TemporaryDirectory(prefix="endpoints-scale-") as tmp, \
            modelyard_platform(Path(tmp), "--artifact-root", str(base_dir)) as p:
        api = Conn(p.base)
        model = wait(api, api.json("POST", f"/v1/{PARENT}/models:upload", {
            "model": {"displayName": "digits", "artifactUri": str(Path(base_dir) / "0001")}}))["model"]
        ep = wait(api, api.json("POST", f"/v1/{PARENT}/endpoints", {"displayName": "serving"}))["name"].rsplit("/", 1)[-1]
        wait(api, api.json("POST", f"/v1/{PARENT}/endpoints/{ep}:deployModel", {"deployedModel": {
            "model": model, "automaticResources": {"minReplicaCount": 1, "maxReplicaCount": 1}}}))
        ctx = mp.get_context("fork")
        stop, (recv, send) = ctx.Event(), ctx.Pipe(duplex=False)
        client = ctx.Process(target=predictor, args=(p.base, ep, body, stop, send))
        client.start()
        null_recv, null_send = ctx.Pipe(duplex=False)
        null = ctx.Process(target=null_server, args=(null_send,), daemon=True)
        null.start()
        null_base = f"http://127.0.0.1:{null_recv.recv()}"

        def snapshot() -> dict[str, float]:
            return cpu_snapshot(p.proc.pid, p.state_dir, client.pid, null.pid)

        time.sleep(2.0)  # warm-up: connections, the replica's first answers (not counted)
        # The sides take turns (the order reversed every other round), so the machine's drifting load
        # falls on all of them alike. The control: the same creators, at the same rate, against a server
        # that does nothing: what the clients' own CPU and the kernel's cost the predicts on this machine.
        per_turn = args.endpoints // args.turns
        created = iter(range(0, args.endpoints * len(creating_sides), per_turn))
        writer = store_writer(p.proc.pid) if args.compare_writer else None

        def run(side: str, round_no: int) -> dict:
            t0, cpu0 = time.time(), snapshot()
            out: dict = {}
            if side == "idle":
                time.sleep(args.idle_seconds)
            elif side == "control":
                out["seconds"], _ = create_all(null_base, per_turn, args.creators, args.rate)
            else:
                if side == WRITER_IDLE:
                    os.sched_setscheduler(writer, os.SCHED_IDLE, os.sched_param(0))
                try:
                    out["seconds"], out["failures"] = create_all(p.base, per_turn, args.creators, args.rate,
                                                                 next(created))
                finally:
                    if side == WRITER_IDLE:
                        os.sched_setscheduler(writer, os.SCHED_OTHER, os.sched_param(0))
                out["load"] = os.getloadavg()[0]
            t1, cpu1 = time.time(), snapshot()
            time.sleep(1.0)  # the last answers' wake settles before the next side (not counted)
            return {**out, "from": t0, "to": t1, "cpu": (cpu0, cpu1)}

        log(f"{args.turns} rounds of: idle {args.idle_seconds:g} s, {per_turn} POSTs to a null server, "
            f"{per_turn} endpoint creations ({args.creators} threads, {args.rate:g}/s)"
            + (", as many with the store writer at SCHED_IDLE" if writer else "") + " ...")
        turns = take_turns(sides, args.turns, run, report=lambda side, n, r: log(
            f"round {n + 1}/{args.turns} {side}: {r['to'] - r['from']:.1f} s"))
        null.kill()
        stop.set()
        seen = recv.recv()
        client.join(30)

        api = Conn(p.base)  # a new connection: the first one sat idle past the platform's idle timeout
        t0 = time.perf_counter()
        listed, token, pages = 0, None, 0
        while True:
            query = {"pageSize": 100, **({"pageToken": token} if token else {})}
            page = api.json("GET", f"/v1/{PARENT}/endpoints?{urlencode(query)}")
            listed += len(page.get("endpoints", []))
            pages += 1
            token = page.get("nextPageToken")
            if not token:
                break
        list_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        one = api.json("GET", f"/v1/{PARENT}/endpoints?" + urlencode({"filter": 'display_name="scale-01234"'}))
        filter_s = time.perf_counter() - t0

    def window(side: str, t: dict) -> list[float]:
        return [sec for at, sec, st in seen if t["from"] <= at < t["to"] and st == 200]

    pooled = {side: [sec for t in turns[side] for sec in window(side, t)] for side in sides}
    bad = [st for at, sec, st in seen if st != 200]
    failures = [f for side in creating_sides for t in turns[side] for f in t["failures"]]
    create_s = sum(t["seconds"] for t in turns["creating"])
    i, c, d = (latency_summary(pooled[side]) for side in SIDES)
    rows = [(f"predict {q} (ms)", f"{i[k]:.2f}", f"{c[k]:.2f}", f"{d[k]:.2f}", f"{c[k] / i[k]:.2f}x", f"{d[k] / i[k]:.2f}x",
             f"{d[k] / c[k]:.2f}x") for q, k in (("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"))]
    rows += [("predict max (ms)", f"{i['max_ms']:.1f}", f"{c['max_ms']:.1f}", f"{d['max_ms']:.1f}", "", "", ""),
             ("predicts counted", len(pooled["idle"]), len(pooled["control"]), len(pooled["creating"]), "", "", "")]
    # Each round's p99 of each window, and its ratios: a round's windows are seconds apart, so the
    # machine's load moved less between them than over the whole run; the median of the rounds'
    # ratios is what one run says, their spread how much one window's p99 is worth on this machine.
    per_round = [{side: latency_summary(window(side, turns[side][n]))["p99_ms"] for side in SIDES}
                 for n in range(args.turns)]
    ratios = {"creating / idle": [r["creating"] / r["idle"] for r in per_round],
              "creating / control": [r["creating"] / r["control"] for r in per_round],
              "control / idle": [r["control"] / r["idle"] for r in per_round]}
    round_rows = [(n + 1, f"{r['idle']:.2f}", f"{r['control']:.2f}", f"{r['creating']:.2f}",
                   *(f"{ratios[k][n]:.2f}x" for k in ratios),
                   f"{turns['creating'][n]['seconds']:.1f}", f"{turns['creating'][n]['load']:.1f}")
                  for n, r in enumerate(per_round)]
    round_rows.append(("**median**", *(f"{median(r[side] for r in per_round):.2f}" for side in SIDES),
                       *(f"**{median(v):.2f}x**" for v in ratios.values()), "", ""))
    round_rows.append(("min - max", *(f"{min(r[side] for r in per_round):.2f} - {max(r[side] for r in per_round):.2f}"
                                      for side in SIDES),
                       *(f"{min(v):.2f}x - {max(v):.2f}x" for v in ratios.values()), "", ""))
    within = sum(v <= TARGET for v in ratios["creating / idle"])
    # The target proposed in bench/results/endpoints_scale.md: creating p99 <= 1.2x the control window's + 1 ms
    # (about one create's control-plane CPU, which a predict landing behind it waits for), median of the rounds.
    excess = median(r["creating"] - TARGET * r["control"] for r in per_round)
    summary = (f"median of the rounds' p99 ratios: creating / idle **{median(ratios['creating / idle']):.2f}x**, "
               f"creating / control **{median(ratios['creating / control']):.2f}x**, "
               f"control / idle **{median(ratios['control / idle']):.2f}x**; "
               f"{within} of {args.turns} rounds within {TARGET}x idle; pooled p99 creating / idle {d['p99_ms'] / i['p99_ms']:.2f}x; "
               f"median of the rounds' creating p99 - {TARGET}x control p99: **{excess:+.2f} ms** "
               f"({'within' if excess <= EXCESS_MS else 'over'} the proposed {EXCESS_MS:g} ms)")

    compare = []
    if args.compare_writer:
        idle_w = [latency_summary(window(WRITER_IDLE, turns[WRITER_IDLE][n]))["p99_ms"] for n in range(args.turns)]
        idle_over_normal = [w / r["creating"] for r, w in zip(per_round, idle_w)]
        pooled_idle_w = latency_summary(pooled[WRITER_IDLE])
        seconds = {side: sum(t["seconds"] for t in turns[side]) for side in creating_sides}
        compare = [
            "The store writer at SCHED_IDLE, compared in the same rounds (a fourth window each round: as many "
            "creations with the writer at SCHED_IDLE; the order of the four reversed every other round):",
            markdown_table(["round", "idle p99 (ms)", "creating, writer normal: p99 (ms)",
                            "creating, writer SCHED_IDLE: p99 (ms)", "SCHED_IDLE / normal", "SCHED_IDLE / idle",
                            "creation (s), normal / SCHED_IDLE"],
                           [(n + 1, f"{r['idle']:.2f}", f"{r['creating']:.2f}", f"{w:.2f}", f"{x:.2f}x",
                             f"{w / r['idle']:.2f}x", f"{turns['creating'][n]['seconds']:.1f} / "
                                                      f"{turns[WRITER_IDLE][n]['seconds']:.1f}")
                            for n, (r, w, x) in enumerate(zip(per_round, idle_w, idle_over_normal))]
                           + [("**median**", f"{median(r['idle'] for r in per_round):.2f}",
                               f"{median(r['creating'] for r in per_round):.2f}", f"{median(idle_w):.2f}",
                               f"**{median(idle_over_normal):.2f}x**",
                               f"**{median(w / r['idle'] for r, w in zip(per_round, idle_w)):.2f}x**", ""),
                              ("pooled / all", f"{i['p99_ms']:.2f}", f"{d['p99_ms']:.2f}", f"{pooled_idle_w['p99_ms']:.2f}",
                               f"{pooled_idle_w['p99_ms'] / d['p99_ms']:.2f}x",
                               f"{pooled_idle_w['p99_ms'] / i['p99_ms']:.2f}x",
                               f"{seconds['creating']:.1f} / {seconds[WRITER_IDLE]:.1f}")]),
        ]
        summary += (f"; writer SCHED_IDLE / normal p99 {median(idle_over_normal):.2f}x (median of rounds), "
                    f"{pooled_idle_w['p99_ms'] / d['p99_ms']:.2f}x pooled; {per_turn * args.turns} creations in "
                    f"{seconds['creating']:.1f} s (normal) / {seconds[WRITER_IDLE]:.1f} s (SCHED_IDLE)")

    roles = list(turns["idle"][0]["cpu"][0])

    def cores(side: str, role: str | None) -> str:
        used = sum((sum(b.values()) - sum(a.values())) if role is None else (b[role] - a[role])
                   for a, b in (t["cpu"] for t in turns[side]))
        return f"{used / sum(t['to'] - t['from'] for t in turns[side]):.2f}"

    cpu_rows = [(role, *(cores(side, role) for side in sides)) for role in roles]
    cpu_rows.append(("all of them (of 2 cores)", *(cores(side, None) for side in sides)))
    load_during = max(t["load"] for side in creating_sides for t in turns[side])
    text = "\n\n".join([
        "# Control-plane scale: endpoints created while a client predicts",
        machine(),
        f"`{command_line()}`",
        f"Every window pooled ({args.turns} rounds):",
        markdown_table(["", "idle", f"control: {args.endpoints} POSTs to a null server",
                        f"while creating {args.endpoints} endpoints", "control / idle", "creating / idle",
                        "creating / control"], rows),
        f"Each round's p99 (the sides took turns, the order reversed every other round; {per_turn} endpoints a "
        f"round, windows of {args.idle_seconds:.1f} s idle and the creations' length for the others):",
        markdown_table(["round", "idle p99 (ms)", "control p99 (ms)", "creating p99 (ms)", "creating / idle",
                        "creating / control", "control / idle", "creation (s)", "1-min load after it"], round_rows),
        summary[0].upper() + summary[1:] + ".",
        *compare,
        markdown_table(["CPU cores used (CPU seconds per second)", "idle", "control", "while creating",
                        *(["while creating, writer SCHED_IDLE"] if args.compare_writer else [])], cpu_rows),
        f"1-minute load average at the end of the creations: up to {load_during:.1f} (2 cores).",
        markdown_table(["step", "result"], [
            ("endpoints created", f"{per_turn * args.turns} in {create_s:.1f} s of creating, {args.turns} round(s) "
                                  f"({per_turn * args.turns / create_s:.0f}/s, {args.creators} client threads, "
                                  + (f"paced at {args.rate:g}/s)" if args.rate > 0 else "as fast as answered)")),
            ("failed creations", len(failures)),
            ("failed predicts", len(bad)),
            ("list all by pages of 100", f"{listed} endpoints, {pages} pages, {list_s:.2f} s"),
            ("one filtered list (display_name=...)", f"{len(one.get('endpoints', []))} found in {filter_s * 1e3:.0f} ms"),
        ]),
        "Before (issue 43's run, every create reloading every endpoint on the event loop): 3,000 endpoints "
        "in 575 s, predict p50 2.7 ms idle and 654 ms while they were created. "
        "Issue 43's target: 3,000 endpoints in <= 30 s, predict p99 during creation <= 1.2x idle; the target "
        "proposed below instead: the median of the rounds' creating p99 - 1.2x control p99 <= 1 ms. "
        "One keep-alive predict client (its own process), batch-1 digits image; the platform, its replica, "
        "the clients and the machine's other load share the cores.",
    ])
    write_results("endpoints_scale", text, args.out)
    log(f"load {start_load:.1f} -> {os.getloadavg()[0]:.1f}; " + summary.replace("**", ""))
    if failures:
        print("first failures:", failures[:3], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
