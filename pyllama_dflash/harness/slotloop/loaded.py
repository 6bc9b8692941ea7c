"""Models and projectors loaded once per process, for the sessions of a batch of jobs.

A scenario opens two to four sessions (the run, its greedy replay, ...), and a child runs a
batch of scenarios. Loading the tiny models and initialising the projector is most of what a
session costs (the projector alone takes about 40 ms, the scenario's decoding a few), so the
sessions of one process share them. A llama.cpp model is read-only once loaded, and an mtmd
context keeps nothing of one image after the next; the contexts, the speculative driver and
their memories stay each session's own.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ...product import api


class Loaded:
    """``model(path)`` and ``projector(path, model, ...)``: loaded on first use, kept until close()."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._models: dict[tuple[str, int, bool], api.Model] = {}
        self._projectors: dict[tuple, api.Projector] = {}

    def model(self, path: Path, n_gpu_layers: int = 0, load_mtp: bool = False) -> api.Model:
        key = (str(Path(path).resolve()), n_gpu_layers, load_mtp)
        if key not in self._models:
            self._models[key] = self._stack.enter_context(api.Model(path, n_gpu_layers=n_gpu_layers, load_mtp=load_mtp))
        return self._models[key]

    def projector(
        self, path: Path, model: api.Model, *, use_gpu: bool = False, image_min_tokens: int | None = None
    ) -> api.Projector:
        key = (str(Path(path).resolve()), id(model), use_gpu, image_min_tokens)
        if key not in self._projectors:
            self._projectors[key] = self._stack.enter_context(
                api.Projector(path, model, use_gpu=use_gpu, image_min_tokens=image_min_tokens)
            )
        return self._projectors[key]

    def close(self) -> None:
        self._projectors.clear()
        self._models.clear()
        self._stack.close()

    def __enter__(self) -> Loaded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
