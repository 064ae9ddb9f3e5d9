"""Fewer, bigger steps for a compiled ``Plan``: what a small model's request costs is mostly per-step work.

A batch-1 request to a small dense model spends more time in ``Plan.run``'s loop (reading registers, calling a
kernel, unpacking its tuple, writing registers) than in NumPy. Two rewrites, both exact (the same NumPy calls
on the same values, in the same order):

- dense: ``MatMul`` by a constant matrix, then ``BiasAdd`` of a constant bias and/or an activation, become one
  step; the bias and the ReLU / softmax are applied in place on the matmul's fresh result.
- chains: consecutive steps with one output and one input that is not a constant (``Cast``, ``Mul``,
  ``AddV2`` of a ``Rescaling``, a ``Reshape`` by a constant shape, the fused dense layers ...), each fed only
  by the one before it, become one step calling their kernels in turn.

An intermediate value is fused away only when nothing else reads it (no other step, not a fetch). Errors keep
their node: a fused step reports the node whose kernel failed.

Then a fused step that starts with dense layers (after a Cast, Rescaling and Flatten's Reshape, if any) runs
them in one C call for small batches (``native``; its results agree with these kernels' to float32
rounding), and these kernels for the rest.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from modelyard.errors import ServingError
from modelyard.model.graph.native import Dense, native_head, native_kernel
from modelyard.model.graph.ops import _UNARY, Attrs, invalid

_ACTIVATIONS = frozenset({"Relu", "Softmax", "Sigmoid", "Tanh", "Relu6", "Elu", "Selu", "Softplus"})
_max, _sum, _dot = np.maximum.reduce, np.add.reduce, np.dot
_ERRORS = (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError)


def fuse(steps: list, template: list, fetch_slots: list, node_of: Callable) -> list:
    """``steps`` (``Plan.steps``) with dense layers and elementwise chains fused; ``template`` holds the
    constants (None in a dynamic register), ``node_of(key)`` gives a step's ``Node``."""
    readers: dict[int, int] = {}
    for _kernel, ins, _outs, _key in steps:
        for slot in ins:
            readers[slot] = readers.get(slot, 0) + 1
    for slot in fetch_slots:
        readers[slot] = readers.get(slot, 0) + 2  # never fused away
    steps = _fuse_dense(list(steps), template, readers, node_of)
    return _fuse_chains(steps, template, readers, node_of)


def _only_output(step, readers: dict) -> int | None:
    """The register of a step's single output when exactly one step reads it, else None."""
    outs = step[2]
    if len(outs) != 1 or outs[0][0] != 0:
        return None
    return outs[0][1] if readers.get(outs[0][1], 0) == 1 else None


def _reader(steps: list, start: int, slot: int) -> int | None:
    for j in range(start, len(steps)):
        if slot in steps[j][1]:
            return j
    return None


def _const(template: list, slot: int):
    value = template[slot]
    return value if type(value) is np.ndarray else None


def _fuse_dense(steps: list, template: list, readers: dict, node_of: Callable) -> list:
    out, i, taken = [], 0, set()
    while i < len(steps):
        if i in taken:
            i += 1
            continue
        step = steps[i]
        node = node_of(step[3])
        weights = _const(template, step[1][1]) if node.op == "MatMul" and len(step[1]) == 2 else None
        attrs = Attrs(node.attr, node.name, node.op) if weights is not None else None
        if weights is None or weights.ndim != 2 or attrs.get("transpose_a", False) or step[1][0] == step[1][1]:
            out.append(step)
            i += 1
            continue
        matrix = weights.T if attrs.get("transpose_b", False) else weights
        chain, bias, activation, last_outs = [i], None, None, step[2]
        slot = _only_output(step, readers)
        j = _reader(steps, i + 1, slot) if slot is not None else None
        if j is not None and node_of(steps[j][3]).op in ("BiasAdd", "BiasAddV1") and steps[j][1][0] == slot:
            candidate = _const(template, steps[j][1][1])
            if (candidate is not None and candidate.ndim == 1 and candidate.shape[0] == matrix.shape[1]
                    and candidate.dtype == matrix.dtype):
                bias, chain, last_outs = candidate, chain + [j], steps[j][2]
                slot = _only_output(steps[j], readers)
                j = _reader(steps, j + 1, slot) if slot is not None else None
        if j is not None and node_of(steps[j][3]).op in _ACTIVATIONS and steps[j][1] == (slot,):
            activation, chain, last_outs = node_of(steps[j][3]).op, chain + [j], steps[j][2]
        if len(chain) == 1:
            out.append(step)
            i += 1
            continue
        kernel = _dense_kernel(weights, matrix, bias, activation)
        taken.update(chain[1:])
        # At the matmul's place: everything the fused step reads (its input, constants) is ready there.
        out.append((kernel, (step[1][0],), last_outs, step[3]))
        i += 1
    return out


def _dense_kernel(weights: np.ndarray, matrix: np.ndarray, bias, activation: str | None):
    """MatMul's checks and product, then the bias and activation in place on that fresh product."""
    stated, inner = list(weights.shape), matrix.shape[0]
    other = _UNARY[activation] if activation not in (None, "Relu", "Softmax") else None

    def run(x):
        if x.ndim != 2:
            raise invalid(f"In[0] and In[1] must be matrices: {list(x.shape)} and {stated}")
        if x.shape[1] != inner:
            raise invalid(f"Matrix size-incompatible: In[0]: {list(x.shape)}, In[1]: {list(matrix.shape)}")
        h = _dot(x, matrix)  # np.dot: for 2-D arrays the same product as @, with less overhead per call
        if bias is not None:
            if h.dtype == bias.dtype:
                np.add(h, bias, out=h)
            else:  # an input of another dtype than the weights: NumPy's promotion, as the unfused kernels
                h = h + bias
        if activation == "Relu":
            np.maximum(h, np.zeros((), h.dtype), out=h)
        elif activation == "Softmax":
            # The ufuncs' reduce: what ndarray.max / .sum call, without their Python wrappers (a batch-1 cost).
            h -= _max(h, axis=-1, keepdims=True)
            np.exp(h, out=h)
            h /= _sum(h, axis=-1, keepdims=True)
        elif other is not None:
            h = other(h)
        return (h,)
    run.dense = Dense(matrix, bias, activation)  # what native_head reads
    return run


def _dense_of(kernel) -> Dense | None:
    return getattr(kernel, "dense", None)


def _fuse_chains(steps: list, template: list, readers: dict, node_of: Callable) -> list:
    """Runs of steps with one dynamic input and one output, each fed by the one before (its only reader) and
    constants, as one step."""
    out: list = []
    links: list = []  # (kernel, dynamic position, constants, key) of the run being gathered
    carried = None  # the register the run's last step writes, when only the next elementwise step reads it

    def close():
        if not links:
            return
        first, chain = links[0], [link[:4] for link in links]
        head = native_head(chain, node_of, _dense_of)
        if head is not None:
            taken = head[1]
            rest = _chain_kernel(chain[taken:]) if taken < len(chain) else None
            outputs = _dense_of(chain[taken - 1][0]).matrix.shape[1]
            kernel = native_kernel(head, outputs, rest, _chain_kernel(chain))
            out.append((kernel, (first[4][1][first[1]],), links[-1][4][2], first[3]))
        elif len(links) == 1:
            out.append(first[4])
        else:
            out.append((_chain_kernel(chain), (first[4][1][first[1]],), links[-1][4][2], first[3]))
        links.clear()

    for step in steps:
        kernel, ins, outs, key = step
        dynamic = [p for p, s in enumerate(ins) if template[s] is None]
        fits = len(dynamic) == 1 and len(outs) == 1 and outs[0][0] == 0
        if links and fits and ins[dynamic[0]] == carried:
            links.append((kernel, dynamic[0], tuple(template[s] for s in ins), key, step))
        else:
            close()
            if fits:
                links.append((kernel, dynamic[0], tuple(template[s] for s in ins), key, step))
            else:
                out.append(step)
        carried = _only_output(step, readers) if fits else None
    close()
    return out


def _chain_kernel(links: list):
    calls = []
    for kernel, position, consts, key in links:
        if len(consts) == 1:
            call = kernel
        elif len(consts) == 2 and position == 0:
            call = (lambda k, c: lambda v: k(v, c))(kernel, consts[1])
        elif len(consts) == 2:
            call = (lambda k, c: lambda v: k(c, v))(kernel, consts[0])
        else:
            call = (lambda k, before, after: lambda v: k(*before, v, *after))(kernel, consts[:position],
                                                                               consts[position + 1:])
        calls.append((call, key))

    def run(x):
        key = ""
        try:
            for call, key in calls:
                x = call(x)[0]
        except ServingError:
            raise
        except _ERRORS as exc:
            raise invalid(f"{exc} (node {key})") from None
        return (x,)
    return run
