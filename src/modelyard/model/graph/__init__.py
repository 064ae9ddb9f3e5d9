"""A SavedModel executor without TensorFlow: the serving image's runtime when TensorFlow is not installed.

``bundle`` reads the variables (the tensor bundle's index table and data shards, CRC32C checked),
``ops`` holds the NumPy kernels of the ops Keras inference graphs use, ``program`` expands a MetaGraph's
graph and function library into one flat graph, restores the variables by running the SavedModel's own
restore op, folds everything that does not depend on a request into constants and compiles each
signature into a list of kernel calls; ``model.runtime.graph_servable`` serves that as a ``Servable``.
A graph with an op outside ``ops.KERNELS`` is refused at load, naming the ops. ``messages_only`` writes the
slim image's ``tensorflow`` package: TensorFlow's message modules without its runtime.

May import: ``modelyard.model`` (not ``model.runtime``, which imports this), ``modelyard.errors`` and the
leaves ``modelyard.crc32c`` and ``modelyard.tfrecord_frames`` only.
"""
