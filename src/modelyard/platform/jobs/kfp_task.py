"""A KFP lightweight component's step forked from a pipeline task's warm job process (``warm_jobs.fork_replica``):

    python3 -m modelyard.platform.jobs.kfp_task MODULE ARGS...   (in the fork: runpy, as forkserver does)

First this process becomes the job's own Python, as ``python3`` from the job's ``PATH`` would start
(``VIRTUAL_ENV``, its virtual environment: job_env.PythonEnv): ``sys.executable``, ``sys.prefix``
and the venv's site directory with its ``.pth`` files, so a step that runs ``sys.executable -m pip
install`` installs into the job's environment, never the platform's. Then it runs ``python3 -m
MODULE ARGS`` (KFP's executor) as ``__main__``, as the component's shell script would.
"""
from __future__ import annotations

import os
import runpy
import site
import sys
import sysconfig


def enter_venv(root: str | None) -> None:
    """Make this (forked) interpreter the one of the virtual environment ``root`` (None: as it is)."""
    if not root or not os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        return
    sys.executable = os.path.join(root, "bin", "python3")
    sys.prefix = sys.exec_prefix = root
    site.PREFIXES[:] = [root]
    purelib = sysconfig.get_path("purelib", vars={"base": root, "platbase": root})
    if os.path.isdir(purelib):
        site.addsitedir(purelib)


def main() -> None:
    module = sys.argv[1]
    enter_venv(os.environ.get("VIRTUAL_ENV"))
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    sys.modules.pop(module, None)  # run fresh as __main__, as `python3 -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
