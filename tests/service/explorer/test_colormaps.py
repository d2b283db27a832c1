"""The explorer's colours are the API pictures' (service.serving.render's table): the page loads
them from ``/ui/colormaps.js``, and its palette gives a score the colour a PNG gives it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from service.explorer import router
from service.serving import render

PAGE = Path(router.__file__).parent / "page"


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """``/ui/colormaps.js`` as the page gets it."""
    with TestClient(create_app(Settings(), start_workers=False)) as client:
        r = client.get("/ui/colormaps.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    yield r.text


def test_the_page_loads_the_pictures_colormaps(served: str) -> None:
    anchors = json.loads(re.search(r"export const ANCHORS = (.*);", served)[1])  # type: ignore[index]
    diverging = json.loads(re.search(r"export const DIVERGING = (.*);", served)[1])  # type: ignore[index]
    for page, ours in router.COLORMAPS.items():
        assert anchors[page] == render.COLORMAPS[ours][1].split()
        assert diverging[page] is render.COLORMAPS[ours][0]
    # draw.js keeps no table of its own
    assert 'from "./colormaps.js"' in (PAGE / "draw.js").read_text()


@pytest.mark.processes
@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_a_score_has_one_colour_on_the_page_and_in_a_picture(served: str, tmp_path: Path) -> None:
    """The page's palette at scores -1..1 (scaled by their largest) against the PNGs' table:
    signed on the red-blue map, and grey for a magnitude, as the API draws by default."""
    shutil.copy(PAGE / "draw.js", tmp_path / "draw.js")
    (tmp_path / "colormaps.js").write_text(served)
    scores = [-1.0, -0.5, -0.2, 0.0, 0.3, 0.5, 1.0]
    (tmp_path / "check.mjs").write_text(
        'import { palette } from "./draw.js";\n'
        f"const scores = {json.dumps(scores)};\n"
        "const out = {};\n"
        'for (const [sign, cmap] of [["all", "redblue"], ["absolute", "redblue"], '
        '["absolute", "viridis"], ["absolute", "grays"]]) {\n'
        "  const p = palette(scores, sign, cmap);\n"
        "  out[`${sign} ${cmap}`] = scores.map((v) => p.colour(v).match(/\\d+/g).map(Number));\n"
        "}\n"
        "console.log(JSON.stringify(out));\n"
    )
    ran = subprocess.run(
        ["node", "check.mjs"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    page = json.loads(ran.stdout)
    values = np.array(scores)
    want = {
        "all redblue": render.colormap("rdbu").colours(values, -1.0),
        "absolute redblue": render.colormap("greys").colours(np.abs(values), 0.0),
        "absolute viridis": render.colormap("viridis").colours(np.abs(values), 0.0),
        "absolute grays": render.colormap("greys").colours(np.abs(values), 0.0),
    }
    for key, colours in want.items():  # rounding apart (the PNGs' table has 257 entries)
        assert np.abs(np.array(page[key]) - colours.astype(int)).max() <= 2, key
    assert (
        render.DEFAULT_COLORMAP["all"] == "rdbu" and render.DEFAULT_COLORMAP["absolute"] == "greys"
    )
