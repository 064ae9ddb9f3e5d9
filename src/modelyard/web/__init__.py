"""In the browser: a converted model run by LiteRT.js in a page (``site``, ``server``), and the console.

May import: ``modelyard.model``, ``modelyard.demo`` (cache dir); ``web/console`` also
``serving.manager`` (config files). Never the server itself, nor ``modelyard.platform``: each holds
its console and is duck-typed by it.
"""
