"""Upgrade legacy DFlash drafts for M-RoPE targets: add ``dflash.rope.dimension_sections``.

``inspect`` tells whether a draft is affected, ``upgrade`` writes its reconverted twin (only that
key added, tensor data streamed unchanged). CLI: ``python -m pyllama_dflash.product.upgrade --help``.
The functions live below the commands, in ``pyllama_dflash.product.upgrade.draft`` (repro makes a real
draft's reconverted twin with them); this package is the command, and re-exports them.
"""

from .draft import (
    SECTIONS_KEY,
    DraftInfo,
    DraftUpgradeError,
    UpgradeResult,
    default_output,
    inspect,
    reconverted_twin,
    target_uses_mrope,
    upgrade,
)

__all__ = [
    "SECTIONS_KEY",
    "DraftInfo",
    "DraftUpgradeError",
    "UpgradeResult",
    "default_output",
    "inspect",
    "reconverted_twin",
    "target_uses_mrope",
    "upgrade",
]
