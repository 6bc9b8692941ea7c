"""Small synthetic RGB images and a minimal PNG encoder (zlib + struct, no PIL)."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rgb(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A deterministic (height, width, 3) uint8 image: gradients plus seeded noise.

    Structure (not flat colour) so that different image sizes/seeds give
    different embeddings; values depend only on the arguments.
    """
    if width <= 0 or height <= 0:
        raise ValueError("width and height must be positive")
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack(
        [
            255.0 * x / max(width - 1, 1),
            255.0 * y / max(height - 1, 1),
            127.5 * (1.0 + np.sin((x + y) / 7.0)),
        ],
        axis=-1,
    )
    noise = np.random.default_rng([seed, width, height]).integers(-24, 25, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _chunk(kind: bytes, data: bytes) -> bytes:
    # length, type, data, CRC over type+data
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(img: np.ndarray) -> bytes:
    """Encode a (height, width, 3) uint8 array as an 8-bit truecolour PNG."""
    arr = np.asarray(img)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError("expected a (height, width, 3) uint8 array")
    h, w, _ = arr.shape
    # every scanline starts with filter type 0 (None)
    raw = b"".join(b"\x00" + arr[row].tobytes() for row in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit, colour type 2 (RGB)
    return PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def png_data_url(png: bytes) -> str:
    """`data:image/png;base64,...` as the OpenAI-style image_url part expects."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
