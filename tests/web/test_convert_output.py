"""`modelyard convert --to web` says how big the site it wrote is (issue 27, point 9: it printed the
model's size, 339172 bytes, for a folder of about 25 MB) and what is in it (issue 32)."""
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
    # what is in it: each part's bytes add up to the folder, and a first visit's transfer (gzip)
    parts = re.findall(r"^  (.+?)\s{2,}([\d,]+) bytes\s+(\d+) files$", err, re.M)
    assert {name for name, _, _ in parts} >= {"model", "LiteRT.js JS", "app: manifest, icons, service worker"}, err
    assert sum(int(size.replace(",", "")) for _, size, _ in parts) == sum(p.stat().st_size for p in files)
    assert sum(int(n) for _, _, n in parts) == len(files)
    visit = re.search(r"a first visit transfers about ([\d,]+) bytes \(gzip\)", err)
    assert visit and 1_000_000 < int(visit.group(1).replace(",", "")) <= 4_000_000, err
