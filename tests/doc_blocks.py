"""Fenced blocks of the README and docs/ pages, and running shell lines as a user's venv would.

One reader for every doc test: a fence's language says what the block is. ``bash``/``sh`` blocks
are commands, ``python`` blocks code, ``yaml``/``json`` file contents, and ``text`` (or another
language no runner knows, such as ``nginx``) a sample the reader looks at: output, a file tree, a
usage synopsis. An untyped fence is refused by tests/test_docs.py, so every block says which it is.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests import warm_shell

# A fence may be indented (a block inside a list item): its body loses that indentation, as Markdown reads it.
_FENCE = re.compile(r"^([ \t]*)```([\w+-]*)[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str  # the fence's language, "" when untyped
    body: str
    line: int  # 1-based line of the opening fence

    def where(self, page: str) -> str:
        return f"{page}:{self.line} ({self.lang or 'untyped'})"


def _dedent(body: str, indent: str) -> str:
    return "".join(line[len(indent):] if line.startswith(indent) else line.lstrip(" \t")
                   for line in body.splitlines(keepends=True))


def blocks(text: str) -> list[Block]:
    """Every fenced block of ``text``, in order, indented ones (inside list items) included."""
    return [Block(m.group(2), _dedent(m.group(3), m.group(1)), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)]


def fenced(text: str, lang: str) -> list[str]:
    return [b.body for b in blocks(text) if b.lang == lang]


def shell_commands(block: str) -> list[str]:
    """The block's command lines, trailing comments (after two spaces) cut off."""
    lines = [re.sub(r"\s{2,}#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def shell_env(tmp_path: Path, **extra: str) -> dict:
    """``modelyard`` and ``python3`` on PATH as a user's venv has them: this interpreter's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # The console script pip writes: modelyard launch recognises it as this interpreter's and forks its tasks warm.
    # The __main__ guard matters: a multiprocessing "spawn" child (a server's --workers, batch-predict's workers)
    # runs this file again as __mp_main__, and must not run the command again. Before pip's lines it asks this
    # pytest worker to fork the command warm (tests/warm_shell.py); when it cannot, pip's lines run it cold.
    (bin_dir / "modelyard").write_text(warm_shell.shim_text())
    (bin_dir / "modelyard").chmod(0o755)
    put_python_on_path(bin_dir)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("MODELYARD_LOG_LEVEL", None)
    env[warm_shell.VARIABLE] = warm_shell.socket_path()
    env.update(extra)
    return env


def put_python_on_path(bin_dir: Path, interpreter: str = sys.executable) -> None:
    """``python3`` and ``python`` in ``bin_dir`` that run ``interpreter``, venv and all.

    Small scripts that exec it, not symlinks: a venv's Python finds its pyvenv.cfg beside the path it was
    started by, so a symlink to it elsewhere starts the base interpreter, without the venv's packages
    (``No module named 'modelyard'`` under the README's own venv)."""
    for name in ("python3", "python"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(interpreter)} "$@"\n')
        script.chmod(0o755)


def sh(command: str, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` with bash (-e, pipefail); a failure shows the command and its output."""
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def indented_blocks(text: str) -> list[Block]:
    """Markdown's indented code blocks (four spaces, after a blank line, outside fences and list items), in
    order, as blocks of language ``indented``: the one-line commands the pages show without a fence."""
    found: list[Block] = []
    lines = text.splitlines()
    in_fence, paragraph_indent, i = False, 0, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("    ") and i and not lines[i - 1].strip() and paragraph_indent == 0:
            start = i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            body = "\n".join(s[4:] for s in lines[start:i]).strip("\n") + "\n"
            found.append(Block("indented", body, start + 1))
            continue
        elif not in_fence and line.strip():
            # A list item's text (and its continuation lines) is indented: four spaces there are not code.
            stripped = line.lstrip()
            paragraph_indent = len(line) - len(stripped) + (2 if re.match(r"[-*+] |\d+\. ", stripped) else 0)
        i += 1
    return found
