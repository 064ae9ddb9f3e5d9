"""The console at ``/console`` on ``modelyard serve``: models, versions, labels, runtimes, live traffic.

``Console`` answers the console's paths for the REST app (``RestApp.console``); its
state comes from the server's manager and Prometheus metrics (``state``), its page is
rendered on the server (``page``) and refreshed by a small script polling the state.

May import: ``modelyard.serving.manager`` (config files), ``modelyard.web``; the server object is
duck-typed, so ``serving`` never has to import this package to be imported by it.
"""
from modelyard.web.console.app import Console

__all__ = ["Console"]
