"""modelyard platform: a Vertex-AI-compatible control plane (models, endpoints, deployed models,
traffic splits) with a gateway in front of ``modelyard serve`` replica processes, local or started by
Ray actors on a Ray cluster (``--engine ray``).

The stock ``google-cloud-aiplatform`` SDK drives it over REST unchanged. Serving is reached only
through processes and HTTP: nothing here imports ``modelyard.serving``.

May import: ``modelyard.model`` (artifact checks), ``modelyard.errors``, ``modelyard.web.console``
(the /console routes, which duck-type the platform); ``serving`` only as ``modelyard serve``
processes over HTTP.
"""
