"""Running one loaded model version: the ``Servable`` interface, its TensorFlow-session and
LiteRT backends, the TensorFlow-free ``graph`` backend (``graph_servable`` over ``model.graph``), the
``auto`` runtime choice (LiteRT where it matches TensorFlow), and
``inference``: predict / classify / regress with TF Serving's checks and messages.

May import: ``modelyard.model`` and ``modelyard.errors`` only.
"""
