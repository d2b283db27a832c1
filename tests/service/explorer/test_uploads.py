"""``POST /v1/uploads``: images bounded by the pixels their header declares, before anything
decodes them (CONTRACT 9.1), on the app without workers (an upload needs none)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.core.settings import Settings
from tests.model_registry.test_image_header import encoded, png_header


@pytest.fixture
def uploads(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    """The app with the default pixel limit, its uploads under ``tmp_path``."""
    settings = Settings.from_env({"ATTRSERVE_DATA_DIR": str(tmp_path)})
    with TestClient(create_app(settings, start_workers=False)) as c:
        yield c, tmp_path / "uploads"


def post(c: TestClient, data: bytes) -> Any:
    return c.post("/v1/uploads", content=data, headers={"content-type": "image/png"})


def stored(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_a_header_that_declares_too_many_pixels_is_413_and_kept_nowhere(
    uploads: tuple[TestClient, Path],
) -> None:
    """A 33-byte PNG declaring 100000×100000 pixels used to be taken (201)."""
    c, folder = uploads
    r = post(c, png_header(100_000, 100_000) + b"\0" * 64)
    assert r.status_code == 413, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"].endswith("/image_too_large") and body["errors"][0]["loc"] == ["body"]
    assert "100000×100000" in body["detail"] and "40,000,000" in body["detail"], body
    assert "ATTRSERVE_MAX_IMAGE_PIXELS" in body["detail"]
    assert stored(folder) == []
    # the default's own edge: 40,000,000 pixels is taken, one row more is not
    assert post(c, png_header(8000, 5000) + b"\0").status_code == 201
    assert post(c, png_header(8000, 5001) + b"\0").status_code == 413


@pytest.mark.parametrize(
    ("fmt", "save"),
    [("PNG", {}), ("JPEG", {}), ("WEBP", {"lossless": True}), ("WEBP", {"quality": 50})],
)
def test_the_limit_is_the_setting_in_every_format_taken(
    tmp_path: Path, fmt: str, save: dict[str, Any]
) -> None:
    settings = Settings.from_env(
        {"ATTRSERVE_DATA_DIR": str(tmp_path), "ATTRSERVE_MAX_IMAGE_PIXELS": "200"}
    )
    assert settings.max_image_pixels == 200
    with TestClient(create_app(settings, start_workers=False)) as c:
        small = encoded(fmt, (20, 10), **save)
        assert post(c, small).status_code == 201
        r = post(c, encoded(fmt, (20, 11), **save))
        assert r.status_code == 413 and "20×11" in r.json()["detail"], r.text
    assert len(stored(tmp_path / "uploads")) == 1


def test_a_header_cut_short_is_422(uploads: tuple[TestClient, Path]) -> None:
    c, folder = uploads
    for data in (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"RIFF\0\0\0\0WEBPVP8X"):
        r = post(c, data)
        assert r.status_code == 422 and "header" in r.json()["detail"], r.text
    assert stored(folder) == []
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buf, format="PNG")
    assert post(c, buf.getvalue()).status_code == 201
