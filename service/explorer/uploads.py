"""Short-lived uploads: an image a person gave the explorer (``GET /ui``), kept under
``data_dir/uploads`` for ``TTL_S`` so a link to the page (which names the upload by its id,
never inlines it) reproduces the same input. Only PNG, JPEG and WebP files are taken, checked by
their first bytes, and no larger than ``max_image_pixels`` by the size their header declares
(nothing is decoded here); expired files go at the next upload."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from model_registry.image_header import declared_size
from service.core.errors import ImageTooLarge, InvalidRequest, NotFound
from service.core.files import atomic_write
from service.core.settings import Settings

#: how long an upload is kept
TTL_S = 3600.0
#: the largest upload
MAX_BYTES = 8 << 20
#: media type -> (file suffix, the file's first bytes)
MEDIA_TYPES = {
    "image/png": (".png", b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": (".jpg", b"\xff\xd8\xff"),
    "image/webp": (".webp", b"RIFF"),
}
ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def _dir(settings: Settings) -> Path:
    return Path(settings.data_dir) / "uploads"


def media_type(data: bytes) -> str:
    """The file's media type by its first bytes, or a 422 saying what is taken."""
    for media, (_, magic) in MEDIA_TYPES.items():
        if data.startswith(magic) and (media != "image/webp" or data[8:12] == b"WEBP"):
            return media
    raise InvalidRequest(
        "an upload is a PNG, JPEG or WebP file (its bytes as the body)", loc=("body",)
    )


def save(settings: Settings, data: bytes) -> dict[str, object]:
    """Store ``data``; its id, media type, size and expiry (unix seconds)."""
    if not data:
        raise InvalidRequest("the upload is empty", loc=("body",))
    if len(data) > MAX_BYTES:
        raise InvalidRequest(f"an upload is at most {MAX_BYTES} bytes", loc=("body",))
    kind = media_type(data)
    size = declared_size(data)
    if size is None:
        raise InvalidRequest(
            f"the upload begins as {kind} but its header is cut short or damaged", loc=("body",)
        )
    if size[0] * size[1] > settings.max_image_pixels:
        raise ImageTooLarge(
            f"the image is {size[0]}×{size[1]} pixels; an upload may hold "
            f"{settings.max_image_pixels:,} (ATTRSERVE_MAX_IMAGE_PIXELS)",
            loc=("body",),
        )
    folder = _dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    purge(folder)
    upload_id = secrets.token_urlsafe(12)
    atomic_write(folder / (upload_id + MEDIA_TYPES[kind][0]), data)
    return {
        "id": upload_id,
        "media_type": kind,
        "bytes": len(data),
        "expires_at": round(time.time() + TTL_S, 3),
    }


def load(settings: Settings, upload_id: str) -> tuple[bytes, str]:
    """An upload's bytes and media type; 404 when unknown or expired."""
    if not upload_id or not set(upload_id) <= ID_CHARS or len(upload_id) > 64:
        raise NotFound(f"no upload {upload_id!r}", loc=("path", "upload_id"))
    for kind, (suffix, _) in MEDIA_TYPES.items():
        path = _dir(settings) / (upload_id + suffix)
        try:
            if time.time() - path.stat().st_mtime <= TTL_S:
                return path.read_bytes(), kind
        except FileNotFoundError:
            continue
    raise NotFound(
        f"no upload {upload_id!r} (uploads are kept {TTL_S / 60:.0f} minutes)",
        loc=("path", "upload_id"),
    )


def purge(folder: Path) -> None:
    """Remove expired uploads (and partial writes a crash left)."""
    now = time.time()
    for path in folder.iterdir():
        try:
            if now - path.stat().st_mtime > TTL_S:
                path.unlink()
        except FileNotFoundError:
            pass
