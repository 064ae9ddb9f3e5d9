"""What running a KFP pipeline's tasks costs the platform (issue 46), against kfp's own local runner.

    python3 bench/pipelines.py                          # a chain of 8 tasks, 2 rounds; a 100-task fan-out
    python3 bench/pipelines.py --chain 4 --rounds 1 --fan 10 --out /tmp/pipelines.md   # a quick check

1. **Per-task cost.** One pipeline, a chain of ``--chain`` lightweight Python components (each sleeps
   ``--work`` s and passes on the timestamps of the steps before it), run on ``modelyard platform`` with the
   stock SDK (``PipelineJob.run``) and with ``kfp.local``'s ``SubprocessRunner`` (no venv) in this process,
   taking turns. Each task records when its Python process started (``/proc``), when its function began and
   when it returned. The platform's own cost per task is (a) from the task's start request (its
   ``createTime`` in ``taskDetails``) to its process starting, and (b) from its function's return to the
   next task's start request; a second table splits them at the platform's own timestamps (the task's
   custom job's create, start and end). Both sides report (c), return to the next task's process
   starting: what either runner costs between two tasks. One unmeasured platform run comes first (it
   starts the task server, as a platform's first run does). Each round's row has the 1-minute load
   average at its start and end.
2. **Fan-out.** A ``dsl.ParallelFor`` over ``--fan`` items (each task sleeps ``--fan-work`` s) on the
   platform, ``--fan-rounds`` times: its wall time from submit to SUCCEEDED against the sum of the tasks'
   own times (process start to return) divided by the run's slots (``MODELYARD_PIPELINE_SLOTS``, default
   the machine's cores, as the platform's own rule).

Writes bench/results/pipelines.md. No ``from __future__ import annotations``: kfp reads the component's
annotations as types.
"""
import argparse
import json
import os
import sys
import tempfile
import time
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


def run_platform(aip, template: str, job_id: str) -> tuple[list, list[dict]]:
    """The chain on the platform: the steps' records and, per task (in chain order), the platform's own
    timestamps: the task's start request (``createTime``), its custom job's create, start (the runner
    starts its process) and end, and the task's end."""
    job = aip.PipelineJob(display_name=job_id, template_path=template, job_id=job_id, enable_caching=False,
                          pipeline_root=f"gs://{BUCKET}/root")
    job.run()
    details = sorted((t for t in job.gca_resource.job_detail.task_details if t.task_name.startswith("step")),
                     key=lambda t: t.create_time.timestamp())
    records = json.loads(details[-1].execution.metadata["output:Output"])
    tasks = []
    for t in details:
        custom = aip.CustomJob.get(t.executor_detail.custom_job_detail.job).gca_resource
        tasks.append({"created": t.create_time.timestamp(), "job_created": custom.create_time.timestamp(),
                      "job_started": custom.start_time.timestamp(), "job_ended": custom.end_time.timestamp(),
                      "ended": t.end_time.timestamp()})
    return records, tasks


def run_local(pipeline_func, root: str) -> list:
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    return json.loads(pipeline_func().output)


# Where the platform's time per task goes, from its own timestamps and the task's process: name -> (from, to),
# per task i; "next" is task i+1's request. (a) = request -> process; (b) = return -> next request.
STAGES = [("request -> job created", lambda r, t, i: t[i]["job_created"] - t[i]["created"]),
          ("job created -> job started", lambda r, t, i: t[i]["job_started"] - t[i]["job_created"]),
          ("job started -> process", lambda r, t, i: r[i][0] - t[i]["job_started"]),
          ("return -> job ended", lambda r, t, i: t[i]["job_ended"] - r[i][2]),
          ("job ended -> next request", lambda r, t, i: t[i + 1]["created"] - t[i]["job_ended"])]


def chain_costs(records: list, tasks: list[dict] | None) -> dict:
    """Per task (boundary): (c) return -> next process start; on the platform (a) request -> process start,
    (b) return -> next request, (a)+(b) per task with a next one, and each of STAGES."""
    n = len(records)
    out = {"c": [records[i + 1][0] - records[i][2] for i in range(n - 1)], "own": [r[2] - r[0] for r in records]}
    if tasks:
        out["a"] = [records[i][0] - tasks[i]["created"] for i in range(n)]
        out["b"] = [tasks[i + 1]["created"] - records[i][2] for i in range(n - 1)]
        out["ab"] = [out["a"][i] + out["b"][i] for i in range(n - 1)]
        for name, stage in STAGES:
            out[name] = [stage(records, tasks, i) for i in range(n - (1 if "next" in name else 0))]
    return out


def loads() -> float:
    return os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", type=int, default=8, help="tasks in the chain (default 8)")
    ap.add_argument("--work", type=float, default=0.2, help="seconds each chain task sleeps (default 0.2)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the chain on each side (default 2)")
    ap.add_argument("--fan", type=int, default=100, help="tasks of the fan-out (default 100; 0: none)")
    ap.add_argument("--fan-work", type=float, default=1.0, help="seconds each fan-out task sleeps (default 1)")
    ap.add_argument("--fan-rounds", type=int, default=1, help="runs of the fan-out (default 1)")
    ap.add_argument("--out", help="results file (default bench/results/pipelines.md)")
    args = ap.parse_args()
    where = machine()

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
    # The platform's own rule (pipeline_jobs.slots): MODELYARD_PIPELINE_SLOTS, else the machine's cores.
    slots = int(os.environ.get("MODELYARD_PIPELINE_SLOTS") or max(2, os.cpu_count() or 1))
    child_env = env(PYTHONPATH=str(REPO / "src"), MODELYARD_PIPELINE_SLOTS=str(slots))
    storage_port = free_port()
    # The SDK's submit() looks at the pipeline root's bucket: through the platform's storage, not Google's.
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{storage_port}"
    with modelyard_platform(work / "platform", "--storage-root", str(storage), "--storage-port", str(storage_port),
                            "--artifact-root", f"gs://{BUCKET}", child_env=child_env) as platform:
        aip.init(project="local", location="us-central1", api_endpoint=platform.base, api_transport="rest",
                 credentials=google.auth.credentials.AnonymousCredentials(), staging_bucket=f"gs://{BUCKET}")
        # Not measured: the platform's first run starts its task server (pipeline tasks fork from it).
        run_platform(aip, chain_yaml, "warm-up")

        def run(side: str, round_no: int) -> dict:
            load0, t0 = loads(), time.monotonic()
            if side == "modelyard platform":
                records, tasks = run_platform(aip, chain_yaml, f"chain-{round_no}")
            else:
                records, tasks = run_local(chain_pipeline(args.chain, args.work), str(work / f"local-{round_no}")), None
            return {**chain_costs(records, tasks), "wall": time.monotonic() - t0, "load": (load0, loads())}

        sides = ["modelyard platform", "kfp.local SubprocessRunner"]
        results = take_turns(sides, args.rounds, run, lambda s, r, res: log(
            f"round {r + 1} {s}: wall {res['wall']:.1f} s, return->next start median {median(res['c']):.3f} s, "
            f"load {res['load'][0]:.1f}-{res['load'][1]:.1f}"))
        def fan_run(side: str, round_no: int) -> dict:
            load0, t0 = loads(), time.monotonic()
            job = aip.PipelineJob(display_name="fan", template_path=fan_yaml, job_id=f"fan-{round_no}",
                                  enable_caching=False, pipeline_root=f"gs://{BUCKET}/root")
            job.run()
            wall = time.monotonic() - t0
            own = [r[2] - r[0] for t in job.gca_resource.job_detail.task_details if t.task_name.startswith("step")
                   for r in json.loads(t.execution.metadata["output:Output"])]
            return {"wall": wall, "own": own, "ideal": sum(own) / slots, "load": (load0, loads())}

        # The fan-out has one side (kfp.local has no slots to compare): its rounds through the one round loop.
        fans = take_turns(["fan-out"], args.fan_rounds if args.fan else 0, fan_run, lambda s, r, res: log(
            f"fan-out {r + 1}: wall {res['wall']:.1f} s, {res['wall'] / res['ideal']:.2f}x its ideal"))["fan-out"]

    def cell(values: list[float]) -> str:
        return f"{median(values):.3f}" if values else "-"

    def load_cell(pairs: list[tuple[float, float]]) -> str:
        values = [v for pair in pairs for v in pair]
        return f"{min(values):.1f}-{max(values):.1f}"

    rows, stage_rows = [], []
    for side in sides:
        runs = results[side]
        for label, chosen in [(f"round {i + 1}", [res]) for i, res in enumerate(runs)] + [("all rounds", runs)]:
            flat = {k: [v for res in chosen for v in res.get(k, [])] for k in ("a", "b", "ab", "c", "own")}
            rows.append([side, label, load_cell([res["load"] for res in chosen]), cell(flat["a"]), cell(flat["b"]),
                         cell(flat["ab"]), cell(flat["c"]), cell(flat["own"]),
                         f"{median([res['wall'] for res in chosen]):.1f}"])
    platform_runs = results[sides[0]]
    for name, _ in STAGES:
        stage_rows.append([name] + [cell(res[name]) for res in platform_runs]
                          + [cell([v for res in platform_runs for v in res[name]])])
    text = [f"# Pipelines: the platform's cost per task, against kfp.local\n", where, "",
            f"`{' '.join(['python3', 'bench/pipelines.py', *sys.argv[1:]])}`", "",
            f"A chain of {args.chain} lightweight Python components (each sleeps {args.work} s), {args.rounds} "
            "round(s) per side, taking turns, after one unmeasured platform run (it starts the task server). "
            "Medians over every task (boundary) of a round and of all rounds, seconds; load: the 1-minute load "
            "average (`uptime`) at the start and end of each round.",
            "(a) the task's start request (its `createTime` in `taskDetails`) to its process starting (`/proc`); "
            "(b) its function's return to the next task's start request; (a)+(b) the platform's own cost per "
            "task; (c) return to the next task's process starting (either runner, whole); own: the task's "
            "process start to its return.", "",
            markdown_table(["runner", "round", "load", "(a) request -> process", "(b) return -> next request",
                            "(a)+(b)", "(c) return -> next process", "task's own time", "wall s"], rows), "",
            "Where (a) and (b) go on the platform, from its own timestamps (the task's `createTime`, its custom "
            "job's `createTime`, `startTime` (the runner starts its process) and `endTime`), medians, seconds:", "",
            markdown_table(["stage"] + [f"round {i + 1}" for i in range(len(platform_runs))] + ["all rounds"],
                           stage_rows)]
    if fans:
        text += ["", f"Fan-out: `dsl.ParallelFor` over {args.fan} tasks (each sleeps {args.fan_work} s), "
                 f"{slots} slots (the machine's {os.cpu_count()} cores; `MODELYARD_PIPELINE_SLOTS` "
                 f"{'set' if os.environ.get('MODELYARD_PIPELINE_SLOTS') else 'unset'}). Wall: submit to SUCCEEDED "
                 "as the SDK sees it; own: each task's process start to its return.", "",
                 markdown_table(["run", "load", "tasks", "sum of own times s", "÷ slots s", "wall s",
                                 "wall ÷ (sum ÷ slots)"],
                                [[i + 1, load_cell([f["load"]]), len(f["own"]), f"{sum(f['own']):.1f}",
                                  f"{f['ideal']:.1f}", f"{f['wall']:.1f}", f"{f['wall'] / f['ideal']:.2f}"]
                                 for i, f in enumerate(fans)])]
    write_results("pipelines", "\n".join(text), args.out)


if __name__ == "__main__":
    main()
