"""modelyard platform: a Vertex-AI-compatible control plane (models, endpoints, deployed models,
traffic splits) with a gateway in front of local ``modelyard serve`` replica processes.

The stock ``google-cloud-aiplatform`` SDK drives it over REST unchanged. Serving is reached only
through processes and HTTP: nothing here imports ``modelyard.serving``.
"""
