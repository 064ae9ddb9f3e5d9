"""A MetaGraph made runnable by ``ops``' kernels: its function calls expanded, its variables restored,
what no request changes folded into constants, each signature compiled into a flat list of kernel calls.

A ``StatefulPartitionedCall`` / ``PartitionedCall`` is expanded in place (its function's body copied
under the call's name, its arguments wired to the call's inputs), so the whole graph is one graph of
plain ops. Loading then does what TensorFlow's SavedModel loader does, with the graph's own ops: it runs
the restore op (``saver_def.restore_op_name``, fed the variables' path), then the init op. After that
every variable read is a constant: ``compile`` folds every node that depends on no signature input,
and what is left is the per-request work, run in order over a list of registers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.model.graph import bundle as bundle_module
from modelyard.model.graph.fuse import fuse
from modelyard.model.graph.ops import (CALL_OPS, FEED_OPS, KERNELS, OUTPUT_ARGS, REF_INPUT_OPS, STATEFUL, Attrs,
                                        RefVariable, Resource, invalid)

Ref = tuple  # (node key, flat output index)
_CALL_DONE = "_CallDone"  # what a control dependency on an expanded call waits for
_MISSING_FUNCTION = "_MissingFunction"
# Ops whose one output is their first input: compiled to no step at all.
_PASS_THROUGH = frozenset({"Identity", "StopGradient", "PreventGradient", "Snapshot"})


class GraphError(Exception):
    """The graph cannot be run here; the message says why."""


@dataclass
class Node:
    key: str
    op: str
    inputs: list  # data inputs: Refs, resolved through ``Graph.forward``
    controls: list  # keys of control dependencies
    attr: object = None  # the NodeDef's attr map
    name: str = ""  # the NodeDef's own name, for messages
    function: str = ""  # the function a call op names


class State:
    """What kernels share: resource variables by name, checkpoints by path."""

    def __init__(self):
        self.resources: dict[tuple, Resource] = {}
        self.bundles: dict[str, bundle_module.Bundle] = {}

    def resource(self, container: bytes, name: bytes, kind: type = Resource) -> Resource:
        key = (container, name)
        if key not in self.resources:
            self.resources[key] = kind(name.decode(errors="replace"))
        return self.resources[key]

    def bundle(self, prefix: str) -> bundle_module.Bundle:
        if prefix not in self.bundles:
            self.bundles[prefix] = bundle_module.Bundle(prefix)
        return self.bundles[prefix]


def _flat_index(op: str, arg: str, index: int) -> int:
    args = OUTPUT_ARGS.get(op)
    if args is None or arg not in args:
        return index
    return args.index(arg) + index


class Graph:
    """A GraphDef with its function library expanded into one graph of ``Node``s, keyed by path."""

    def __init__(self, graph_def):
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.nodes: dict[str, Node] = {}
        self.forward: dict[Ref, Ref] = {}  # a call's outputs -> what its function returns

        def graph_input(text: str):
            if text.startswith("^"):
                return None, text[1:]
            name, _, index = text.partition(":")
            return (name, int(index or 0)), None

        for node in graph_def.node:
            self._add(node.name, node, graph_input, ())

    def _add(self, key: str, node, parse: Callable, stack: tuple) -> None:
        data, controls = [], []
        for text in node.input:
            ref, control = parse(text)
            if control is not None:
                controls.append(control)
            else:
                data.append(ref)
        if node.op in CALL_OPS:
            self._expand(key, node, data, controls, stack)
        else:
            self.nodes[key] = Node(key, node.op, data, controls, node.attr, node.name)

    def _expand(self, key: str, node, inputs: list, controls: list, stack: tuple) -> None:
        name = node.attr["f"].func.name
        fdef = self.functions.get(name)
        if fdef is None or name in stack or len(fdef.signature.input_arg) != len(inputs):
            self.nodes[key] = Node(key, _MISSING_FUNCTION, inputs, controls, node.attr, node.name, name)
            return
        prefix = key + "/"
        env = {arg.name: ref for arg, ref in zip(fdef.signature.input_arg, inputs)}
        body = {n.name: n.op for n in fdef.node_def}

        def body_input(text: str):
            if text.startswith("^"):
                return None, prefix + text[1:]
            parts = text.split(":")
            if len(parts) == 1:
                return env[parts[0]], None
            return (prefix + parts[0], _flat_index(body.get(parts[0], ""), parts[1], int(parts[2]))), None

        for inner in fdef.node_def:
            self._add(prefix + inner.name, inner, body_input, stack + (name,))
        rets = [body_input(fdef.ret[arg.name])[0] for arg in fdef.signature.output_arg]
        for index, ref in enumerate(rets):
            self.forward[(key, index)] = ref
        self.nodes[key] = Node(key, _CALL_DONE, rets, controls + [prefix + c for c in fdef.control_ret.values()],
                               node.attr, node.name, name)

    def resolve(self, ref: Ref) -> Ref:
        while ref in self.forward:
            ref = self.forward[ref]
        return ref

    def node(self, key: str) -> Node:
        node = self.nodes.get(key)
        if node is None:
            raise GraphError(f"the graph has no node {key!r}")
        return node

    def deps(self, node: Node, controls: bool) -> list[str]:
        keys = [self.resolve(ref)[0] for ref in node.inputs]
        return keys + node.controls if controls else keys

    def order(self, roots: list[str], controls: bool, stop: frozenset = frozenset()) -> list[str]:
        """Every node ``roots`` need, each after its dependencies (iterative: graphs are deep); nodes in
        ``stop`` (the fed ones) are listed but not looked through."""
        done: set[str] = set()
        out: list[str] = []
        stack = [(key, False) for key in reversed(roots)]
        while stack:
            key, expanded = stack.pop()
            if key in done:
                continue
            if expanded:
                done.add(key)
                out.append(key)
                continue
            stack.append((key, True))
            node = self.node(key)
            if node.op in FEED_OPS or key in stop:
                continue
            for dep in reversed(self.deps(node, controls)):
                if dep not in done:
                    stack.append((dep, False))
        return out

    def unsupported(self, roots: list[str], controls: bool, stop: frozenset = frozenset()) -> dict[str, str]:
        """Op -> one node using it, for every op ``roots`` reach (not looking through ``stop``) that no
        kernel runs."""
        found: dict[str, str] = {}
        seen: set[str] = set(stop)
        stack = list(roots)
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            node = self.node(key)
            if node.op == _MISSING_FUNCTION:
                found.setdefault(f"a call of {node.function} (not in the function library)", key)
                continue
            if node.op not in KERNELS and node.op not in FEED_OPS and node.op != _CALL_DONE:
                found.setdefault(node.op, key)
            stack.extend(self.deps(node, controls))
        return found


@dataclass
class Plan:
    """One signature's per-request work: feeds into registers, kernels in order, fetches out."""

    feed_slots: list
    fetch_slots: list
    template: list
    steps: list = field(default_factory=list)  # (kernel, input slots, [(output index, slot)], node key)
    feed_aliases: tuple = ()  # the signature's input aliases in ``feed_slots``' order (set by the servable)
    fetch_dtypes: tuple = ()  # the outputs' dtypes, None for strings (set by the servable)
    weights: int = 0  # elements of the distinct constant arrays the steps read: what a request reads
    nodes: tuple = ()  # the keys of the nodes the steps run (a fused step runs several)
    direct: tuple | None = None  # (kernel, node key) when one step maps the one feed to the one fetch

    def run(self, feeds: list) -> list:
        key = ""
        try:
            if self.direct is not None:  # a fused small model: no registers at all
                kernel, key = self.direct
                return [kernel(feeds[0])[0]]
            regs = self.template[:]
            for slot, value in zip(self.feed_slots, feeds):
                regs[slot] = value
            # No np.errstate here: it costs more than a small model's kernels; NumPy's overflow warnings are
            # warnings (TensorFlow gives inf/nan silently), never errors.
            for kernel, ins, outs, key in self.steps:
                result = kernel(*[regs[i] for i in ins])
                for index, slot in outs:
                    regs[slot] = result[index]
        except ServingError:
            raise
        except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError) as exc:
            raise invalid(f"{exc} (node {key})") from None
        return [regs[slot] for slot in self.fetch_slots]


class Program:
    """A loaded graph: kernels built once per node, constants folded once and shared by every plan."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.state = State()
        self.known: dict[str, tuple] = {}  # folded outputs, by node key
        self._kernels: dict[str, Callable] = {}

    def kernel(self, node: Node):
        fn = self._kernels.get(node.key)
        if fn is None:
            if node.op == _CALL_DONE:
                fn = lambda *xs: ()  # noqa: E731 (the call's outputs are forwarded; this only orders)
            else:
                try:
                    fn = KERNELS[node.op](Attrs(node.attr, node.name, node.op), self.state)
                except ServingError as exc:
                    raise GraphError(f"node {node.name} ({node.op}): {exc.message}") from None
            self._kernels[node.key] = fn
        return fn

    def run_once(self, targets: list[str], feeds: dict[Ref, np.ndarray]) -> None:
        """Run ``targets`` with their control dependencies (the restore and init ops), fed ``feeds``."""
        feeds = {self.graph.resolve(ref): value for ref, value in feeds.items()}
        temp: dict[str, tuple] = {}
        for key in self.graph.order(targets, controls=True, stop=frozenset(k for k, _ in feeds)):
            if key in self.known:
                continue
            node = self.graph.node(key)
            if (key, 0) in feeds:
                temp[key] = (feeds[(key, 0)],)
                continue
            if node.op in FEED_OPS:
                raise GraphError(f"{node.name} must be fed to run {', '.join(targets)}")
            values, constant = [], node.op not in STATEFUL
            for ref in node.inputs:
                producer, index = self.graph.resolve(ref)
                if producer in self.known:
                    values.append(self.known[producer][index])
                else:
                    values.append(temp[producer][index])
                    constant = False
            if node.op not in REF_INPUT_OPS:
                values = [v.read() if type(v) is RefVariable else v for v in values]
            outputs = tuple(self.kernel(node)(*values))
            (self.known if constant else temp)[key] = outputs

    def compile(self, feed_refs: list[Ref], fetch_refs: list[Ref]) -> Plan:
        """The plan computing ``fetch_refs`` from ``feed_refs``: every other node folded where it can be."""
        feed_refs = [self.graph.resolve(r) for r in feed_refs]
        fetch_refs = [self.graph.resolve(r) for r in fetch_refs]
        plan = Plan([], [], [])
        slots: dict[Ref, int] = {}
        outputs_of: dict[str, list] = {}  # dynamic node key -> its step's (output index, slot) list

        def slot(ref: Ref) -> int:
            if ref not in slots:
                slots[ref] = len(plan.template)
                producer, index = ref
                if producer in self.known:
                    value = self.known[producer][index]
                    plan.template.append(value.read() if type(value) is RefVariable else value)
                else:
                    plan.template.append(None)
                    outputs_of[producer].append((index, slots[ref]))
            return slots[ref]

        fed = {}
        for ref in feed_refs:
            key = ref[0]
            fed[key] = len(plan.template)
            outputs_of[key] = []
            slots[ref] = len(plan.template)
            plan.template.append(None)
            plan.feed_slots.append(slots[ref])
        for key in self.graph.order([ref[0] for ref in fetch_refs], controls=False, stop=frozenset(fed)):
            if key in fed or key in self.known:
                continue
            node = self.graph.node(key)
            if node.op in FEED_OPS:
                raise GraphError(f"the signature's outputs need {node.name}, which is not one of its inputs")
            producers = [self.graph.resolve(ref) for ref in node.inputs]
            if node.op not in STATEFUL and all(p[0] in self.known for p in producers):
                fn = self.kernel(node)
                try:
                    with np.errstate(all="ignore"):
                        values = [self.known[p][i] for p, i in producers]
                        if node.op not in REF_INPUT_OPS:
                            values = [v.read() if type(v) is RefVariable else v for v in values]
                        self.known[key] = tuple(fn(*values))
                except ServingError as exc:
                    raise GraphError(f"node {node.name} ({node.op}): {exc.message}") from None
                continue
            if node.op in STATEFUL:
                raise GraphError(f"node {node.name} ({node.op}) changes state on every request: not served here")
            if node.op in _PASS_THROUGH and (key, 0) not in slots:
                slots[(key, 0)] = slot(producers[0])  # no step: its consumers read its input's register
                continue
            outputs_of[key] = []
            plan.steps.append((self.kernel(node), tuple(slot(p) for p in producers), outputs_of[key], key))
        plan.fetch_slots = [slot(ref) for ref in fetch_refs]
        read = {id(v): v.size for _, ins, _, _ in plan.steps for v in map(plan.template.__getitem__, ins)
                if type(v) is np.ndarray}
        plan.weights = sum(read.values())
        plan.nodes = tuple(step[3] for step in plan.steps)
        plan.steps = fuse(plan.steps, plan.template, plan.fetch_slots, self.graph.node)
        if len(plan.steps) == 1 and len(plan.feed_slots) == 1 and len(plan.fetch_slots) == 1:
            kernel, ins, outs, key = plan.steps[0]
            if ins == (plan.feed_slots[0],) and list(outs) == [(0, plan.fetch_slots[0])]:
                plan.direct = (kernel, key)
        return plan


def tensor_ref(name: str) -> Ref:
    """``"dense/BiasAdd:0"`` -> ``("dense/BiasAdd", 0)``."""
    node, _, index = name.partition(":")
    return node, int(index or 0)


def check_supported(graph: Graph, signatures: list[tuple[list[str], list[str]]], load_roots: list[str]) -> None:
    """Refuse, naming them, the ops that no kernel runs and that a signature (``(output nodes, input
    nodes)``, not looked through) or the restore/init ops reach."""
    missing = graph.unsupported(load_roots, controls=True)
    for roots, fed in signatures:
        missing.update(graph.unsupported(roots, controls=False, stop=frozenset(fed)))
    if missing:
        listed = ", ".join(f"{op} (node {graph.node(key).name})" for op, key in sorted(missing.items()))
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"this SavedModel uses ops that the TensorFlow-free runtime does not run: {listed}. Serve it with "
            "TensorFlow installed: the modelyard-serving:full image, or modelyard serve where TensorFlow is installed")
