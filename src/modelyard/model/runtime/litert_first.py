"""A SavedModel served on LiteRT first, TensorFlow for the rest: the one servable both runtime paths give.

``choose_runtime`` builds it over a session it has just loaded and checked LiteRT against;
``choose_runtime.cached_servable`` and batch workers build it from verified conversions on disk
(``litert_cache``), with no session until one is needed. Either way:

- a signature in ``fast`` runs on its LiteRT conversion;
- a request LiteRT refuses (say, a shape its kernels cannot take) goes to TensorFlow, so the
  answer or error is TensorFlow's own, as in TF Serving, and the runtime never changes either;
- a signature LiteRT cannot take at all (``litert_can_take``) runs on TensorFlow.

Which signatures LiteRT can take is decided here, once, for every caller.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
import numpy as np

from modelyard.errors import ServingError
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import Signature

log = logging.getLogger("modelyard.serving")


def litert_can_take(sig: Signature) -> bool:
    """Whether LiteRT can run ``sig`` at all: every input numeric (or bool) with a known shape whose
    dimensions past the batch are fixed. Serialized Examples, strings and unknown shapes (classify
    and regress) stay on TensorFlow under every runtime."""
    for spec in sig.inputs.values():
        if spec.shape is None or not spec.shape or any(d < 0 for d in spec.shape[1:]):
            return False
        if spec.numpy_dtype.kind not in "fiub":
            return False
    return True


class LiteRTFirstServable(Servable):
    """``fast``: signature name -> ``litert.AliasedRunner``. ``session``: the TensorFlow session when the
    caller has one; otherwise ``load_session()`` loads it on first need (``session_config`` for it), so
    until then the process need not import TensorFlow. ``from_cache``: the runners came from
    ``litert_cache`` rather than a conversion checked in this process."""

    runtime = "litert"

    def __init__(self, path: Path, signatures: dict[str, Signature], fast: dict, signature_def_map=None, *,
                 session: Servable | None = None, session_config=None, from_cache: bool = False):
        super().__init__(path, signatures, signature_def_map)
        self._fast = fast
        self._session = session
        self._session_config = session_config
        self._session_lock = threading.Lock()
        self.from_cache = from_cache
        # Inline on the event loop only when no signature LiteRT can take is left to a session.
        self.inline_ok = set(fast) >= {n for n, s in signatures.items() if litert_can_take(s)}

    @classmethod
    def over_session(cls, session: Servable, fast: dict) -> "LiteRTFirstServable":
        """``fast`` signatures of a loaded ``session`` on LiteRT, the rest on the session."""
        return cls(session.path, session.signatures, fast, session.signature_def_map, session=session)

    @classmethod
    def of_entry(cls, path: Path, signature: Signature, content: bytes, in_keys: dict, out_keys: dict,
                 **kwargs) -> "LiteRTFirstServable":
        """One signature, from its cache entry (``litert_cache.load``'s answer)."""
        from modelyard.model.runtime.litert import AliasedRunner, LiteRTRunner

        runner = AliasedRunner(LiteRTRunner(content, signature.name), in_keys, out_keys)
        return cls(path, {signature.name: signature}, {signature.name: runner}, from_cache=True, **kwargs)

    def runtime_of(self, signature_name: str) -> str:
        return "litert" if signature_name in self._fast else "tensorflow"

    def session(self) -> Servable:
        """The TensorFlow session, loaded now if this servable has none yet."""
        with self._session_lock:
            if self._session is None:
                from modelyard.model.runtime.tf_session import load_saved_model

                log.info("Loading %s into TensorFlow too, for what LiteRT does not answer", self.path)
                self._session = load_saved_model(self.path, self._session_config)
            return self._session

    def run(self, signature, inputs: dict[str, np.ndarray], output_aliases) -> dict[str, np.ndarray]:
        fast = self._fast.get(signature.name)
        if fast is not None:
            try:
                return fast.run(inputs, output_aliases)
            except ServingError:
                pass  # LiteRT refused these inputs: TensorFlow answers them, with its own result or error
        session = self.session()
        return session.run(session.signatures[signature.name], inputs, output_aliases)

    def close(self) -> None:
        self._fast.clear()
        if self._session is not None:
            self._session.close()
