"""Scenes the target learns to caption: a small grammar (colour, shape, place), rendered to pixels.

A scene is one filled shape of one colour on a dark ground, at one of five places. mtmd cuts an
image into 28-px cells, one row each (qwen2vl: 14-px patches merged 2 x 2), so a shape spans
several rows at every image size the bench serves (9, 64, 256 and 1024 rows). Colours are far
apart in RGB and the ground is noisy, so the random projector keeps colours apart (the probe in
shared/notes/trained-target.md) and the rows carry the shape's outline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 220, 50),
    "white": (240, 240, 240),
    "purple": (150, 60, 200),
}
SHAPES = ("circle", "square", "triangle")
PLACES = ("top", "bottom", "left", "right", "middle")
CELL = 28  # pixels a row of the projector's output covers, each way
# the side, in pixels, of an image of each row count the bench serves (n x n cells)
SIDE_FOR_ROWS = {9: 84, 64: 224, 256: 448, 1024: 896}

_CENTRES = {"top": (0.5, 0.27), "bottom": (0.5, 0.73), "left": (0.27, 0.5), "right": (0.73, 0.5), "middle": (0.5, 0.5)}


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    place: str

    def caption(self) -> str:
        return f"a {self.colour} {self.shape} at the {self.place}"

    def render(self, side: int, seed: int) -> np.ndarray:
        """A (side, side, 3) uint8 image; ``seed`` moves the shape a little and draws the noise."""
        rng = np.random.default_rng([seed, side])
        cx, cy = _CENTRES[self.place]
        cx, cy = (cx + rng.uniform(-0.04, 0.04)) * side, (cy + rng.uniform(-0.04, 0.04)) * side
        r = side * rng.uniform(0.17, 0.22)
        y, x = np.mgrid[0:side, 0:side].astype(np.float64) + 0.5
        if self.shape == "circle":
            inside = (x - cx) ** 2 + (y - cy) ** 2 <= r**2
        elif self.shape == "square":
            inside = (np.abs(x - cx) <= r * 0.85) & (np.abs(y - cy) <= r * 0.85)
        else:  # an upward triangle: apex at the top, base at the bottom
            top, bottom = cy - r, cy + r
            half = (y - top) / (bottom - top) * r
            inside = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half)
        ground = rng.integers(10, 45, size=(side, side, 3))
        img = np.where(inside[..., None], np.array(COLOURS[self.colour])[None, None, :], ground)
        img = img + rng.integers(-12, 13, size=img.shape)
        return np.clip(img, 0, 255).astype(np.uint8)


def all_scenes() -> list[Scene]:
    return [Scene(c, s, p) for c in COLOURS for s in SHAPES for p in PLACES]


def draw_scene(rng: np.random.Generator) -> Scene:
    scenes = all_scenes()
    return scenes[int(rng.integers(len(scenes)))]
