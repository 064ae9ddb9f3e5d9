"""Jobs: the REST resources of every job kind (batch prediction, custom, training pipelines,
tuning), the runner that supervises their child processes, what those processes find around
them, and the Ray engine for custom jobs.

May import: every other part of the platform (``api``, ``state``, ``dataplane``, ``resources``,
``storage``), ``modelyard.batch`` and ``modelyard.tuning`` (inside the job processes)."""
