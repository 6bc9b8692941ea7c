"""The greedy reference: a run's operations replayed on the target alone, one token a round.

Drafted tokens are kept only where the target agrees, so a speculative run must generate exactly
what this replay generates (the scenarios' exactness check).
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import SessionConfig
from .loaded import Loaded
from .models import ModelSet
from .ops import Generate, Op, Prompt, RestoreSlot, RestoreTarget, Rewind, SaveSlot, SaveTarget, TextBatch
from .record import Record
from .session import Session
from .state import SavedSlot, SeqState


def replay_reference(
    models: ModelSet, cfg: SessionConfig, ops: Sequence[Op], loaded: Loaded | None = None
) -> dict[int, list[int]]:
    """Replay a run's prompts on the target alone and generate greedily one token at a time.

    The speculative run's output must equal this: drafted tokens are only ever kept where the
    target agrees. Returns the generated tokens per sequence.
    """
    record = Record()
    saved: dict[int, tuple[bytes, SeqState]] = {}
    slots: dict[int, SavedSlot] = {}
    with Session(models, cfg, record, speculative=False, loaded=loaded) as ref:
        for op in ops:
            match op:
                case Prompt(seq, text, images, step):
                    ref.prompt(seq, text, images, step)
                case TextBatch(parts, step):
                    ref.text_batch(parts, step)
                case Generate(seq, n_tokens, step):
                    ref.generate(seq, n_tokens, step)
                case SaveTarget(seq):
                    saved[seq] = ref.save_target(seq)
                case SaveSlot(seq):
                    slots[seq] = ref.save_slot(seq)
                case RestoreSlot(seq, step):
                    ref.restore_slot(seq, slots[seq], step)
                case RestoreTarget(seq, external, step):
                    ref.restore_target(seq, external or saved[seq], step)
                case Rewind(seq, pos, external, has_checkpoint, step):
                    # like restore: a checkpoint of this session is the sequence's latest save
                    ref.rewind(seq, pos, (external or saved[seq]) if has_checkpoint else None, step)
                case _:
                    raise TypeError(f"not a session operation: {op!r}")
    return record.generated
