"""Which modules a warm command trial's child would import that its fork server may import first.

A warm child (tuning.forkserver) runs the trial's script from an interpreter that has imported
TensorFlow; everything else the script imports at its top level (scikit-learn, pandas, modelyard's
trainer...) it would import again in every trial, seconds each. The server imports those once
instead, if that cannot change what the child runs:

- only plain absolute ``import a.b`` / ``from a.b import c`` statements of the script's (or the
  ``-m`` module's) top level, read with ``ast``, never executed here; ``from a.b import c`` gives
  ``a.b``;
- only a module installed in site-packages or the standard library (``_installed``), and never one the
  child would find in its own ``sys.path[0]`` (the script's folder, or the working directory for
  ``-m``): the user's code (beside the script, an editable install, a ``PYTHONPATH`` folder) may read
  the trial's parameters or environment when it is imported, and a same-named installed module would
  shadow it;
- the server imports a module only if it is found without the server's working directory on its
  path, skips one that fails, and drops one that starts a thread (forkserver.serve): a fork copies
  only the thread that forks.

``python -m modelyard train`` imports its trainer (and the built-in digits data, scikit-learn)
inside functions, not at the top, and its command line imports every area's CLI module
(``modelyard.cli``, seconds in all): those are named here, as the platform's warm server names them.
"""
from __future__ import annotations

import ast
from pathlib import Path

# What `modelyard train` imports after its command line is parsed: the CLI, the trainer, and
# the built-in digits data (scikit-learn's bundled set), seconds of imports per trial.
TRAIN_MODULES = ("modelyard.cli", "modelyard.training.trainer", "modelyard.datasets", "sklearn.datasets")


def train_modules() -> tuple[str, ...]:
    """What ``python -m modelyard train`` imports, in order: its command line's CLI modules (cli's parser
    imports every area's), the trainer and the digits data. The tuner's fork server and the platform's
    warm jobs (platform.jobs.warm_jobs) both preload these."""
    from modelyard.cli import _AREAS

    return (TRAIN_MODULES[0], *_AREAS, *TRAIN_MODULES[1:])


def command_source(command: list[str], workdir: Path) -> Path | None:
    """The file a ``python script.py`` / ``python -m module`` command runs first (a package's
    ``__main__``), or None when it cannot be found."""
    if command[1] == "-m":
        import importlib.util

        try:
            spec = importlib.util.find_spec(command[2])
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if spec.submodule_search_locations:  # a package: -m runs its __main__
            main = Path(list(spec.submodule_search_locations)[0]) / "__main__.py"
            return main if main.is_file() else None
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    path = Path(command[1])
    return path if path.is_absolute() else workdir / path


def top_level_imports(source: str) -> list[str]:
    """The absolute modules the top level of ``source`` imports, in order, without repeats."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            names.append(node.module)
    return list(dict.fromkeys(names))


def _local(name: str, folder: Path) -> bool:
    """Whether ``folder`` (the child's ``sys.path[0]``) holds a module or package named like ``name``'s top."""
    top = name.split(".")[0]
    try:
        return (folder / top).is_dir() or any(p.is_file() for p in folder.glob(f"{top}.*"))
    except OSError:
        return True  # cannot tell: not preloaded


def _installed(name: str) -> bool:
    """Whether ``name``'s top-level package is one pip installed (site-packages) or the standard library's,
    found without importing anything: not an editable install, a ``PYTHONPATH`` folder or the working
    directory, where the user's own code lives (it may read the trial's environment when imported)."""
    import importlib.util
    import sysconfig

    top = name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported to find it
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    where = list(spec.submodule_search_locations or ()) or [spec.origin or ""]
    roots = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return all(any(Path(w).resolve().is_relative_to(root) for root in roots) for w in where if w)


def preload_modules(command: list[str], workdir: Path) -> tuple[str, ...]:
    """The modules a fork server may import for ``command`` (a warm command: forkserver.is_warm_command)."""
    from modelyard.tuning.spec import is_modelyard_train

    folder = workdir if command[1] == "-m" else (workdir / command[1]).resolve().parent
    names: list[str] = []
    path = command_source(command, workdir)
    if path is not None:
        try:
            names = [n for n in top_level_imports(path.read_text(errors="replace")) if _installed(n)]
        except OSError:
            names = []
    if is_modelyard_train(command):
        names += train_modules()
    if command[1] == "-m":  # never the module -m runs, nor its package (runpy warns of a module already imported)
        target = command[2]
        names = [n for n in names if n != target and not target.startswith(n + ".")]
    return tuple(n for n in dict.fromkeys(names) if not _local(n, folder))
