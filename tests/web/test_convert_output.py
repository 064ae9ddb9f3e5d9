"""`modelyard convert --to web` says how big the site it wrote is (issue 27, point 9: it printed the
model's size, 339172 bytes, for a folder of about 25 MB)."""
from __future__ import annotations

import re

import pytest

from tests.web.conftest import _convert


@pytest.mark.e2e  # npm fetches LiteRT.js on first use
def test_the_site_size_printed_is_the_folders(demo_base, tmp_path, capsys):
    site = _convert(demo_base, tmp_path / "site")
    err = capsys.readouterr().err
    match = re.search(r"wrote (\S+) \(([\d,]+) bytes in (\d+) files, of which the model ([\d,]+) bytes\)", err)
    assert match, err
    files = [p for p in site.rglob("*") if p.is_file()]
    assert int(match.group(2).replace(",", "")) == sum(p.stat().st_size for p in files)
    assert int(match.group(3)) == len(files)
    assert int(match.group(4).replace(",", "")) == (site / "model.tflite").stat().st_size
    assert sum(p.stat().st_size for p in files) > 10 * (site / "model.tflite").stat().st_size  # the runtime dominates
