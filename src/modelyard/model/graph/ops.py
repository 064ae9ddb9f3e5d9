"""NumPy kernels for the ops of Keras inference graphs, with TensorFlow's semantics and dtypes.

``KERNELS[op](attrs, state)`` builds a kernel once per node, reading its attributes then, and the kernel
maps input arrays to a tuple of outputs. ``OUTPUT_ARGS`` names the outputs of ops with more than one
output argument, so a function body's ``node:arg:index`` references resolve to flat indices. Ops outside
``KERNELS`` are refused at load (``program``), never guessed at.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from modelyard.errors import Code, ServingError
from modelyard.model import dtypes

Kernel = Callable[..., tuple]

# Ops whose outputs come as several named arguments (the rest have one, possibly a list).
OUTPUT_ARGS = {
    "FusedBatchNorm": ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"),
    "FusedBatchNormV2": ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"),
    "FusedBatchNormV3": ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2",
                         "reserve_space_3"),
    "Unique": ("y", "idx"),
    "TopKV2": ("values", "indices"),
}
# Ops whose result changes between runs or that change state: never folded into constants.
STATEFUL = frozenset({"AssignVariableOp", "RestoreV2", "Placeholder"})


class Attrs:
    """A node's attributes (``AttrValue`` messages) as Python values."""

    def __init__(self, attr_map, node_name: str = "", op: str = ""):
        self._map = attr_map
        self.node = node_name
        self.node_op = op

    def __contains__(self, name: str) -> bool:
        return name in self._map

    def get(self, name: str, default=None):
        if name not in self._map:
            return default
        return attr_value(self._map[name])


def attr_value(av):
    kind = av.WhichOneof("value")
    if kind == "list":
        lst = av.list
        for field in ("i", "f", "s", "b", "type", "shape", "tensor", "func"):
            values = getattr(lst, field)
            if len(values):
                if field == "tensor":
                    return [tensor_value(t) for t in values]
                if field == "shape":
                    return [None if v.unknown_rank else tuple(d.size for d in v.dim) for v in values]
                return list(values)
        return []
    if kind == "tensor":
        return tensor_value(av.tensor)
    if kind == "shape":
        return None if av.shape.unknown_rank else tuple(d.size for d in av.shape.dim)
    if kind == "func":
        return av.func.name
    if kind is None:
        return None
    return getattr(av, kind)


_TYPED_FIELDS = ("float_val", "double_val", "int_val", "int64_val", "bool_val", "uint32_val", "uint64_val")


def tensor_value(proto) -> np.ndarray:
    """A ``TensorProto`` as an array, as ``tf.make_ndarray`` gives it (one value broadcasts to the shape)."""
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    dtype = dtypes.to_numpy(proto.dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dtypes.is_string(proto.dtype):
        values = np.empty(len(proto.string_val), dtype=object)
        values[:] = list(proto.string_val)
    elif proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape).copy()
    elif dtype == np.float16 or (dtype.kind == "V" or dtype.name == "bfloat16"):
        values = np.array(list(proto.half_val), dtype=np.uint16).view(dtype)
    else:
        values = np.array([], dtype=dtype)
        for field in _TYPED_FIELDS:
            got = getattr(proto, field)
            if len(got):
                values = np.array(list(got)).astype(dtype)
                break
    if values.size == count:
        return values.reshape(shape)
    if values.size == 0:
        return np.zeros(shape, dtype=dtype) if dtype.kind != "O" else np.full(shape, b"", dtype=object)
    # Fewer values than elements: the last one repeats (TensorFlow's rule for a compact constant).
    out = np.empty(count, dtype=dtype)
    out[:values.size] = values
    out[values.size:] = values[-1]
    return out.reshape(shape)


def _np(type_enum) -> np.dtype:
    return dtypes.to_numpy(type_enum)


def invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


class Resource:
    """A resource variable: what a ``VarHandleOp`` names; restored by ``AssignVariableOp``."""

    __slots__ = ("name", "value")

    def __init__(self, name: str):
        self.name = name
        self.value = None

    def read(self) -> np.ndarray:
        if self.value is None:
            raise ServingError(Code.FAILED_PRECONDITION,
                               f"Could not find variable {self.name}: it was not restored from the checkpoint")
        return self.value


class RefVariable(Resource):
    """A TF1 reference variable (``VariableV2``): ops other than ``REF_INPUT_OPS`` read its value."""

    __slots__ = ()


# Ops that take a variable itself, not its value.
REF_INPUT_OPS = frozenset({"Assign", "ReadVariableOp", "AssignVariableOp", "ResourceGather", "VarIsInitializedOp",
                           "DisableCopyOnRead", "IsVariableInitialized"})


# ---- kernel builders -------------------------------------------------------------------------
KERNELS: dict[str, Callable[[Attrs, "object"], Kernel]] = {}


def kernel(*names: str):
    def register(builder):
        for name in names:
            KERNELS[name] = builder
        return builder
    return register


def _erfc_abs(a):
    # Abramowitz and Stegun 7.1.26 (|error| <= 1.5e-7): erfc of |x|, NumPy having no erf.
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return poly * np.exp(-a * a)


def _erf(x):
    x = np.asarray(x)
    return (np.sign(x) * (1.0 - _erfc_abs(np.abs(x)))).astype(x.dtype, copy=False)


def _erfc(x):
    x = np.asarray(x)
    tail = _erfc_abs(np.abs(x))  # computed directly, not 1 - erf: keeps its precision far out
    return np.where(x >= 0, tail, 2.0 - tail).astype(x.dtype, copy=False)


def _sigmoid(x):
    return np.exp(-np.logaddexp(np.zeros((), x.dtype), -x))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)  # in place: one array fewer per call
    return e


def _log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _selu(x):
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return (scale * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))).astype(x.dtype, copy=False)


_UNARY = {
    "Identity": lambda x: x, "StopGradient": lambda x: x, "PreventGradient": lambda x: x,
    "Snapshot": lambda x: x,
    "Neg": np.negative, "Abs": np.abs, "Square": np.square, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
    "Log1p": np.log1p, "Expm1": np.expm1, "Floor": np.floor, "Ceil": np.ceil, "Round": np.round,
    "Rint": np.rint, "Sign": np.sign, "Sin": np.sin, "Cos": np.cos, "Tanh": np.tanh, "Erf": _erf, "Erfc": _erfc,
    "Rsqrt": lambda x: (1 / np.sqrt(x)).astype(x.dtype, copy=False),
    "Reciprocal": lambda x: (1 / x).astype(x.dtype, copy=False), "Inv": lambda x: (1 / x).astype(x.dtype, copy=False),
    "Relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "Relu6": lambda x: np.clip(x, np.zeros((), x.dtype), np.asarray(6, x.dtype)),
    "Elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False),
    "Selu": _selu, "Sigmoid": _sigmoid, "Softmax": _softmax, "LogSoftmax": _log_softmax,
    "Softplus": lambda x: np.logaddexp(np.zeros((), x.dtype), x),
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "IsNan": np.isnan, "IsInf": np.isinf, "IsFinite": np.isfinite, "LogicalNot": np.logical_not,
    "ZerosLike": np.zeros_like, "OnesLike": np.ones_like,
}
for _name, _fn in _UNARY.items():
    KERNELS[_name] = lambda attrs, state, fn=_fn: (lambda x: (fn(x),))


def _true_div(x, y):
    return np.true_divide(x, y).astype(np.result_type(x, y), copy=False) if x.dtype.kind in "fc" \
        else np.floor_divide(x, y)


_BINARY = {
    "Add": np.add, "AddV2": np.add, "Sub": np.subtract, "Mul": np.multiply, "RealDiv": _true_div,
    "Div": _true_div, "FloorDiv": np.floor_divide, "FloorMod": np.mod, "Maximum": np.maximum,
    "Minimum": np.minimum, "Pow": np.power, "SquaredDifference": lambda x, y: np.square(x - y),
    "Greater": np.greater, "GreaterEqual": np.greater_equal, "Less": np.less, "LessEqual": np.less_equal,
    "Equal": np.equal, "NotEqual": np.not_equal, "LogicalAnd": np.logical_and, "LogicalOr": np.logical_or,
    "DivNoNan": lambda x, y: np.where(y == 0, np.zeros((), x.dtype), x / np.where(y == 0, 1, y)).astype(x.dtype),
    "MulNoNan": lambda x, y: np.where(y == 0, np.zeros((), x.dtype), x * y).astype(x.dtype),
}
for _name, _fn in _BINARY.items():
    KERNELS[_name] = lambda attrs, state, fn=_fn: (lambda x, y: (fn(x, y),))


# ---- graph plumbing --------------------------------------------------------------------------
@kernel("Const")
def _const(attrs, state):
    value = attrs.get("value")
    return lambda: (value,)


@kernel("NoOp")
def _noop(attrs, state):
    return lambda *xs: ()


@kernel("IdentityN")
def _identity_n(attrs, state):
    return lambda *xs: xs


@kernel("PlaceholderWithDefault")
def _placeholder_default(attrs, state):
    return lambda x: (x,)


@kernel("EnsureShape")
def _ensure_shape(attrs, state):
    want = attrs.get("shape")

    def run(x):
        if want is not None and (len(want) != x.ndim or any(w >= 0 and w != g for w, g in zip(want, x.shape))):
            raise invalid(f"Shape of tensor {attrs.node} {list(x.shape)} is not compatible with expected shape "
                          f"{list(want)}.")
        return (x,)
    return run


@kernel("VarHandleOp")
def _var_handle(attrs, state):
    resource = state.resource(attrs.get("container") or b"", attrs.get("shared_name") or attrs.node.encode())
    return lambda: (resource,)


@kernel("VariableV2")
def _variable_v2(attrs, state):
    resource = state.resource(attrs.get("container") or b"", attrs.get("shared_name") or attrs.node.encode(),
                              RefVariable)
    return lambda: (resource,)


@kernel("Assign")
def _assign(attrs, state):
    def run(ref, value):
        ref.value = np.asarray(value)
        return (ref.value,)
    return run


@kernel("ParseExample", "ParseExampleV2")
def _parse_example(attrs, state):
    """Dense features of serialized ``tf.Example``s (what classify and regress signatures parse)."""
    v2 = attrs.node_op == "ParseExampleV2"
    sparse = attrs.get("num_sparse" if v2 else "Nsparse", 0)
    if sparse or (v2 and attrs.get("ragged_value_types")):
        raise ServingError(Code.UNIMPLEMENTED, f"{attrs.node_op} of sparse or ragged features")
    types = [_np(t) for t in attrs.get("Tdense") or []]
    shapes = [tuple(s) for s in attrs.get("dense_shapes") or []]

    def run(serialized, names, *rest):
        if v2:
            keys = [k for k in np.ravel(rest[1])]  # rest: sparse_keys, dense_keys, ragged_keys, defaults...
            defaults = rest[3:]
        else:
            keys = list(rest[:len(types)])  # rest: dense_keys..., dense_defaults... (no sparse keys)
            keys = [np.asarray(k).item() for k in keys]
            defaults = rest[len(types):]
        return tuple(_dense_feature(serialized, key, dtype, shape, default)
                     for key, dtype, shape, default in zip(keys, types, shapes, defaults))
    return run


def _dense_feature(serialized, key, dtype: np.dtype, shape: tuple, default) -> np.ndarray:
    from tensorflow.core.example import example_pb2  # a message module: no TensorFlow runtime

    name = key.decode() if isinstance(key, bytes) else str(key)
    count = int(np.prod(shape, dtype=np.int64))
    rows = []
    for i, data in enumerate(np.ravel(serialized)):
        try:
            example = example_pb2.Example.FromString(data)
        except Exception:
            raise invalid(f"Could not parse example input, value: '{data[:40]!r}'") from None
        feature = example.features.feature.get(name)
        kind = feature.WhichOneof("kind") if feature is not None else None
        if kind is None:
            if np.size(default) == 0:
                raise invalid(f"Name: <unknown>, Feature: {name} (data type: {dtype.name}) is required but could "
                              "not be found.")
            rows.append(np.broadcast_to(np.asarray(default, dtype), shape))
            continue
        values = getattr(feature, kind).value
        if len(values) != count:
            raise invalid(f"Name: <unknown>, Key: {name}, Index: {i}.  Number of float values != expected.  "
                          f"values size: {len(values)} but output shape: {list(shape)}")
        rows.append(np.array(list(values)).astype(dtype).reshape(shape))
    return np.stack(rows) if rows else np.zeros((0,) + shape, dtype)


@kernel("ReadVariableOp")
def _read_variable(attrs, state):
    return lambda handle: (handle.read(),)


@kernel("AssignVariableOp")
def _assign_variable(attrs, state):
    def run(handle, value):
        handle.value = np.asarray(value)
        return ()
    return run


@kernel("VarIsInitializedOp")
def _var_is_initialized(attrs, state):
    return lambda handle: (np.asarray(handle.value is not None),)


@kernel("DisableCopyOnRead")
def _disable_copy_on_read(attrs, state):
    return lambda handle: ()


@kernel("RestoreV2")
def _restore(attrs, state):
    def run(prefix, names, slices):
        if any(s for s in slices.ravel()):
            raise ServingError(Code.UNIMPLEMENTED, "RestoreV2 of variable slices (partitioned variables)")
        bundle = state.bundle(prefix.item().decode())
        return tuple(bundle.tensor(name.decode()) for name in names.ravel())
    return run


# ---- shapes and layout -----------------------------------------------------------------------
@kernel("Shape")
def _shape(attrs, state):
    out = _np(attrs.get("out_type", dtypes.DT_INT32))
    return lambda x: (np.array(np.shape(x), dtype=out),)


@kernel("Size")
def _size(attrs, state):
    out = _np(attrs.get("out_type", dtypes.DT_INT32))
    return lambda x: (np.asarray(np.size(x), dtype=out),)


@kernel("Rank")
def _rank(attrs, state):
    return lambda x: (np.asarray(np.ndim(x), dtype=np.int32),)


@kernel("Reshape")
def _reshape(attrs, state):
    last = [(None, None)]  # (the shape array last seen, its tuple): a folded shape is the same array every call

    def run(x, shape):
        seen, dims = last[0]
        if seen is not shape:
            dims = tuple(int(d) for d in np.ravel(shape))
            last[0] = (shape, dims)  # one assignment: threads see the pair whole
        try:
            return (np.reshape(x, dims),)
        except ValueError:
            raise invalid(f"Input to reshape is a tensor with {np.size(x)} values, but the requested shape "
                          f"is {[int(d) for d in np.ravel(shape)]}") from None
    return run


@kernel("Squeeze")
def _squeeze(attrs, state):
    axes = tuple(attrs.get("squeeze_dims") or ())

    def run(x):
        if not axes:
            return (np.squeeze(x),)
        return (np.squeeze(x, axis=tuple(a % x.ndim for a in axes)),)
    return run


@kernel("ExpandDims")
def _expand_dims(attrs, state):
    return lambda x, axis: (np.expand_dims(x, int(axis)),)


@kernel("Transpose")
def _transpose(attrs, state):
    return lambda x, perm: (np.transpose(x, tuple(int(p) for p in np.ravel(perm))),)


@kernel("Pack")
def _pack(attrs, state):
    axis = attrs.get("axis", 0)

    def run(*xs):
        if axis == 0:  # np.array is np.stack on axis 0 for same-shaped, same-typed inputs, at a third of the cost
            try:
                out = np.array(xs)
            except ValueError:
                out = None
            if out is not None and out.dtype == xs[0].dtype and out.shape == (len(xs),) + np.shape(xs[0]):
                return (out,)
        return (np.stack(xs, axis=axis),)
    return run


@kernel("Unpack")
def _unpack(attrs, state):
    axis = attrs.get("axis", 0)
    return lambda x: tuple(np.moveaxis(x, axis, 0))


@kernel("ConcatV2")
def _concat(attrs, state):
    return lambda *xs: (np.concatenate(xs[:-1], axis=int(xs[-1])),)


@kernel("Split")
def _split(attrs, state):
    count = attrs.get("num_split")
    return lambda axis, x: tuple(np.split(x, count, axis=int(axis)))


@kernel("SplitV")
def _split_v(attrs, state):
    def run(x, sizes, axis):
        axis = int(axis)
        sizes = [int(s) for s in sizes]
        if -1 in sizes:
            sizes[sizes.index(-1)] = x.shape[axis] - (sum(sizes) + 1)
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))
    return run


@kernel("Slice")
def _slice(attrs, state):
    def run(x, begin, size):
        index = tuple(slice(int(b), None if int(s) == -1 else int(b) + int(s)) for b, s in zip(begin, size))
        return (x[index],)
    return run


@kernel("StridedSlice")
def _strided_slice(attrs, state):
    masks = {name: attrs.get(name, 0) for name in
             ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}

    def run(x, begin, end, strides):
        index = []
        for i, (b, e, s) in enumerate(zip(begin.tolist(), end.tolist(), strides.tolist())):
            bit = 1 << i
            if masks["ellipsis_mask"] & bit:
                index.append(Ellipsis)
            elif masks["new_axis_mask"] & bit:
                index.append(np.newaxis)
            elif masks["shrink_axis_mask"] & bit:
                index.append(b)
            else:
                index.append(slice(None if masks["begin_mask"] & bit else b,
                                   None if masks["end_mask"] & bit else e, s))
        try:
            return (np.asarray(x)[tuple(index)],)
        except IndexError as exc:
            raise invalid(f"slice index out of bounds in {attrs.node}: {exc}") from None
    return run


@kernel("Tile")
def _tile(attrs, state):
    return lambda x, multiples: (np.tile(x, tuple(int(m) for m in multiples)),)


@kernel("BroadcastTo")
def _broadcast_to(attrs, state):
    return lambda x, shape: (np.broadcast_to(x, tuple(int(d) for d in shape)).copy(),)


@kernel("Fill")
def _fill(attrs, state):
    return lambda shape, value: (np.full(tuple(int(d) for d in shape), value, dtype=np.asarray(value).dtype),)


@kernel("Range")
def _range(attrs, state):
    out = _np(attrs.get("Tidx", dtypes.DT_INT32))
    return lambda start, limit, delta: (np.arange(start, limit, delta).astype(out),)


@kernel("Cast")
def _cast(attrs, state):
    out = _np(attrs.get("DstT"))
    return lambda x: (np.asarray(x).astype(out),)


@kernel("Pad", "PadV2", "MirrorPad")
def _pad(attrs, state):
    mode = {b"REFLECT": "reflect", b"SYMMETRIC": "symmetric"}.get(attrs.get("mode"), "constant")

    def run(x, paddings, constant=None):
        pads = [tuple(int(v) for v in row) for row in paddings]
        if mode != "constant":
            return (np.pad(x, pads, mode=mode),)
        return (np.pad(x, pads, constant_values=0 if constant is None else constant),)
    return run


@kernel("Select")
def _select(attrs, state):
    def run(cond, x, y):
        if cond.ndim == 1 and x.ndim > 1:  # v1 Select: a vector picks whole rows
            cond = cond.reshape((-1,) + (1,) * (x.ndim - 1))
        return (np.where(cond, x, y),)
    return run


@kernel("SelectV2")
def _select_v2(attrs, state):
    return lambda cond, x, y: (np.where(cond, x, y),)


@kernel("ClipByValue")
def _clip(attrs, state):
    return lambda x, low, high: (np.clip(x, low, high).astype(x.dtype, copy=False),)


@kernel("LeakyRelu")
def _leaky_relu(attrs, state):
    alpha = attrs.get("alpha", 0.2)
    return lambda x: (np.where(x > 0, x, x * np.asarray(alpha, x.dtype)),)


@kernel("Gelu")
def _gelu(attrs, state):
    approximate = attrs.get("approximate", False)

    def run(x):
        if approximate:
            inner = np.asarray(math.sqrt(2 / math.pi), x.dtype) * (x + np.asarray(0.044715, x.dtype) * x ** 3)
            return ((0.5 * x * (1 + np.tanh(inner))).astype(x.dtype, copy=False),)
        return ((0.5 * x * (1 + _erf(x / np.asarray(math.sqrt(2), x.dtype)))).astype(x.dtype, copy=False),)
    return run


# ---- reductions, indexing --------------------------------------------------------------------
def _reduction(fn):
    def builder(attrs, state):
        keep = bool(attrs.get("keep_dims", False))

        def run(x, axes):
            axes = tuple(int(a) for a in np.ravel(axes))
            x = np.asarray(x)
            if fn is np.mean and x.dtype.kind in "iu":
                result = (np.sum(x, axis=axes, keepdims=keep) // max(1, int(np.prod([x.shape[a] for a in axes]))))
            else:
                result = fn(x, axis=axes, keepdims=keep)
            return (np.asarray(result).astype(x.dtype, copy=False),)
        return run
    return builder


for _name, _fn in {"Mean": np.mean, "Sum": np.sum, "Max": np.max, "Min": np.min, "Prod": np.prod,
                   "All": np.all, "Any": np.any}.items():
    KERNELS[_name] = _reduction(_fn)


@kernel("ArgMax", "ArgMin")
def _arg(attrs, state):
    out = _np(attrs.get("output_type", dtypes.DT_INT64))
    fn = np.argmin if attrs.node_op == "ArgMin" else np.argmax
    return lambda x, axis: (fn(x, axis=int(axis)).astype(out),)


def _check_indices(indices, size: int, node: str):
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        bad = indices[(indices < 0) | (indices >= size)].flat[0]
        raise invalid(f"indices = {bad} is not in [0, {size}) ({node})")


@kernel("GatherV2")
def _gather(attrs, state):
    if attrs.get("batch_dims", 0):
        raise ServingError(Code.UNIMPLEMENTED, "GatherV2 with batch_dims")

    def run(params, indices, axis):
        axis = int(axis) % params.ndim
        _check_indices(indices, params.shape[axis], attrs.node)
        return (np.take(params, indices, axis=axis),)
    return run


@kernel("ResourceGather")
def _resource_gather(attrs, state):
    if attrs.get("batch_dims", 0):
        raise ServingError(Code.UNIMPLEMENTED, "ResourceGather with batch_dims")

    def run(handle, indices):
        params = handle.read()
        _check_indices(indices, params.shape[0], attrs.node)
        return (np.take(params, indices, axis=0),)
    return run


@kernel("OneHot")
def _one_hot(attrs, state):
    axis = attrs.get("axis", -1)

    def run(indices, depth, on, off):
        depth = int(depth)
        hot = np.arange(depth) == np.asarray(indices)[..., None]
        out = np.where(hot, on, off).astype(np.asarray(on).dtype)
        return (out if axis == -1 else np.moveaxis(out, -1, axis),)
    return run


# ---- linear algebra and convolutions ---------------------------------------------------------
@kernel("MatMul")
def _matmul(attrs, state):
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)

    def run(a, b):
        if a.ndim != 2 or b.ndim != 2:
            raise invalid(f"In[0] and In[1] must be matrices: {list(a.shape)} and {list(b.shape)}")
        a, b = (a.T if ta else a), (b.T if tb else b)
        if a.shape[1] != b.shape[0]:
            raise invalid(f"Matrix size-incompatible: In[0]: {list(a.shape)}, In[1]: {list(b.shape)}")
        return (a @ b,)
    return run


@kernel("BatchMatMulV2", "BatchMatMulV3", "BatchMatMul")
def _batch_matmul(attrs, state):
    ax, ay = attrs.get("adj_x", False), attrs.get("adj_y", False)
    out = attrs.get("Tout")

    def run(x, y):
        x = np.swapaxes(x, -1, -2) if ax else x
        y = np.swapaxes(y, -1, -2) if ay else y
        result = np.matmul(x, y)
        return (result.astype(_np(out)) if out else result,)
    return run


@kernel("Einsum")
def _einsum(attrs, state):
    equation = attrs.get("equation").decode()
    return lambda *xs: (np.einsum(equation, *xs),)


@kernel("BiasAdd", "BiasAddV1")
def _bias_add(attrs, state):
    nchw = attrs.get("data_format", b"NHWC") == b"NCHW"

    def run(x, bias):
        if nchw and x.ndim > 2:
            return (x + bias.reshape((-1,) + (1,) * (x.ndim - 2)),)
        if x.shape[-1] != bias.shape[0]:
            raise invalid(f"Must provide as many biases as the last dimension of the input tensor: "
                          f"{list(bias.shape)} vs. {list(x.shape)}")
        return (x + bias,)
    return run


def _spatial(attrs, rank: int = 2):
    """(strides, dilations, padding, explicit pads, NCHW?) of a convolution or pool node."""
    nchw = attrs.get("data_format", b"NHWC") in (b"NCHW", b"NCDHW")
    strides = attrs.get("strides") or [1] * (rank + 2)
    dilations = attrs.get("dilations") or [1] * (rank + 2)
    sl = slice(2, None) if nchw else slice(1, -1)
    explicit = attrs.get("explicit_paddings") or []
    if explicit:
        pairs = [tuple(explicit[2 * i:2 * i + 2]) for i in range(rank + 2)]
        explicit = pairs[sl]
    return tuple(strides[sl]), tuple(dilations[sl]), attrs.get("padding", b"VALID"), explicit, nchw


def _pads(size: int, k: int, stride: int, dilation: int, padding: bytes) -> tuple[int, int]:
    eff = (k - 1) * dilation + 1
    if padding == b"SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + eff - size, 0)
        return total // 2, total - total // 2
    return 0, 0


def _windows(x, ksize, strides, dilations, padding, explicit, fill=0.0):
    """NHWC ``x`` padded and cut into windows: [N, OH, OW, C, KH, KW]."""
    if explicit:
        pads = [tuple(p) for p in explicit]
    else:
        pads = [_pads(x.shape[1 + i], ksize[i], strides[i], dilations[i], padding) for i in range(2)]
    if any(p != (0, 0) for p in pads):
        x = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=fill)
    eff = tuple((k - 1) * d + 1 for k, d in zip(ksize, dilations))
    if x.shape[1] < eff[0] or x.shape[2] < eff[1]:
        raise invalid(f"Computed output size would be negative: input {list(x.shape)}, window {list(eff)}")
    win = sliding_window_view(x, eff, axis=(1, 2))
    return win[:, ::strides[0], ::strides[1], :, ::dilations[0], ::dilations[1]]


def _nhwc(fn, nchw: bool):
    if not nchw:
        return fn
    return lambda x, *rest: tuple(np.transpose(y, (0, 3, 1, 2)) for y in fn(np.transpose(x, (0, 2, 3, 1)), *rest))


@kernel("Conv2D")
def _conv2d(attrs, state):
    strides, dilations, padding, explicit, nchw = _spatial(attrs)

    def run(x, f):
        if x.ndim != 4 or x.shape[3] != f.shape[2]:
            raise invalid(f"input depth must be evenly divisible by filter depth: input {list(x.shape)}, "
                          f"filter {list(f.shape)}")
        win = _windows(x, f.shape[:2], strides, dilations, padding, explicit)
        return (np.tensordot(win, f, axes=([3, 4, 5], [2, 0, 1])).astype(x.dtype, copy=False),)
    return _nhwc(run, nchw)


@kernel("DepthwiseConv2dNative")
def _depthwise(attrs, state):
    strides, dilations, padding, explicit, nchw = _spatial(attrs)

    def run(x, f):
        if x.ndim != 4 or x.shape[3] != f.shape[2]:
            raise invalid(f"input depth {x.shape[-1]} does not match the filter's {f.shape[2]}")
        win = _windows(x, f.shape[:2], strides, dilations, padding, explicit)
        out = np.einsum("nhwcij,ijcm->nhwcm", win, f)
        return (out.reshape(out.shape[:3] + (-1,)).astype(x.dtype, copy=False),)
    return _nhwc(run, nchw)


@kernel("MaxPool", "AvgPool")
def _pool(attrs, state):
    strides, _, padding, explicit, nchw = _spatial(attrs)
    ksize = attrs.get("ksize")
    ksize = tuple(ksize[2:] if nchw else ksize[1:-1])
    average = attrs.node_op == "AvgPool"

    def run(x):
        if x.ndim != 4:
            raise invalid(f"input must be 4-dimensional {list(x.shape)}")
        if not average:
            win = _windows(x, ksize, strides, (1, 1), padding, explicit, fill=-np.inf)
            return (win.max(axis=(4, 5)).astype(x.dtype, copy=False),)
        win = _windows(x, ksize, strides, (1, 1), padding, explicit)
        # SAME pooling averages over the window's cells inside the input only.
        ones = np.ones((1,) + x.shape[1:3] + (1,), x.dtype)
        count = _windows(ones, ksize, strides, (1, 1), padding, explicit).sum(axis=(4, 5))
        return ((win.sum(axis=(4, 5)) / count).astype(x.dtype, copy=False),)
    return _nhwc(run, nchw)


@kernel("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_batch_norm(attrs, state):
    if attrs.get("is_training", True):
        raise ServingError(Code.UNIMPLEMENTED, f"{attrs.node}: FusedBatchNorm in training mode")
    epsilon = attrs.get("epsilon", 1e-4)
    nchw = attrs.get("data_format", b"NHWC") == b"NCHW"
    outputs = 6 if attrs.node_op == "FusedBatchNormV3" else 5

    def run(x, scale, offset, mean, variance):
        factor = (scale / np.sqrt(variance + np.asarray(epsilon, variance.dtype))).astype(scale.dtype)
        shift = offset - mean * factor
        if nchw:
            factor, shift = (v.reshape((-1,) + (1,) * (x.ndim - 2)) for v in (factor, shift))
        y = (x * factor.astype(x.dtype) + shift.astype(x.dtype)).astype(x.dtype, copy=False)
        return (y, mean, variance, mean, variance, np.zeros(0, mean.dtype))[:outputs]
    return run


# ---- the call ops are expanded by ``program``; listed so the op check accepts them -------------
CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
FEED_OPS = frozenset({"Placeholder"})
# Ops of save functions and restore paths that a serving load never runs but may reach.
SUPPORTED = frozenset(KERNELS) | CALL_OPS | FEED_OPS
