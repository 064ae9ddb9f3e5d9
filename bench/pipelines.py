"""What running a KFP pipeline's tasks costs the platform (issue 46), against kfp's own local runner.

    python3 bench/pipelines.py                          # a chain of 8 tasks, 2 rounds; a 100-task fan-out
    python3 bench/pipelines.py --chain 4 --rounds 1 --fan 10 --out /tmp/pipelines.md   # a quick check

1. **Per-task cost.** One pipeline, a chain of ``--chain`` lightweight Python components (each sleeps
   ``--work`` s and passes on the timestamps of the steps before it), run on ``modelyard platform`` with the
   stock SDK (``PipelineJob.run``) and with ``kfp.local``'s ``SubprocessRunner`` (no venv) in this process,
   taking turns. Each task records when its Python process started (``/proc``), when its function began and
   when it returned. The platform's own cost per task is (a) from the task's start request (its
   ``createTime`` in ``taskDetails``) to its process starting, and (b) from its function's return to the
   next task's start request. Both sides report (c), return to the next task's process starting: what
   either runner costs between two tasks.
2. **Fan-out.** A ``dsl.ParallelFor`` over ``--fan`` items (each task sleeps ``--fan-work`` s) on the
   platform: its wall time from submit to SUCCEEDED against the sum of the tasks' own times (process start
   to return) divided by the run's slots (``MODELYARD_PIPELINE_SLOTS``, default the CPUs).

Writes bench/results/pipelines.md. No ``from __future__ import annotations``: kfp reads the component's
annotations as types.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from harness import env, free_port, log, machine, markdown_table, median, modelyard_platform, take_turns, write_results
from kfp import compiler, dsl

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench-pipelines"


@dsl.component(base_image="python:3.11")
def step(prev: str, work: float) -> str:
    import json
    import os
    import time

    began = time.time()
    with open("/proc/self/stat") as f:  # this process's start, in clock ticks after boot
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:  # seconds since boot, to 0.01 s (/proc/stat's btime is whole seconds)
        up = float(f.read().split()[0])
    started = time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    time.sleep(work)
    return json.dumps(json.loads(prev) + [[started, began, time.time()]])


def chain_pipeline(n: int, work: float):
    @dsl.pipeline(name="bench-chain")
    def chain() -> str:
        out = "[]"
        for _ in range(n):
            out = step(prev=out, work=work).set_caching_options(False).output
        return out
    return chain


def fan_pipeline(n: int, work: float):
    @dsl.pipeline(name="bench-fan")
    def fan():
        with dsl.ParallelFor(list(range(n))):
            step(prev="[]", work=work).set_caching_options(False)
    return fan


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run_platform(aip, template: str, job_id: str) -> tuple[list, list[dict]]:
    """The chain on the platform: the steps' records and the tasks' details (in chain order)."""
    job = aip.PipelineJob(display_name=job_id, template_path=template, job_id=job_id, enable_caching=False,
                          pipeline_root=f"gs://{BUCKET}/root")
    job.run()
    details = sorted((t for t in job.gca_resource.job_detail.task_details if t.task_name.startswith("step")),
                     key=lambda t: t.create_time.timestamp())
    last = details[-1]
    records = json.loads(last.execution.metadata["output:Output"])
    return records, [{"created": t.create_time.timestamp()} for t in details]


def run_local(pipeline_func, root: str) -> list:
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    return json.loads(pipeline_func().output)


def chain_costs(records: list, tasks: list[dict] | None) -> dict:
    """Per task boundary: (c) return -> next process start; on the platform (a) request -> process start
    and (b) return -> next request."""
    out = {"c": [records[i + 1][0] - records[i][2] for i in range(len(records) - 1)],
           "own": [r[2] - r[0] for r in records]}
    if tasks:
        out["a"] = [records[i][0] - tasks[i]["created"] for i in range(len(records))]
        out["b"] = [tasks[i + 1]["created"] - records[i][2] for i in range(len(records) - 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", type=int, default=8, help="tasks in the chain (default 8)")
    ap.add_argument("--work", type=float, default=0.2, help="seconds each chain task sleeps (default 0.2)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the chain on each side (default 2)")
    ap.add_argument("--fan", type=int, default=100, help="tasks of the fan-out (default 100; 0: none)")
    ap.add_argument("--fan-work", type=float, default=1.0, help="seconds each fan-out task sleeps (default 1)")
    ap.add_argument("--out", help="results file (default bench/results/pipelines.md)")
    args = ap.parse_args()

    import google.auth.credentials
    from google.cloud import aiplatform as aip
    from google.cloud.aiplatform import pipeline_jobs
    from google.cloud.aiplatform.utils import resource_manager_utils

    pipeline_jobs._JOB_WAIT_TIME = 0.2  # the SDK's own polling is not what is measured
    pipeline_jobs._MAX_WAIT_TIME = 1

    def offline(*_a, **_k):  # no Cloud Resource Manager here (docs/pipelines.md, known limits)
        raise ConnectionError("offline")

    resource_manager_utils.get_project_number = offline
    work = Path(tempfile.mkdtemp(prefix="bench-pipelines-"))
    storage = work / "storage"
    (storage / BUCKET).mkdir(parents=True)
    chain_yaml, fan_yaml = str(work / "chain.yaml"), str(work / "fan.yaml")
    compiler.Compiler().compile(chain_pipeline(args.chain, args.work), chain_yaml)
    if args.fan:
        compiler.Compiler().compile(fan_pipeline(args.fan, args.fan_work), fan_yaml)
    slots = int(os.environ.get("MODELYARD_PIPELINE_SLOTS") or max(2, os.cpu_count() or 1))
    child_env = env(PYTHONPATH=str(REPO / "src"), MODELYARD_PIPELINE_SLOTS=str(slots))
    storage_port = free_port()
    # The SDK's submit() looks at the pipeline root's bucket: through the platform's storage, not Google's.
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{storage_port}"
    with modelyard_platform(work / "platform", "--storage-root", str(storage), "--storage-port", str(storage_port),
                            "--artifact-root", f"gs://{BUCKET}", child_env=child_env) as platform:
        aip.init(project="local", location="us-central1", api_endpoint=platform.base, api_transport="rest",
                 credentials=google.auth.credentials.AnonymousCredentials(), staging_bucket=f"gs://{BUCKET}")

        def run(side: str, round_no: int) -> dict:
            t0 = time.monotonic()
            if side == "modelyard platform":
                records, tasks = run_platform(aip, chain_yaml, f"chain-{round_no}")
            else:
                records, tasks = run_local(chain_pipeline(args.chain, args.work), str(work / f"local-{round_no}")), None
            return {**chain_costs(records, tasks), "wall": time.monotonic() - t0}

        sides = ["modelyard platform", "kfp.local SubprocessRunner"]
        results = take_turns(sides, args.rounds, run, lambda s, r, res: log(
            f"round {r + 1} {s}: wall {res['wall']:.1f} s, return->next start median {median(res['c']):.3f} s"))
        fan = None
        if args.fan:
            t0 = time.monotonic()
            job = aip.PipelineJob(display_name="fan", template_path=fan_yaml, job_id="fan", enable_caching=False,
                                  pipeline_root=f"gs://{BUCKET}/root")
            job.run()
            wall = time.monotonic() - t0
            own = [r[2] - r[0] for t in job.gca_resource.job_detail.task_details if t.task_name.startswith("step")
                   for r in json.loads(t.execution.metadata["output:Output"])]
            fan = {"wall": wall, "own": own, "ideal": sum(own) / slots}

    def cell(values: list[float]) -> str:
        return f"{median(values):.3f}" if values else "-"

    rows = []
    for side in sides:
        flat = {k: [v for res in results[side] for v in res.get(k, [])] for k in ("a", "b", "c", "own")}
        both = [a + b for a, b in zip(flat["a"], flat["b"] + [0.0])] if flat["a"] else []
        rows.append([side, cell(flat["a"]), cell(flat["b"]), cell(both[:-1] if both else []), cell(flat["c"]),
                     cell(flat["own"]), f"{median([r['wall'] for r in results[side]]):.1f}"])
    text = [f"# Pipelines: the platform's cost per task, against kfp.local\n", machine(), "",
            f"`{' '.join(['python3', 'bench/pipelines.py', *sys.argv[1:]])}`", "",
            f"A chain of {args.chain} lightweight Python components (each sleeps {args.work} s), {args.rounds} "
            "round(s) per side, taking turns. Medians over every task (boundary) of every round, seconds.",
            "(a) the task's start request (`createTime`) to its process starting; (b) its function's return to the "
            "next task's start request; (a)+(b) the platform's own cost per task; (c) return to the next task's "
            "process starting (either runner, whole); own: the task's process start to its return.", "",
            markdown_table(["runner", "(a) request -> process", "(b) return -> next request", "(a)+(b)",
                            "(c) return -> next process", "task's own time", "wall s"], rows)]
    if fan:
        text += ["", f"Fan-out: `dsl.ParallelFor` over {args.fan} tasks (each sleeps {args.fan_work} s), "
                 f"{slots} slots.", "",
                 markdown_table(["tasks", "sum of own times s", "÷ slots s", "wall s", "wall ÷ (sum ÷ slots)"],
                                [[len(fan["own"]), f"{sum(fan['own']):.1f}", f"{fan['ideal']:.1f}", f"{fan['wall']:.1f}",
                                  f"{fan['wall'] / fan['ideal']:.2f}"]])]
    write_results("pipelines", "\n".join(text), args.out)


if __name__ == "__main__":
    main()
