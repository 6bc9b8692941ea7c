"""The pair around the embedded target: its projector and its drafts at the embedded width.

A DFlash draft borrows the target's token embeddings and output head and reads the target's hidden
states, so a draft served with the embedded target (padded.py, ``embedded``) must live in the same
wider stream. Each of its tensors is widened as the target's are: what reads the stream gets zero
columns, what writes it zero rows, the norms over the stream halved with the epsilon quartered, and
``fc`` (which reads the three feature layers side by side) gets each layer's columns at that layer's
place in the wider concatenation. The projector keeps its draws and writes zeros after its own
columns. Nothing is trained: the pair drafts what the core's pair drafts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ...harness.tiny import write_draft, write_mmproj
from ...harness.tiny._gguf import gguf_module
from .config import CoreConfig
from .drafts import TrainedOn, draft_config, trained_on
from .imagerows import MMPROJ_SEED, mmproj_config
from .padded import embedding_scale, leaf, widened
from .vocab import VOCAB

_DRAFT_NORMS = ("enc.output_norm.weight", "output_norm.weight", "attn_norm.weight", "ffn_norm.weight")


def embedded_projector(path: Path, core: CoreConfig, n_embd: int) -> Path:
    """The core's projector (same seed, same draws) writing rows ``n_embd`` wide."""
    write_mmproj(path, mmproj_config(core), seed=MMPROJ_SEED, projection_dim=n_embd)
    return path


def embedded_draft(draft: Path, out: Path, core: CoreConfig, n_embd: int) -> Path:
    """``draft`` (a DFlash draft for ``core``, as ``vlm drafts`` writes them) in a stream ``n_embd`` wide."""
    reader = gguf_module().GGUFReader(Path(draft))
    params = {t.name: np.array(t.data, np.float32).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}
    image_rows = trained_on(reader) is TrainedOn.IMAGES
    ratio, scale = embedding_scale(core, n_embd)
    E = core.n_embd
    wide = {}
    for name, a in params.items():
        if name == "fc.weight":  # [out E, in k * E] -> [n_embd, k * n_embd], layer k's block at k * n_embd
            fc = np.zeros((n_embd, a.shape[1] // E * n_embd), np.float32)
            for k in range(a.shape[1] // E):
                fc[:E, k * n_embd : k * n_embd + E] = a[:, k * E : (k + 1) * E]
            wide[name] = fc
        else:
            wide[name] = widened(leaf(name), a, n_embd, scale, _DRAFT_NORMS)
    cfg = replace(draft_config(core), n_embd=n_embd, rms_eps=core.rms_eps / ratio)
    write_draft(out, cfg, trained=wide, image_rows=image_rows, vocab=("vlm-char", VOCAB.add_to_gguf))
    return out


def drafted_along(target: Path, draft: Path, tokens: np.ndarray, n_max: int, start: int = 8) -> list[list[int]]:
    """What libcommon's driver drafts at each position of ``tokens`` after the first ``start``, the target
    fed ``tokens`` one by one (on the build this process loaded): a pair's drafting, compared as ids."""
    from pyllama_dflash.product import api

    out = []
    with api.Model(target) as tm, api.Model(draft) as dm:
        with api.Context(tm, n_ctx=max(256, len(tokens) + 16), n_batch=64, n_ubatch=64) as ctx:
            with api.Context.draft(dm, ctx) as dctx, api.Speculative(ctx, dctx, n_max=n_max) as spec:
                batch = api.Batch.tokens(tokens[:start], pos0=0)
                if ctx.process_rc(batch) != 0 or not spec.process_ok(batch):
                    raise RuntimeError(f"{target}: the first {start} tokens did not decode")
                for i in range(start, len(tokens)):
                    out.append(spec.draft(0, int(tokens[i]), i, n_max=n_max))
                    batch = api.Batch.tokens(tokens[i : i + 1], pos0=i)
                    if ctx.process_rc(batch) != 0 or not spec.process_ok(batch):
                        raise RuntimeError(f"{target}: token {i} did not decode")
    return out


def write_embedded_pair(out: Path, core: CoreConfig, n_embd: int, drafts: dict[str, Path]) -> dict[str, dict]:
    """Beside the embedded target ``out``: its projector (``<stem>-mmproj.gguf``) and each draft of
    ``drafts`` (``<stem>-<name>``); their sha256, by file name."""
    from ...files import sha256_file

    written = [embedded_projector(out.with_name(f"{out.stem}-mmproj.gguf"), core, n_embd)]
    for name, draft in drafts.items():
        written.append(embedded_draft(draft, out.with_name(f"{out.stem}-{name}"), core, n_embd))
    return {p.name: {"sha256": sha256_file(p)} for p in written}
