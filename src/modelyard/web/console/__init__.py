"""The console at ``/console`` on ``modelyard serve``: models, versions, labels, runtimes, live traffic.

``Console`` answers the console's paths for the REST app (``RestApp.console``); its
state comes from the server's manager and Prometheus metrics (``state``), its page is
rendered on the server (``page``) and refreshed by a small script polling the state.

The platform's console (``modelyard platform``): ``platform_app`` (aiohttp routes, registered by the
platform's ``build_app``), ``platform_state`` (store, routing, metrics), ``platform_jobs`` (jobs
through the REST API), ``platform_page`` (the HTML); ``assets/chart.js`` is shared by both pages.

May import: ``modelyard.serving.manager`` (config files), ``modelyard.web``; the server and the
platform objects are duck-typed, so ``modelyard.platform`` is never imported here (which imports
this package to serve the console).
"""
from modelyard.web.console.app import Console

__all__ = ["Console"]
