"""Which draft model goes with which target model: what libcommon would get wrong with another pair."""

from __future__ import annotations

from ...errors import IncompatibleModelsError
from .model import Model


def check_draft_pair(model: Model, target: Model) -> None:
    """Refuse a DFlash or EAGLE3 draft that cannot read this target, naming both files and the reason."""
    if model.n_embd != target.n_embd:
        raise IncompatibleModelsError(
            f"draft {model.path} has n_embd {model.n_embd} but target {target.path} has n_embd "
            f"{target.n_embd}: the draft reuses the target's token embeddings, so they must match"
        )
    if model.n_vocab != target.n_vocab:
        # DFlash samples the draft's vocab from logits made by the target's output head:
        # another size reads past (or short of) each row of them
        raise IncompatibleModelsError(
            f"draft {model.path} has n_vocab {model.n_vocab} but target {target.path} has n_vocab "
            f"{target.n_vocab}: the draft drafts from the target's output head, so the vocabs must match"
        )
    # an EAGLE3 draft may read one past the target's layers: its final hidden state
    last = target.n_layer + (1 if model.arch == "eagle3" else 0)
    bad_layers = [lid for lid in model.target_layer_ids if not 0 <= lid < last]
    if bad_layers:
        raise IncompatibleModelsError(
            f"draft {model.path} reads target layers {bad_layers}, but target {target.path} has {target.n_layer} layers"
        )
