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
