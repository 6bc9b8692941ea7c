"""How much the vectorised batch fill saves: a 4096-row embedding batch from numpy, two ways.

* numpy: ``api.Batch.embeddings`` (the embedding rows used in place from the caller's
  C-contiguous float32 array, the small arrays filled through numpy views over ``ffi.buffer``,
  seq-id pointers computed as addresses),
* loop: the same ``llama_batch`` filled row by row from Python (one memmove per embedding row,
  one assignment per position row, seq id and output flag).

No model is needed; only the compiled module is loaded. Run::

    python -m pyllama_dflash.lab.bench --only bindings
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pyllama_dflash.product.owning import Runtime


@dataclass(frozen=True)
class BatchFillTiming:
    n_rows: int
    n_embd: int
    n_pos: int
    numpy_s: float  # median seconds per batch, vectorised
    loop_s: float  # median seconds per batch, per-row Python loop

    @property
    def ratio(self) -> float:
        """How many times faster the vectorised fill is."""
        return self.loop_s / self.numpy_s

    def __str__(self) -> str:
        return (
            f"{self.n_rows} rows x {self.n_embd} floats, {self.n_pos} pos rows: numpy {self.numpy_s * 1e3:.3f} ms, "
            f"per-row loop {self.loop_s * 1e3:.3f} ms, ratio {self.ratio:.1f}x"
        )


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fill_batch_per_row(
    rt: Runtime,
    batch: Any,
    embd: np.ndarray,
    pos: np.ndarray,
    seq_id: int = 0,
) -> None:
    """The naive way, the benchmark's yardstick: fill a ``llama_batch *`` row by row from Python.

    Each row: its embedding (one memmove of n_embd floats), n_pos positions, seq id, output flag.
    """
    ffi = rt.ffi
    n_tokens, n_embd = embd.shape
    n_pos = pos.shape[0]
    row_bytes = n_embd * 4
    src = ffi.from_buffer("float[]", np.ascontiguousarray(embd, dtype=np.float32))
    for i in range(n_tokens):
        ffi.memmove(batch.embd + i * n_embd, src + i * n_embd, row_bytes)
        for j in range(n_pos):
            batch.pos[j * n_tokens + i] = int(pos[j, i])
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = 0
    batch.n_tokens = n_tokens


def measure_embd_batch_fill(
    n_rows: int = 4096, n_embd: int = 64, n_pos: int = 4, repeats: int = 7, lib_dir: Path | None = None
) -> BatchFillTiming:
    """Median time to build an embedding batch of n_rows via numpy vs a per-row loop."""
    from pyllama_dflash.product import api
    from pyllama_dflash.product.owning import BatchBuffers, runtime

    rt = runtime(lib_dir)
    rng = np.random.default_rng(0)
    embd = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    pos = np.stack([np.full(n_rows, 7)] + [np.arange(n_rows) % 64] * (n_pos - 1)).astype(np.int32)

    def vectorised() -> object:
        return api.Batch.embeddings(embd, pos)

    def per_row() -> object:
        buffers = BatchBuffers(rt, n_rows, n_embd=n_embd, n_pos=n_pos)
        fill_batch_per_row(rt, buffers.struct, embd, pos, seq_id=0)
        return buffers

    # same content both ways, or the comparison means nothing
    a, b = vectorised(), per_row()
    assert np.array_equal(a.embd, b.embd) and np.array_equal(a.pos, b.pos)  # type: ignore[attr-defined]
    assert np.array_equal(a.seq_id, b.seq_id)  # type: ignore[attr-defined]
    return BatchFillTiming(n_rows, n_embd, n_pos, _median_time(vectorised, repeats), _median_time(per_row, repeats))


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib-dir", type=Path, default=None, help="default: $PYLLAMA_DFLASH_LIB_DIR")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--n-embd", type=int, nargs="+", default=[64, 2048])
    parser.add_argument("--n-pos", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    for n_embd in args.n_embd:
        print(measure_embd_batch_fill(args.rows, n_embd, args.n_pos, args.repeats, args.lib_dir))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
