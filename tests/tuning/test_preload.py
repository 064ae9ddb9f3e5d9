"""What a warm command trial's fork server imports for it (tuning.preload): read, never run."""
from __future__ import annotations

import sys
from pathlib import Path

from modelyard.tuning.preload import TRAIN_MODULES, preload_modules, top_level_imports


def test_only_plain_top_level_imports_count():
    source = ("from __future__ import annotations\nimport os, numpy.linalg as la\nfrom json import dumps\n"
              "from . import sibling\nimport os\ndef f():\n    import pandas\nif True:\n    import yaml\n")
    assert top_level_imports(source) == ["os", "numpy.linalg", "json"]
    assert top_level_imports("import (") == []


def test_the_scripts_own_modules_are_left_to_the_child(tmp_path: Path):
    (tmp_path / "helpers.py").write_text("x = 1\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "train.py").write_text("import json\nimport helpers\nfrom mypkg.sub import y\nimport numpy\n")
    assert preload_modules([sys.executable, "train.py", "--lr=1"], tmp_path) == ("json", "numpy")


def test_modelyard_train_preloads_its_trainer_not_the_module_it_runs(tmp_path: Path):
    modules = preload_modules([sys.executable, "-m", "modelyard", "train", "job.yaml"], tmp_path)
    assert set(TRAIN_MODULES) | {"modelyard.training.cli", "modelyard.serving.cli"} <= set(modules)
    assert len(set(modules)) == len(modules) and "modelyard" not in modules
    tool = preload_modules([sys.executable, "-m", "json.tool"], tmp_path)  # json.tool does `import json`
    assert "argparse" in tool and not {"json", "json.tool"} & set(tool), tool


def test_the_users_own_package_elsewhere_on_the_path_is_not_preloaded(tmp_path: Path, monkeypatch):
    """An editable install or a PYTHONPATH folder holds the user's code, which may read the trial's
    environment when imported: only site-packages and the standard library are preloaded."""
    elsewhere = tmp_path / "src"
    (elsewhere / "myproj").mkdir(parents=True)
    (elsewhere / "myproj" / "__init__.py").write_text("import os\nMODEL_DIR = os.environ.get('AIP_MODEL_DIR')\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("import json\nfrom myproj import MODEL_DIR\nimport numpy\n")
    assert preload_modules([sys.executable, "train.py"], tmp_path / "job") == ("json", "numpy")


def test_a_package_run_with_dash_m_is_read_from_its_main(tmp_path: Path, monkeypatch):
    from modelyard.tuning.forkserver import imports_tensorflow

    (tmp_path / "mytrainer").mkdir()
    (tmp_path / "mytrainer" / "__init__.py").write_text("")
    (tmp_path / "mytrainer" / "__main__.py").write_text("import tensorflow as tf\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert imports_tensorflow([sys.executable, "-m", "mytrainer"], tmp_path)
    (tmp_path / "mytrainer" / "__main__.py").write_text("print('no tensorflow here')\n")
    assert not imports_tensorflow([sys.executable, "-m", "mytrainer"], tmp_path)
