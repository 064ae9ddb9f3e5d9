"""TensorFlow's message types without TensorFlow's import, for processes that may never run it.

A ``modelyard serve`` of a model whose LiteRT conversion is cached answers every request on
LiteRT, yet TF Serving's API needs TensorFlow's protocol buffers (``tensorflow.core.framework``,
``tensorflow_serving.apis``), and importing any of them runs ``tensorflow/__init__.py``: 5-10 s of
CPU, most of a replica's start.

``defer()`` does what ``import tensorflow`` does in two steps instead of one: the package's module
object goes into ``sys.modules`` at once (so its ``*_pb2`` submodules import on their own, as
plain generated Python), and its ``__init__`` runs only when something needs TensorFlow itself:
an attribute of the package (``tf.compat``, ``tf.errors`` ...) or an import of anything of it
other than its message modules (``tensorflow.python...``). From then on it is the same module
object, fully initialised, as a plain ``import tensorflow`` gives.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading

_lock = threading.RLock()
_state = {"module": None, "loader": None, "loading": None, "root": ""}  # loading: the thread running __init__


def defer() -> bool:
    """Put TensorFlow's package in ``sys.modules`` without running it; False when it is imported
    already (or not installed)."""
    with _lock:
        if "tensorflow" in sys.modules:
            return False
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return False
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _attribute  # PEP 562: asked only for what the module lacks
        _state.update(module=module, loader=spec.loader, root=list(spec.submodule_search_locations)[0])
        sys.modules["tensorflow"] = module
        sys.meta_path.insert(0, _RunFirst())
        return True


def deferred() -> bool:
    """Whether TensorFlow's package is in ``sys.modules`` but its ``__init__`` has not run yet."""
    return _state["module"] is not None


def load():
    """Run TensorFlow's ``__init__`` now (once; other threads wait for it) and return the package."""
    with _lock:
        module = _state["module"]
        if module is None or _state["loading"] is threading.current_thread():
            return sys.modules.get("tensorflow")
        _state["loading"] = threading.current_thread()
        try:
            _state["loader"].exec_module(module)
        except BaseException:
            sys.modules.pop("tensorflow", None)  # a later import tries again, as after any failed import
            raise
        finally:
            _state["loading"] = None
            _state["module"] = None
        if module.__dict__.get("__getattr__") is _attribute:
            del module.__getattr__
        return module


def _attribute(name: str):
    submodule = sys.modules.get(f"tensorflow.{name}")
    if submodule is not None:  # a message package (tensorflow.core) asked for by the generated code
        return submodule
    module = _state["module"]
    if module is None or _state["loading"] is threading.current_thread():
        raise AttributeError(f"module 'tensorflow' has no attribute {name!r}")  # asked by its own __init__
    return getattr(load(), name)


def _message_module(name: str) -> bool:
    """TensorFlow's generated message modules (``*_pb2``, plain Python) and the packages holding them,
    whose ``__init__.py`` is empty (tensorflow.core.framework, tensorflow.compiler.xla.tsl.protobuf ...)."""
    if name.endswith("_pb2"):
        return True
    try:
        return os.stat(os.path.join(_state["root"], *name.split(".")[1:], "__init__.py")).st_size == 0
    except OSError:
        return False


class _RunFirst:
    """A meta path finder: importing any other part of TensorFlow runs its ``__init__`` first.

    The import system calls finders holding its global lock, so this never waits: while some
    thread runs ``__init__``, the import goes on as any import during a first import does. When
    ``__init__`` imported the module itself, the spec returned hands that module over, so it is
    not executed twice."""

    def find_spec(self, name, path=None, target=None):
        if _state["module"] is None or _state["loading"] is not None or not name.startswith("tensorflow.") \
                or _message_module(name) or not _lock.acquire(blocking=False):
            return None
        try:
            load()
        finally:
            _lock.release()
        module = sys.modules.get(name)
        if module is None:
            return None  # not imported by TensorFlow's __init__: found and run as usual
        # The import system now takes the spec of the module already in sys.modules and would run it
        # again from that: for the moment, its spec is one whose loader hands over the module as it is.
        original = module.__spec__
        spec = importlib.util.spec_from_loader(name, _Loaded(module, original),
                                               is_package=original.submodule_search_locations is not None)
        spec.submodule_search_locations = original.submodule_search_locations
        module.__spec__ = spec
        return spec


class _Loaded:
    """The loader of a module TensorFlow's ``__init__`` imported while ``_RunFirst`` was asked for it."""

    def __init__(self, module, original_spec):
        self.module, self.original_spec = module, original_spec

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        module.__spec__ = self.original_spec  # run once already, by the import inside TensorFlow's __init__
