"""The speed through the library: the served speed table's conversations, run by the harness's slot loop.

Each column's child runs every conversation twice on the variant's own libraries, with the draft and with
no draft at all (``Session(speculative=False)``: the target alone, as llama-server without ``-md``), the
two sessions side by side a turn at a time (``script.side_by_side``), and times each turn as
llama-server's ``timings`` do (``script.conversation``). The figures are the served table's
(``served.speed_entry``): per phase, tokens/s with the draft over without and the prompt's time with
over without, each with a 95% interval over conversations.

What differs from the server: no HTTP, no chat template (the slot holds the generated tokens, as in the
acceptance table), no sampler chain (the slot loop takes the target's argmax), the Python of the slot
loop between libllama's calls, and the session without the draft keeps the rollback snapshots a
drafting one has (so that a slot saved in either fits the other; ``bench --only round`` measures what
they cost). What is the same: the variant, the models, the conversations, the batch sizes and the draft
length (``measure.session_for``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ...harness.slotloop.models import ModelSet
from ...pace import eta
from .job import AcceptanceJob, Column
from .measure import run_column, session_for
from .served import speed_entry


def measure_library_speed(
    models: ModelSet, seeds: Sequence[int], cols: Sequence[Column], log=print, image_px: int | None = None
) -> dict:
    """Every column's conversations with and without the draft through the library: ``{"table": {column:
    {"speed", "throughput", "failed", "turns"}}}``, as ``served.measure_server`` gives them; ``image_px``:
    the images' size (None: the corpus's drawn ones)."""
    table = {}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-speed-library-") as tmp:
        t0 = time.perf_counter()
        for i, col in enumerate(cols):
            # the worker gives the session its variant's slot handling (server_config), as for every column
            job = AcceptanceJob(col, models, tuple(seeds), session_for(image_px), image_px=image_px, timed=True)
            result = run_column(job, Path(tmp))
            table[col.name] = speed_entry(col, result, seeds)
            ratio = (table[col.name]["throughput"] or {}).get("ratio")
            shown = "none ran both ways" if ratio is None else f"tokens/s with the draft over without {ratio:.2f}"
            log(f"  {col.name} (library): {shown} (column {i + 1}/{len(cols)}, {eta(i + 1, len(cols), t0)})")
    return {"conversations": len(seeds), "seeds": [min(seeds), max(seeds)], "image_px": image_px, "table": table}
