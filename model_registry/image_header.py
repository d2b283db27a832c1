"""The size an encoded image declares, read from its header without decoding a pixel: what an
image (an upload, an image sent inline) is bounded by before anything decodes it (CONTRACT 9.1).

Only the formats images are taken in (``hf_image.FORMATS``): PNG (its IHDR chunk), JPEG (the
largest start-of-frame before the scan, segments skipped by their lengths, so an EXIF
thumbnail's frame is never read for the image's), WebP (a VP8, VP8L or VP8X first chunk).
A 16-byte PNG header may declare 100000×100000 pixels: the size is read from the header
alone, whatever follows.
"""

from __future__ import annotations

import struct

PNG = b"\x89PNG\r\n\x1a\n"
#: JPEG start-of-frame markers (0xC0 to 0xCF but DHT, JPG and DAC): each carries the frame size
SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers with no length after them: TEM, RST0..7, SOI
BARE = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})


def declared_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` as the image's header declares them, or None where the bytes are
    not a PNG, JPEG or WebP file whose header can be read (decoding then says what is wrong)."""
    if data.startswith(PNG):
        return _png(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    return None


def _png(data: bytes) -> tuple[int, int] | None:
    # the signature, then the IHDR chunk first: length (4), "IHDR", width (4), height (4)
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The largest frame declared before the scan: Pillow takes the last start-of-frame it
    meets, so a small first frame followed by a large one must not pass for small."""
    found: tuple[int, int] | None = None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return found
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
            continue
        if marker in BARE:
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # the end, or the scan: every frame is declared by then
            return found
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in SOF:
            # length (2), precision (1), height (2), width (2)
            if pos + 9 > len(data):
                return found
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            if found is None or width * height > found[0] * found[1]:
                found = int(width), int(height)
        if length < 2:
            return found
        pos += 2 + length
    return found


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk, body = data[12:16], data[20:]
    if chunk == b"VP8 " and len(body) >= 10 and body[3:6] == b"\x9d\x01\x2a":
        # a key frame: its tag (3), start code (3), then 14-bit width and height
        width, height = struct.unpack("<HH", body[6:10])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        # the signature byte, then width - 1 and height - 1 in 14 bits each
        bits = int.from_bytes(body[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(body) >= 10:
        # flags (4), then the canvas's width - 1 and height - 1 in 24 bits each
        width = int.from_bytes(body[4:7], "little") + 1
        height = int.from_bytes(body[7:10], "little") + 1
        return width, height
    return None
