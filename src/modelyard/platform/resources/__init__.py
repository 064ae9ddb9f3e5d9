"""The Vertex AI resources the control plane keeps: models and their versions, endpoints,
long-running operations, and the rules for artifacts and prebuilt images.

May import: ``platform.api``, ``platform.state``, ``platform.dataplane`` (traffic rules),
``modelyard.model`` (artifact checks), ``modelyard.errors``."""
