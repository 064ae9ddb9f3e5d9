"""tests/classify.py: what makes a test e2e (it reaches a process starter), and the guard."""
from __future__ import annotations

import importlib
import subprocess

import pytest

from tests import classify

# Named by strings, so this module itself reads as quick (the reader follows names, not strings).
SAMPLES = "tests.classify_samples"


def sample(name: str):
    return getattr(importlib.import_module(SAMPLES), name)


@pytest.mark.parametrize("name, starter", [
    ("starts_directly", "subprocess.run"),
    ("through_a_helper", "subprocess.run"),
    ("through_a_class", "subprocess.Popen"),
    ("through_a_subclass", "subprocess.Popen"),
    ("lazily_imported", "subprocess.check_output"),
    ("imports_a_heavy_starter_lazily", "playwright.sync_api.sync_playwright"),
])
def test_a_function_that_reaches_a_starter_is_e2e(name, starter):
    assert classify._starts_process(sample(name)) == starter


@pytest.mark.parametrize("name", ["only_an_exception", "pure"])
def test_exceptions_and_plain_code_are_not_starters(name):
    assert classify._starts_process(sample(name)) is None


def test_this_module_is_quick(request):
    assert request.node.get_closest_marker("e2e") is None


def test_a_quick_test_that_starts_a_process_fails_saying_how_to_mark_it():
    start = getattr(subprocess, "Popen")  # unseen by the reader, as code in a library would be
    with pytest.raises(AssertionError, match="classified quick .* Mark it @pytest.mark.e2e"):
        start(["true"])
