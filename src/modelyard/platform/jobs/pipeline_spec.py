"""The compiled KFP v2 pipeline spec (the IR ``kfp.compiler`` writes): checked at create, then read by
the executor (``pipeline_jobs``) one task at a time.

Pure functions over the spec's JSON, no process and no store: which tasks the root DAG has and what
they wait for, each task's inputs resolved from the run's parameters and its producers' outputs, the
executor input a KFP launcher hands a container (``{{$}}``) and its other placeholders, a loop's items
and a group's outputs (``dsl.Collected``, ``dsl.OneOf``, a nested pipeline's return). Artifacts live
under the run's ``gcsOutputDirectory`` as ``gs://`` URIs (recorded) and reach the task's command as
``/gcs/`` paths, which the platform's job code maps to its storage's files, as it does for every job.
What the executor does not run is refused at create, naming the feature, rather than run wrongly.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from modelyard.platform.api.errors import invalid
from modelyard.platform.jobs import pipeline_gcpc

# ParameterType names -> how a JSON value is checked/converted for the executor.
_INT, _FLOAT, _STRING, _BOOL, _LIST, _STRUCT = (
    "NUMBER_INTEGER", "NUMBER_DOUBLE", "STRING", "BOOLEAN", "LIST", "STRUCT")
# A dsl.ExitHandler's exit task: it runs once its upstream tasks ended, whatever their state.
ALL_COMPLETED = "ALL_UPSTREAM_TASKS_COMPLETED"
_PLACEHOLDER = re.compile(r"\{\{\$(?:\.(inputs|outputs)\.(parameters|artifacts)\['([^']+)'\]\.?(\w+)?"
                          r"(?:\['([^']+)'\])?|\.(pipeline_job_name|pipeline_job_uuid|pipeline_task_name|"
                          r"pipeline_task_uuid|pipeline_root|pipeline_job_resource_name))?\}\}")


def check(spec: Any) -> dict:
    """The pipeline spec, checked enough that the executor can run it; INVALID_ARGUMENT naming the field."""
    if not isinstance(spec, dict):
        raise invalid("PipelineJob.pipeline_spec is required (the pipeline compiled by kfp.compiler).")
    if not str(spec.get("schemaVersion", "")).startswith("2."):
        raise invalid(f"pipeline_spec.schema_version {spec.get('schemaVersion')!r} is not supported: modelyard "
                      "runs KFP v2 pipeline specs (schemaVersion 2.x, written by kfp>=2).")
    if not (spec.get("pipelineInfo") or {}).get("name"):
        raise invalid("pipeline_spec.pipeline_info.name is required.")
    root_tasks = ((spec.get("root") or {}).get("dag") or {}).get("tasks")
    if not isinstance(root_tasks, dict) or not root_tasks:
        raise invalid("pipeline_spec.root.dag.tasks is required: a pipeline has at least one task.")
    components = spec.get("components") or {}
    executors = (spec.get("deploymentSpec") or {}).get("executors") or {}
    for name, (task, parent) in _walk(spec).items():
        where = f"pipeline_spec task {name!r}"
        if task.get("parameterIterator") or task.get("artifactIterator"):
            _check_loop(where, task, components.get((task.get("componentRef") or {}).get("name")) or {})
        elif task.get("iteratorPolicy"):
            raise invalid(f"{where}.iterator_policy is set on a task that is not a loop (dsl.ParallelFor).")
        if (task.get("triggerPolicy") or {}).get("strategy") not in (None, "ALL_UPSTREAM_TASKS_SUCCEEDED",
                                                                       ALL_COMPLETED):
            raise invalid(f"{where}.trigger_policy.strategy {task['triggerPolicy']['strategy']!r} is not run by "
                          "modelyard's pipeline executor.")
        comp = components.get((task.get("componentRef") or {}).get("name"))
        if comp is None:
            raise invalid(f"{where}.component_ref names no component of pipeline_spec.components.")
        siblings = _dag_tasks(spec, parent)
        for dep in task.get("dependentTasks") or []:
            if dep not in siblings:
                raise invalid(f"{where}.dependent_tasks names {dep!r}, not a task of the pipeline.")
        if comp.get("dag"):
            _check_dag_outputs(where, comp["dag"])
            continue
        if (task.get("triggerPolicy") or {}).get("condition"):  # the compiler puts conditions on groups only
            raise invalid(f"{where}.trigger_policy.condition: modelyard runs conditions on groups (dsl.If) only.")
        executor = executors.get(comp.get("executorLabel"))
        if (executor or {}).get("importer") is not None:
            _check_importer(where, executor["importer"], task)
            continue
        container = (executor or {}).get("container")
        if not container:
            kind = next(iter(executor or {}), "no executor")
            raise invalid(f"{where}: its executor is {kind!r}; modelyard runs container executors "
                          "(lightweight Python and container components) and importers only.")
        op = pipeline_gcpc.unmapped_op(list(container.get("command") or []))
        if op:
            raise invalid(f"{where}: {op} is a Google Cloud Pipeline Components op modelyard does not run (it runs "
                          f"{', '.join(pipeline_gcpc.PREFIX + k for k in pipeline_gcpc.TABLE)}).")
        if not container.get("command") and not container.get("args"):
            raise invalid(f"{where}: its container has no command: modelyard runs the command as a local process "
                          f"and cannot run an image's entrypoint (image {container.get('image')!r}).")
    order(spec)  # no cycles
    return spec


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _check_loop(where: str, task: dict, comp: dict) -> None:
    """A dsl.ParallelFor task: its items are a JSON list written in the spec or one of the loop's inputs."""
    if not comp.get("dag"):
        raise invalid(f"{where}: a loop's component must be a DAG (its body).")
    it = task.get("parameterIterator") or task.get("artifactIterator")
    items = it.get("items") or {}
    if not it.get("itemInput") or not any(k in items for k in ("raw", "inputParameter", "inputArtifact")):
        raise invalid(f"{where}: a loop's iterator needs item_input and items (raw, input_parameter or "
                      "input_artifact).")
    if "raw" in items:
        try:
            raw = json.loads(items["raw"])
        except (TypeError, ValueError):
            raw = None
        if not isinstance(raw, list):
            raise invalid(f"{where}.parameter_iterator.items.raw must be a JSON list, got {items['raw']!r}.")
    limit = (task.get("iteratorPolicy") or {}).get("parallelismLimit", 0)
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit < 0 or int(limit) != limit:
        raise invalid(f"{where}.iterator_policy.parallelism_limit must be a whole number >= 0, got {limit!r}.")


def _check_dag_outputs(where: str, dag: dict) -> None:
    """A group's outputs (dsl.Collected of a loop, dsl.OneOf of branches, a nested pipeline's return) name
    tasks of its own DAG."""
    outs = dag.get("outputs") or {}
    selectors = []
    for key, value in (outs.get("parameters") or {}).items():
        if "valueFromParameter" in value:
            selectors.append((key, value["valueFromParameter"]))
        elif "valueFromOneof" in value:
            selectors += [(key, sel) for sel in value["valueFromOneof"].get("parameterSelectors") or []]
        else:
            raise invalid(f"{where}: its output parameter {key!r} is set in a way modelyard does not run: "
                          f"{sorted(value)}.")
    for key, value in (outs.get("artifacts") or {}).items():
        selectors += [(key, sel) for sel in value.get("artifactSelectors") or []]
    for key, sel in selectors:
        if sel.get("producerSubtask") not in (dag.get("tasks") or {}):
            raise invalid(f"{where}: its output {key!r} comes from {sel.get('producerSubtask')!r}, not a task "
                          "of its DAG.")


def _check_importer(where: str, importer: dict, task: dict) -> None:
    uri = importer.get("artifactUri") or {}
    if "constant" not in uri and "runtimeParameter" not in uri:
        raise invalid(f"{where}: an importer needs artifact_uri (a constant or a runtime parameter).")
    if "runtimeParameter" in uri and uri["runtimeParameter"] not in ((task.get("inputs") or {}).get("parameters") or {}):
        raise invalid(f"{where}: the importer's artifact_uri parameter {uri['runtimeParameter']!r} is not one of "
                      "its inputs.")
    if not (importer.get("typeSchema") or {}).get("schemaTitle"):
        raise invalid(f"{where}: an importer needs type_schema.schema_title (its artifact class).")


def _dag_tasks(spec: dict, group: str | None) -> dict:
    """The tasks of the root DAG (``group`` None) or of a group task's DAG."""
    if group is None:
        return spec["root"]["dag"]["tasks"]
    return component(spec, _walk(spec)[group][0])["dag"]["tasks"]


_WALKED: dict[int, tuple[dict, dict]] = {}  # id(spec) -> (spec, walk, order): a run's tick asks many times


def _memo(spec: dict) -> dict:
    hit = _WALKED.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    memo: dict = {"walk": _walk_uncached(spec)}
    if len(_WALKED) > 16:
        _WALKED.clear()
    _WALKED[id(spec)] = (spec, memo)
    return memo


def _walk(spec: dict) -> dict[str, tuple[dict, str | None]]:
    """Every task of the pipeline, nested DAGs (dsl.If groups, loops, nested pipelines) included, by its
    qualified name (``qualify``) -> (its spec, the qualified name of the group it is in, None at the root)."""
    return _memo(spec)["walk"]


def qualify(group: str | None, name: str) -> str:
    """A task's name in the whole pipeline: its group's and its own, ``/``-joined. Names are unique only in
    their DAG (a nested pipeline's tasks may be named as the outer ones; one may be used twice)."""
    return f"{group}/{name}" if group else name


def local(qname: str) -> str:
    """A task's own name (``taskInfo``'s, as Vertex lists it) from its qualified name."""
    return qname.rsplit("/", 1)[-1]


def _walk_uncached(spec: dict) -> dict[str, tuple[dict, str | None]]:
    out: dict = {}

    def walk(dag_tasks: dict, parent: str | None, depth: int) -> None:
        if depth > 20:
            raise invalid("pipeline_spec: groups are nested more than 20 deep.")
        for name, task in dag_tasks.items():
            if not isinstance(task, dict) or not re.fullmatch(r"[A-Za-z_][-\w.]*", name):
                raise invalid(f"pipeline_spec: task {name!r} must be an object named with letters, digits, "
                              "'-', '_' or '.', starting with a letter.")
            q = qualify(parent, name)
            out[q] = (task, parent)
            comp = (spec.get("components") or {}).get((task.get("componentRef") or {}).get("name")) or {}
            if comp.get("dag"):
                walk(comp["dag"].get("tasks") or {}, q, depth + 1)

    walk(spec["root"]["dag"]["tasks"], None, 0)
    return out


def tasks(spec: dict) -> dict[str, dict]:
    """Every task by qualified name, nested ones included."""
    return {name: task for name, (task, _) in _walk(spec).items()}


def parent_of(spec: dict, name: str) -> str | None:
    return _walk(spec)[name][1]


def is_group(spec: dict, name: str) -> bool:
    return bool(component(spec, tasks(spec)[name]).get("dag"))


def root_names(spec: dict) -> list[str]:
    return list(spec["root"]["dag"]["tasks"])


def children(spec: dict, group: str | None) -> list[str]:
    """The tasks of the root DAG (``group`` None) or of a group's DAG, in ``order``."""
    memo = _memo(spec)
    if "children" not in memo:
        memo["children"] = {}
        for n in order(spec):
            memo["children"].setdefault(parent_of(spec, n), []).append(n)
    return memo["children"].get(group, [])


def is_loop(spec: dict, name: str) -> bool:
    """A dsl.ParallelFor: its DAG runs once per item."""
    task = tasks(spec)[name]
    return bool(task.get("parameterIterator") or task.get("artifactIterator"))


def parallelism(spec: dict, name: str) -> int:
    """How many of a loop's iterations may run at once (0: no limit), ``ParallelFor(parallelism=)``."""
    return int((tasks(spec)[name].get("iteratorPolicy") or {}).get("parallelismLimit") or 0)


def loop_items(spec: dict, name: str, inputs: dict) -> list:
    """A loop's items: the JSON list written in the spec, or the list one of its inputs holds (a task's
    output, a pipeline parameter; a JSON string of a list too), or an artifact list."""
    task = tasks(spec)[name]
    if task.get("artifactIterator"):
        key = task["artifactIterator"]["items"].get("inputArtifact")
        return list(inputs["artifacts"].get(key) or [])
    items = task["parameterIterator"]["items"]
    if "raw" in items:
        return json.loads(items["raw"])
    value = inputs["parameters"].get(items["inputParameter"])
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if not isinstance(value, list):
        raise invalid(f"loop {name!r}: its items ({items['inputParameter']!r}) must be a list, got {value!r}.")
    return value


def iteration_inputs(spec: dict, name: str, inputs: dict, item: Any) -> dict:
    """The scope of one iteration of a loop: the loop's inputs and the item under its ``itemInput``."""
    task = tasks(spec)[name]
    if task.get("artifactIterator"):
        key = task["artifactIterator"]["itemInput"]
        return {"parameters": inputs["parameters"], "artifacts": {**inputs["artifacts"], key: [item]}}
    key = task["parameterIterator"]["itemInput"]
    return {"parameters": {**inputs["parameters"], key: item}, "artifacts": inputs["artifacts"]}


def dag_outputs(spec: dict, name: str, produced: dict[str, dict]) -> dict:
    """What one run of a group's DAG gives out (a nested pipeline's return, a dsl.OneOf's first branch
    that ran, one loop iteration's share of a dsl.Collected) from its tasks' outputs (``produced``:
    task name -> ``{"parameters", "artifacts"}``)."""
    outs = component(spec, tasks(spec)[name])["dag"].get("outputs") or {}
    params, arts = {}, {}
    for key, value in (outs.get("parameters") or {}).items():
        selectors = ([value["valueFromParameter"]] if "valueFromParameter" in value
                     else value["valueFromOneof"].get("parameterSelectors") or [])
        for sel in selectors:  # the first that produced it (a OneOf's branch that ran)
            got = (produced.get(sel["producerSubtask"]) or {}).get("parameters") or {}
            if sel["outputParameterKey"] in got:
                params[key] = got[sel["outputParameterKey"]]
                break
    for key, value in (outs.get("artifacts") or {}).items():
        for sel in value.get("artifactSelectors") or []:
            got = (produced.get(sel["producerSubtask"]) or {}).get("artifacts") or {}
            if got.get(sel["outputArtifactKey"]):
                arts[key] = got[sel["outputArtifactKey"]]
                break
    return {"parameters": params, "artifacts": arts}


def collected(spec: dict, name: str, iterations: list[dict]) -> dict:
    """A loop's outputs (``dsl.Collected``): each output parameter as the list of its iterations' values,
    each output artifact list as their artifacts, in item order (empty lists for no items). An iteration
    that produced none (its branch did not run) adds nothing."""
    outs = component(spec, tasks(spec)[name])["dag"].get("outputs") or {}
    params: dict = {k: [] for k in outs.get("parameters") or {}}
    arts: dict = {k: [] for k in outs.get("artifacts") or {}}
    for out in iterations:
        for key, value in (out.get("parameters") or {}).items():
            params.setdefault(key, []).append(value)
        for key, value in (out.get("artifacts") or {}).items():
            arts.setdefault(key, []).extend(value)
    return {"parameters": params, "artifacts": arts}


def importer(spec: dict, name: str) -> dict | None:
    """The importer spec of a ``dsl.importer`` task, None for any other task."""
    comp = component(spec, tasks(spec)[name])
    return ((spec.get("deploymentSpec") or {}).get("executors") or {}).get(comp.get("executorLabel"), {}).get("importer")


def imported(spec: dict, name: str, inputs: dict) -> dict:
    """The artifact a ``dsl.importer`` task gives out: its URI (a constant or its parameter), its type and
    metadata (placeholders of its inputs filled), under the component's one output key."""
    imp = importer(spec, name)
    uri = imp["artifactUri"].get("constant")
    if uri is None:
        uri = inputs["parameters"].get(imp["artifactUri"]["runtimeParameter"])
    if not isinstance(uri, str) or not uri:
        raise invalid(f"importer {name!r}: its artifact_uri must be a non-empty string, got {uri!r}.")

    def filled(value: Any) -> Any:
        if isinstance(value, str):
            m = _PLACEHOLDER.fullmatch(value)
            if m and m.group(1) == "inputs" and m.group(2) == "parameters":
                return inputs["parameters"].get(m.group(3))
            return value
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return [filled(v) for v in value] if isinstance(value, list) else value

    key = next(iter((component(spec, tasks(spec)[name]).get("outputDefinitions") or {}).get("artifacts") or {}),
               "artifact")
    return {"parameters": {}, "artifacts": {key: [{"name": key, "type": imp["typeSchema"], "uri": uri,
                                                   "metadata": filled(imp.get("metadata") or {}),
                                                   "reimport": bool(imp.get("reimport"))}]}}


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")


def retry_policy(spec: dict, name: str) -> tuple[int, float, float, float]:
    """A task's ``set_retry``: (retries, first backoff s, backoff factor, longest backoff s); (0, ...) for none."""
    policy = tasks(spec)[name].get("retryPolicy") or {}

    def seconds(text: Any, default: float) -> float:
        m = _DURATION.match(str(text)) if text is not None else None
        return float(m.group(1)) if m else default

    return (int(policy.get("maxRetryCount") or 0), seconds(policy.get("backoffDuration"), 0.0),
            float(policy.get("backoffFactor") or 2.0), seconds(policy.get("backoffMaxDuration"), 3600.0))


def order(spec: dict) -> list[str]:
    """Every task's qualified name, each after its group and after every task it depends on (data or
    ``.after``)."""
    memo = _memo(spec)
    if "order" not in memo:
        memo["order"] = _order(memo["walk"])
    return memo["order"]


def _order(walked: dict) -> list[str]:
    done: list[str] = []
    seen: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name in path:
            raise invalid(f"pipeline_spec: tasks depend on each other in a cycle: {' -> '.join(path + (name,))}.")
        task, parent = walked[name]
        for dep in [qualify(parent, u) for u in sorted(upstream(task))] + ([parent] if parent else []):
            if dep in walked:
                visit(dep, path + (name,))
        seen.add(name)
        done.append(name)

    for name in sorted(walked):
        visit(name, ())
    return done


def upstream(task: dict) -> set[str]:
    """Every task this one waits for: its ``dependentTasks`` and the producers of its inputs."""
    out = set(task.get("dependentTasks") or [])
    inputs = task.get("inputs") or {}
    for value in (inputs.get("parameters") or {}).values():
        producer = (value.get("taskOutputParameter") or {}).get("producerTask")
        if producer:
            out.add(producer)
    for value in (inputs.get("artifacts") or {}).values():
        producer = (value.get("taskOutputArtifact") or {}).get("producerTask")
        if producer:
            out.add(producer)
    return out


def component(spec: dict, task: dict) -> dict:
    return spec["components"][task["componentRef"]["name"]]


def container(spec: dict, task: dict) -> dict:
    return spec["deploymentSpec"]["executors"][component(spec, task)["executorLabel"]]["container"]


def run_parameters(spec: dict, given: dict | None) -> dict:
    """The run's parameter values: ``runtimeConfig.parameterValues`` over the pipeline's defaults;
    INVALID_ARGUMENT for an unknown one or a required one missing."""
    defs = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    given = dict(given or {})
    for name in given:
        if name not in defs:
            raise invalid(f"runtime_config.parameter_values[{name!r}]: the pipeline has no such parameter "
                          f"(it has: {', '.join(sorted(defs)) or 'none'}).")
    out = {}
    for name, d in defs.items():
        if name in given:
            out[name] = convert(given[name], d.get("parameterType"), f"runtime_config.parameter_values[{name!r}]")
        elif "defaultValue" in d:
            out[name] = convert(d["defaultValue"], d.get("parameterType"), name)
        elif not d.get("isOptional"):
            raise invalid(f"runtime_config.parameter_values[{name!r}] is required: the pipeline's parameter "
                          "has no default.")
    return out


def convert(value: Any, kind: str | None, field: str) -> Any:
    """A parameter's JSON value as its type has it (proto JSON sends every number as a double)."""
    if kind == _INT:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise invalid(f"{field} must be an integer, got {value!r}.")
        return int(value)
    if kind == _FLOAT and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise invalid(f"{field} must be a number, got {value!r}.")
    if kind == _STRING and not isinstance(value, str):
        raise invalid(f"{field} must be a string, got {value!r}.")
    if kind == _BOOL and not isinstance(value, bool):
        raise invalid(f"{field} must be a boolean, got {value!r}.")
    if kind == _LIST and not isinstance(value, list):
        raise invalid(f"{field} must be a list, got {value!r}.")
    if kind == _STRUCT and not isinstance(value, dict):
        raise invalid(f"{field} must be an object, got {value!r}.")
    return value


def task_inputs(spec: dict, name: str, params: dict, outputs: dict[str, dict],
                scope_artifacts: dict | None = None) -> dict:
    """A task's inputs ``{"parameters": {name: value}, "artifacts": {name: [artifact]}}`` from its scope's
    parameters and artifacts (the run's at the root; its group's inputs inside a group) and its producers'
    ``outputs`` (task name -> the same shape, as ``task_outputs`` reads)."""
    task = tasks(spec)[name]
    comp = component(spec, task)
    defs = comp.get("inputDefinitions") or {}
    given = task.get("inputs") or {}
    out_params: dict = {}
    for key, value in (given.get("parameters") or {}).items():
        kind = ((defs.get("parameters") or {}).get(key) or {}).get("parameterType")
        if "componentInputParameter" in value:
            source = value["componentInputParameter"]
            if source in params:
                out_params[key] = select(params[source], value.get("parameterExpressionSelector"), f"{name}.{key}")
            continue
        if "runtimeValue" in value:
            out_params[key] = convert((value["runtimeValue"] or {}).get("constant"), kind, f"{name}.{key}")
            continue
        if "taskFinalStatus" in value:  # dsl.PipelineTaskFinalStatus: how the producer (a group) ended
            producer = value["taskFinalStatus"].get("producerTask")
            out_params[key] = {"pipelineTaskName": producer, **(outputs.get(producer, {}).get("status") or {})}
            continue
        ref = value.get("taskOutputParameter")
        if ref:
            produced = outputs.get(ref["producerTask"], {}).get("parameters", {})
            if ref["outputParameterKey"] in produced:
                out_params[key] = produced[ref["outputParameterKey"]]
            continue
        raise invalid(f"task {name!r}: input parameter {key!r} is set in a way modelyard does not run yet: "
                      f"{sorted(value)}.")
    for key, d in (defs.get("parameters") or {}).items():
        if key not in out_params and "defaultValue" in d:
            out_params[key] = d["defaultValue"]
    out_arts: dict = {}
    for key, value in (given.get("artifacts") or {}).items():
        if "componentInputArtifact" in value:
            out_arts[key] = (scope_artifacts or {}).get(value["componentInputArtifact"], [])
            continue
        ref = value.get("taskOutputArtifact")
        if not ref:
            raise invalid(f"task {name!r}: input artifact {key!r} is set in a way modelyard does not run yet: "
                          f"{sorted(value)}.")
        out_arts[key] = outputs.get(ref["producerTask"], {}).get("artifacts", {}).get(ref["outputArtifactKey"], [])
    return {"parameters": out_params, "artifacts": out_arts}


_SELECTOR = re.compile(r"""^parseJson\(string_value\)\[(?:"([^"]*)"|'([^']*)'|(\d+))\]$""")


def select(value: Any, selector: str | None, field: str) -> Any:
    """A loop item's field (``item.a`` of a dict item): the ``parameterExpressionSelector`` the compiler
    writes, ``parseJson(string_value)["a"]``, over the item (a JSON string of it too)."""
    if not selector:
        return value
    m = _SELECTOR.match(selector)
    if m is None:
        raise invalid(f"{field}: parameter_expression_selector {selector!r} is not one modelyard runs.")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise invalid(f"{field}: {value!r} is not JSON, so {selector!r} cannot select from it.") from None
    try:
        return value[int(m.group(3))] if m.group(3) is not None else value[m.group(1) if m.group(1) is not None
                                                                           else m.group(2)]
    except (KeyError, IndexError, TypeError):
        raise invalid(f"{field}: {selector!r} selects nothing from {value!r}.") from None


def output_artifacts(spec: dict, name: str, task_root: str) -> dict[str, list[dict]]:
    """The artifacts a task will write: one per output, ``{task_root}/{output}`` (a gs:// URI), as Vertex
    lays them out under the run's root."""
    defs = (component(spec, tasks(spec)[name]).get("outputDefinitions") or {}).get("artifacts") or {}
    return {key: [{"name": key, "type": d.get("artifactType") or {}, "uri": f"{task_root}/{key}", "metadata": {}}]
            for key, d in defs.items()}


def executor_input(spec: dict, name: str, inputs: dict, outputs: dict[str, list[dict]], task_root: str,
                   to_path, artifact_uri=None) -> dict:
    """The KFP executor input of a task (what ``{{$}}`` stands for); ``to_path`` maps a gs:// URI to the
    path the task's command sees it at, ``artifact_uri`` (``to_path`` unless given) an artifact's URI."""
    params_out = (component(spec, tasks(spec)[name]).get("outputDefinitions") or {}).get("parameters") or {}
    artifact_uri = artifact_uri or to_path

    def art(a: dict) -> dict:
        return {"name": a.get("name", ""), "type": a.get("type") or {}, "uri": artifact_uri(a["uri"]),
                "metadata": a.get("metadata") or {}}

    return {
        "inputs": {"parameterValues": inputs["parameters"],
                   "artifacts": {k: {"artifacts": [art(a) for a in v]} for k, v in inputs["artifacts"].items()}},
        "outputs": {"parameters": {k: {"outputFile": to_path(f"{task_root}/{k}")} for k in params_out},
                    "artifacts": {k: {"artifacts": [art(a) for a in v]} for k, v in outputs.items()},
                    "outputFile": to_path(f"{task_root}/executor_output.json")},
    }


def fill(strings: list[str], ex_input: dict, run: dict | None = None) -> list[str]:
    """A container's command or args with the IR's placeholders replaced from the executor input (and
    ``run``: the ``{{$.pipeline_job_name}}``-style values of the run and task). An element that is a
    structured placeholder (``{"Concat": [...]}``, ``{"IfPresent": {...}}``, as Google Cloud Pipeline
    Components write them) is evaluated: an absent input's ``IfPresent`` drops it, a list expands."""
    def one(m: re.Match) -> str:
        side, kind, key, attr, meta_key, run_key = m.groups()
        if run_key:
            return str((run or {}).get(run_key, ""))
        if side is None:
            return json.dumps(ex_input)
        if kind == "parameters":
            if side == "inputs":
                value = ex_input["inputs"]["parameterValues"].get(key, "")
                return value if isinstance(value, str) else json.dumps(value)
            return ex_input["outputs"]["parameters"][key]["outputFile"]
        arts = ex_input[side]["artifacts"].get(key, {}).get("artifacts") or [{}]
        if attr == "metadata":  # .metadata (the whole JSON) or .metadata['k']
            meta = arts[0].get("metadata") or {}
            value = meta if meta_key is None else meta.get(meta_key, "")
            return value if isinstance(value, str) else json.dumps(value)
        return str(arts[0].get("uri", ""))  # .path and .uri: the task's path

    def present(name: str) -> bool:
        return (name in ex_input["inputs"]["parameterValues"]
                or bool((ex_input["inputs"]["artifacts"].get(name) or {}).get("artifacts")))

    def structured(node: Any) -> Any:
        if isinstance(node, str):
            return _PLACEHOLDER.sub(one, node)
        if isinstance(node, list):
            return [structured(n) for n in node]
        if isinstance(node, dict) and set(node) == {"Concat"}:
            parts = [structured(n) for n in node["Concat"]]
            return "".join(p if isinstance(p, str) else "".join(p or []) for p in parts)
        if isinstance(node, dict) and set(node) == {"IfPresent"}:
            cond = node["IfPresent"]
            branch = cond.get("Then") if present(cond.get("InputName", "")) else cond.get("Else")
            return None if branch is None else structured(branch)
        raise invalid(f"container placeholder {json.dumps(node)[:200]} is not one modelyard runs.")

    out: list[str] = []
    for s in strings:
        node: Any = s
        if s.startswith(('{"Concat"', '{"IfPresent"')):
            try:
                node = json.loads(s)
            except ValueError:
                node = s
        value = structured(node)
        if isinstance(value, list):
            out.extend(value)
        elif value is not None:
            out.append(value)
    return out


def cache_key(spec: dict, name: str, inputs: dict) -> str | None:
    """The task's fingerprint when its caching is on (``cachingOptions.enableCache``, which the SDK's
    ``enable_caching`` sets), else None: what it runs (its component's interface and its container) and
    what it is given (parameters; input artifacts by URI and type), not where its outputs go."""
    task = tasks(spec)[name]
    if not (task.get("cachingOptions") or {}).get("enableCache"):
        return None
    comp = component(spec, task)
    what = {"inputs": comp.get("inputDefinitions") or {}, "outputs": comp.get("outputDefinitions") or {},
            "container": container(spec, task), "parameters": inputs["parameters"],
            "artifacts": {k: [[a.get("uri"), (a.get("type") or {}).get("schemaTitle")] for a in v]
                          for k, v in inputs["artifacts"].items()}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


_CEL_TOKEN = re.compile(r"""\s*(?:(?P<param>inputs\.parameter_values\[(?P<q>['"])(?P<key>[^'"]+)(?P=q)\])
    |(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>==|!=|<=|>=|&&|\|\||[<>!()])
    |(?P<word>true|false|int|double|string))""", re.X)


def condition_holds(expr: str, params: dict) -> bool:
    """A ``triggerPolicy.condition`` (the CEL subset the kfp compiler writes for dsl.If/Elif/Else:
    ``inputs.parameter_values['k']`` compared with literals, ``int()``/``double()``/``string()``,
    ``&&``, ``||``, ``!``, parentheses) over the group task's parameters; INVALID_ARGUMENT for anything else."""
    import ast

    parts, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _CEL_TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise invalid(f"trigger_policy.condition {expr!r}: modelyard cannot read it at {expr[pos:pos + 20]!r}.")
        pos = m.end()
        if m.group("param"):
            if m.group("key") not in params:
                raise invalid(f"trigger_policy.condition {expr!r}: no parameter {m.group('key')!r}.")
            parts.append(repr(params[m.group("key")]))
        elif m.group("str"):
            parts.append(repr(ast.literal_eval(m.group("str"))))
        elif m.group("num"):
            parts.append(m.group("num"))
        elif m.group("op"):
            parts.append({"&&": " and ", "||": " or ", "!": " not "}.get(m.group("op"), m.group("op")))
        else:
            parts.append({"true": "True", "false": "False", "double": "float", "string": "str"}.get(
                m.group("word"), m.group("word")))
    text = "".join(parts).strip()
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
               ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Constant, ast.Call, ast.Name, ast.Load)
    for node in ast.walk(tree):
        if not isinstance(node, allowed) or (isinstance(node, ast.Name) and node.id not in ("int", "float", "str")):
            raise invalid(f"trigger_policy.condition {expr!r}: modelyard cannot evaluate it.")
    try:
        return bool(eval(compile(tree, "<condition>", "eval"), {"__builtins__": {}},  # noqa: S307 (checked above)
                         {"int": int, "float": float, "str": str}))
    except (TypeError, ValueError) as exc:
        raise invalid(f"trigger_policy.condition {expr!r}: {exc}") from None


_PIP_PREAMBLE = re.compile(r"python3 -m pip install (?P<args>.*?) && \"\$0\" \"\$@\"", re.S)


def without_satisfied_install(command: list[str]) -> list[str]:
    """A lightweight component's command without its ``pip install`` step (``sh -c "...pip install
    'kfp==X' ... && "$0" "$@"" ...``) when every requirement it installs is already importable in the
    task's Python (which sees the platform's packages): the rest of the command is what the step would
    have run next, so nothing changes but a pip start-up (and no network). Otherwise as it is."""
    if len(command) < 4 or command[:2] != ["sh", "-c"]:
        return command
    m = _PIP_PREAMBLE.search(command[2])
    if m is None:
        return command
    import shlex
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        words = shlex.split(m.group("args"))
    except ValueError:
        return command
    for word in words:
        if word.startswith("-"):
            if word in ("--quiet", "--no-warn-script-location", "--no-deps"):
                continue
            return command  # an index, a --user, ...: pip's to do
        try:
            req = Requirement(word)
        except InvalidRequirement:
            return command
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            if not req.specifier.contains(metadata.version(req.name), prereleases=True):
                return command
        except metadata.PackageNotFoundError:
            return command
    return command[3:]


def task_outputs(spec: dict, name: str, written: dict | None, planned: dict[str, list[dict]]) -> dict:
    """What a finished task produced: its executor output (``written``, or None when it wrote none) over
    the artifacts planned for it; parameters typed as the component declares."""
    written = written or {}
    defs = (component(spec, tasks(spec)[name]).get("outputDefinitions") or {}).get("parameters") or {}
    params = {k: v for k, v in (written.get("parameterValues") or {}).items() if k in defs}
    arts = {}
    for key, planned_list in planned.items():
        reported = ((written.get("artifacts") or {}).get(key) or {}).get("artifacts") or []
        arts[key] = [_reported(a, reported[i] if i < len(reported) else {}) for i, a in enumerate(planned_list)]
    return {"parameters": params, "artifacts": arts}


def _reported(planned: dict, reported: dict) -> dict:
    """A planned output artifact with what the task reported of it: its metadata, and its URI when the task
    named another object (an op whose artifact is a resource: ``https://...``, or ``gs://``)."""
    out = {**planned, "metadata": {**(planned.get("metadata") or {}), **(reported.get("metadata") or {})}}
    uri = reported.get("uri") or ""
    if uri.startswith("/gcs/"):
        uri = "gs://" + uri[len("/gcs/"):]
    if uri.startswith(("https://", "gs://")):
        out["uri"] = uri
    return out
