"""In the browser: a converted model run by LiteRT.js in a page (``site``, ``server``), and the console."""
