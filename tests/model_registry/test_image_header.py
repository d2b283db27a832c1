"""The size an image's header declares, read without decoding, against Pillow's reading."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import pytest
from PIL import Image

from model_registry.image_header import declared_size


def encoded(fmt: str, size: tuple[int, int], mode: str = "RGB", **save: Any) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, "red").save(out, format=fmt, **save)
    return out.getvalue()


def with_exif_thumbnail(jpeg: bytes) -> bytes:
    """The JPEG with an APP1 segment holding another JPEG (a 640×480 thumbnail's frame)
    before its own frame."""
    thumb = encoded("JPEG", (640, 480))
    app1 = b"Exif\0\0" + thumb
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + jpeg[2:]


def png_header(width: int, height: int) -> bytes:
    """A PNG of its signature and IHDR only: 33 bytes that declare any size."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))


@pytest.mark.parametrize("size", [(1, 1), (37, 5), (640, 480), (16383, 2)])
@pytest.mark.parametrize(
    ("fmt", "mode", "save"),
    [
        ("PNG", "RGB", {}),
        ("PNG", "1", {}),
        ("JPEG", "RGB", {}),
        ("JPEG", "L", {"progressive": True}),
        ("WEBP", "RGB", {"quality": 50}),  # VP8
        ("WEBP", "RGB", {"lossless": True}),  # VP8L
        ("WEBP", "RGBA", {"quality": 50}),  # VP8X (alpha)
    ],
)
def test_the_size_is_pillows(
    fmt: str, mode: str, save: dict[str, Any], size: tuple[int, int]
) -> None:
    data = encoded(fmt, size, mode, **save)
    assert declared_size(data) == Image.open(io.BytesIO(data)).size == size


def test_a_jpeg_s_second_frame_is_not_hidden_by_a_small_first() -> None:
    """Pillow takes the last start-of-frame before the scan: a small first frame followed by
    a 7000x7000 one is 49M pixels, not 64."""
    data = encoded("JPEG", (8, 8))
    sof = data.index(b"\xff\xc0")
    (length,) = struct.unpack(">H", data[sof + 2 : sof + 4])
    frame = bytearray(data[sof : sof + 2 + length])
    frame[5:9] = struct.pack(">HH", 7000, 7000)
    forged = data[: sof + 2 + length] + bytes(frame) + data[sof + 2 + length :]
    assert declared_size(forged) == (7000, 7000)
    with Image.open(io.BytesIO(forged)) as image:
        assert image.size == (7000, 7000)


def test_a_jpeg_s_exif_thumbnail_is_not_its_frame() -> None:
    data = with_exif_thumbnail(encoded("JPEG", (33, 21)))
    assert Image.open(io.BytesIO(data)).size == (33, 21)
    assert declared_size(data) == (33, 21)


def test_an_animated_webp_declares_its_canvas() -> None:
    out = io.BytesIO()
    frames = [Image.new("RGB", (48, 30), c) for c in ("red", "blue")]
    frames[0].save(out, format="WEBP", save_all=True, append_images=frames[1:])
    assert declared_size(out.getvalue()) == (48, 30)


def test_a_header_alone_declares_any_size() -> None:
    assert declared_size(png_header(100_000, 100_000)) == (100_000, 100_000)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello",
        b"\x89PNG\r\n\x1a\n",  # the signature, cut short
        png_header(4, 4)[:20],
        b"\xff\xd8\xff\xe0\x00",  # a JPEG cut in its first segment
        b"\xff\xd8\xff\xda\x00\x08",  # a scan before any frame
        b"\xff\xd8\xff\xe0\x00\x01",  # a segment length below its own two bytes
        b"RIFF\0\0\0\0WEBPVP8 \0\0\0\0",
        b"GIF89a\x01\x00\x01\x00",  # not taken
    ],
)
def test_what_cannot_be_read_is_none(data: bytes) -> None:
    assert declared_size(data) is None
