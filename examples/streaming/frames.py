"""Generated video: per camera, a frame sequence with moving shapes and a moving text label."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .video_model import HEIGHT, WIDTH

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive)


@lru_cache(maxsize=1)
def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=22)


def text_origin(camera: int, index: int) -> tuple[int, int]:
    """Where frame ``index`` of ``camera`` draws its label (it moves every frame)."""
    return 8 + (index * 7 + camera * 13) % 90, 10 + (index * 5 + camera * 17) % 130


def frame(camera: int, index: int) -> tuple[np.ndarray, Box]:
    """Frame ``index`` of ``camera`` (``[HEIGHT, WIDTH, 3]`` uint8 RGB) and its label's box."""
    img = Image.new("RGB", (WIDTH, HEIGHT), (25 + 10 * (camera % 8), 50, 80))
    draw = ImageDraw.Draw(img)
    cx = (index * 9 + camera * 40) % WIDTH
    draw.ellipse((cx - 22, 120, cx + 22, 164), fill=(200, 60, 50))  # shapes that are not text
    draw.rectangle((WIDTH - 70, (index * 3) % 100, WIDTH - 20, (index * 3) % 100 + 40), fill=(60, 190, 70))
    label = f"CAM {camera} FRAME {index:04d}"
    origin = text_origin(camera, index)
    draw.text(origin, label, fill=(250, 250, 250), font=_font())
    x0, y0, x1, y1 = draw.textbbox(origin, label, font=_font())
    return np.asarray(img, dtype=np.uint8), (int(x0), int(y0), int(x1), int(y1))


def mask_box(mask: np.ndarray, cell: int) -> Box | None:
    """The bounding box, in frame pixels, of the detector's text cells (None when there are none)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return int(xs.min()) * cell, int(ys.min()) * cell, (int(xs.max()) + 1) * cell, (int(ys.max()) + 1) * cell


def iou(a: Box, b: Box) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0
