"""A fused step's dense layers in one C call (``_densechain``) for small batches.

``fuse`` makes a small dense model one step: a Cast, a Rescaling's Mul and AddV2, Flatten's Reshape, then
Dense layers (a MatMul with its bias and activation each). In NumPy that is a dozen calls of about a
microsecond each for a batch-1 request, more than the arithmetic. ``native_head`` takes the longest start of
such a step that the C kernel computes (an optional Cast to float32, Mul/Add/Sub by float32 scalars, a
Reshape to ``[-1, features]``, then one or more Dense layers with float32 weights and a bias, activation
none, ReLU, ReLU6, softmax, sigmoid or tanh) and returns a kernel that runs it in C for batches of up to
``MAX_ROWS`` rows and leaves everything else (bigger batches, which BLAS does better; other dtypes or
layouts; inputs that fail a check, so TensorFlow's error is raised as before) to the NumPy kernels.
The results agree with NumPy's to float32 rounding (the products' sums run in another order; see the C file).
The C kernel keeps its own copy of each weight matrix, laid out in the order it reads it: a model on this path
holds its dense weights twice.
Without the compiled extension (no C compiler at install) every step stays NumPy.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from modelyard.model.graph.ops import Attrs, _np

try:
    from modelyard.model.graph import _densechain
except ImportError:  # built without a C compiler: the NumPy kernels run everything
    _densechain = None

# Up to this many rows the C loop (weights streamed once per row) beats BLAS's call overhead; above it
# BLAS's blocked matrix product wins.
MAX_ROWS = 8
ACTIVATIONS = {None: 0, "Relu": 1, "Relu6": 2, "Softmax": 3, "Sigmoid": 4, "Tanh": 5}
_MUL, _ADD = 0, 1
_F32 = np.dtype(np.float32)


class Dense:
    """What a fused dense step computes, for ``native_head``: x . matrix (+ bias), then the activation."""

    __slots__ = ("matrix", "bias", "activation")

    def __init__(self, matrix: np.ndarray, bias, activation: str | None):
        self.matrix, self.bias, self.activation = matrix, bias, activation


def _scalar(value) -> float | None:
    """A float32 constant of one value (a Rescaling's scale or offset), else None."""
    if type(value) is np.ndarray and value.dtype == _F32 and value.size == 1 and value.ndim <= 1:
        return float(value.reshape(()))
    return None


def _prologue_step(op: str, position: int, consts: tuple) -> tuple[int, float] | None:
    other = _scalar(consts[1 - position]) if len(consts) == 2 else None
    if other is None:
        return None
    if op == "Mul":
        return _MUL, other
    if op in ("Add", "AddV2"):
        return _ADD, other
    if op == "Sub" and position == 0:  # x - c is x + (-c) exactly
        return _ADD, -other
    return None


def _reshape_features(position: int, consts: tuple) -> int | None:
    """F of a Reshape of the dynamic value to the constant shape [-1, F]."""
    shape = consts[1] if len(consts) == 2 and position == 0 else None
    if type(shape) is np.ndarray and shape.dtype.kind == "i" and shape.shape == (2,) and shape[0] == -1 \
            and shape[1] > 0:
        return int(shape[1])
    return None


def native_head(links: list, node_of: Callable, dense_of: Callable) -> tuple[object, int, int, bool] | None:
    """(C spec, links taken, features per row, reshapes?) for the longest start of ``links`` (``(kernel,
    dynamic position, constants, node key)`` each, as ``fuse._chain_kernel`` takes them) that the C kernel
    computes, ending with at least one Dense layer; None when there is none or no C extension.
    ``dense_of(kernel)`` is the ``Dense`` of a fused dense kernel, else None."""
    if _densechain is None:
        return None
    cast, prologue, features, reshape, layers, taken = False, [], None, False, [], 0
    for index, (kernel, position, consts, key) in enumerate(links):
        dense = dense_of(kernel)
        if dense is not None:
            matrix, bias = dense.matrix, dense.bias
            if not (matrix.dtype == _F32 and matrix.ndim == 2 and matrix.flags.c_contiguous
                    and (bias is None or (bias.dtype == _F32 and bias.flags.c_contiguous))
                    and dense.activation in ACTIVATIONS and len(layers) < 16):
                break
            if not layers and features is not None and features != matrix.shape[0]:
                break  # a Reshape the first layer does not take: NumPy raises TensorFlow's error
            layers.append((matrix, bias, ACTIVATIONS[dense.activation]))
            taken = index + 1
            continue
        if layers:
            break  # after the first Dense layer only Dense layers join
        node = node_of(key)
        if node.op == "Cast" and index == 0 and _np(Attrs(node.attr, node.name, node.op).get("DstT")) == _F32:
            cast = True
        elif node.op == "Reshape" and _reshape_features(position, consts) is not None:
            features, reshape = _reshape_features(position, consts), True
        elif (step := _prologue_step(node.op, position, consts)) is not None and len(prologue) < 8:
            prologue.append(step)
        else:
            break
    if not layers:
        return None
    features = layers[0][0].shape[0]
    return _densechain.spec(cast, tuple(prologue), features, tuple(layers)), taken, features, reshape


def native_kernel(head: tuple, outputs: int, then: Callable | None, numpy_kernel: Callable) -> Callable:
    """The step's kernel: ``head`` (``native_head``'s) in C when the input fits, then ``then`` (the NumPy
    kernels of the links after the head, if any); the whole step by ``numpy_kernel`` otherwise."""
    spec, _taken, features, reshape = head
    run_c, empty, ndarray, f32 = _densechain.run, np.empty, np.ndarray, np.float32

    def run(x):
        if type(x) is ndarray:
            if reshape:
                rows = x.size // features
            else:
                rows = x.shape[0] if x.ndim == 2 and x.shape[1] == features else 0
            if 0 < rows <= MAX_ROWS and rows * features == x.size:
                out = empty((rows, outputs), f32)
                if run_c(spec, x, out):
                    return then(out) if then is not None else (out,)
        return numpy_kernel(x)
    run.head = head  # for tests: the spec this step runs in C
    return run
