"""The TensorFlow backend: a SavedModel loaded into a TF1-style session, run through its SignatureDefs.

Session callables are far cheaper per call than TF2 concrete functions and load every
export TF Serving loads (TF2's ``tf.saved_model.load`` fails on some TF1 exports).
"""
from __future__ import annotations

import threading
from pathlib import Path


from modelyard.errors import Code, ServingError
from modelyard.model.savedmodel import SERVE_TAG
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import INIT_OP_SIGNATURE, Signature, from_signature_def


class SessionServable(Servable):
    runtime = "tensorflow"

    def __init__(self, path: Path, session, meta_graph):
        signatures = {
            name: from_signature_def(name, sig)
            for name, sig in meta_graph.signature_def.items()
            if name != INIT_OP_SIGNATURE
        }
        super().__init__(path, signatures, meta_graph.signature_def)
        self._session = session
        self._callables: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def _callable(self, signature: Signature, feed_aliases: tuple[str, ...], output_aliases: tuple[str, ...]):
        key = (signature.name, feed_aliases, output_aliases)
        fn = self._callables.get(key)
        if fn is None:
            with self._lock:
                fn = self._callables.get(key)
                if fn is None:
                    # A callable from CallableOptions skips Session.run's Python-side feed checks
                    # (~40 us a call instead of ~200 us) and, like TF Serving's C++ session, does
                    # not hold feeds to the placeholder's static shape.
                    from tensorflow.core.protobuf import config_pb2

                    options = config_pb2.CallableOptions(
                        feed=[signature.inputs[a].tensor_name for a in feed_aliases],
                        fetch=[signature.outputs[a].tensor_name for a in output_aliases],
                    )
                    fn = self._session._make_callable_from_options(options)
                    self._callables[key] = fn
        return fn

    def run(self, signature, inputs, output_aliases):
        import tensorflow as tf

        feed_aliases = tuple(sorted(inputs))
        fn = self._callable(signature, feed_aliases, output_aliases)
        try:
            results = fn(*[inputs[a] for a in feed_aliases])
        except tf.errors.OpError as exc:
            raise ServingError(Code(exc.error_code), exc.message) from None
        except (ValueError, TypeError) as exc:
            # Raised by the session's own checks before running (e.g. a feed of the wrong shape).
            raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
        return dict(zip(output_aliases, results))

    def close(self) -> None:
        self._callables.clear()
        self._session.close()


def load_saved_model(path: Path, session_config=None) -> SessionServable:
    """Load the 'serve' MetaGraph of the SavedModel at ``path`` into its own graph and session."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # the v1 loader's deprecation notice is noise here
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=session_config)
    try:
        with graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(session, [SERVE_TAG], str(path))
    except BaseException:
        session.close()
        raise
    graph.finalize()  # no op may be added at serving time (catches accidental graph growth)
    return SessionServable(path, session, meta_graph)
