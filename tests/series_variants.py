"""The variants of the series every test judges, by what each is: one definition, read from patches/series
($PYLLAMA_DFLASH_PATCHES points them at another series). A module of its own, not conftest's: a test
module imports these names, and conftest is pytest's to load."""

from __future__ import annotations

from pathlib import Path

from pyllama_dflash.paths import default_patches_dir
from pyllama_dflash.product.llamabuild.patchset import load_series
from pyllama_dflash.words import Role

REPO = Path(__file__).resolve().parent.parent
# every variant of the series, baseline first, and the fix judged against the draft's reconverted twin
# (the last variant of role twin: 0004 and 0005, slots): one definition for every test.
# $PYLLAMA_DFLASH_PATCHES points them at another series (the tests that take TWIN_FIX then judge that variant;
# pyllama_dflash.lab.mutate runs test_patch_rules.py so on each mutant). LAST is what repro judges by
# default; DEFINED the variant judged against the draft's definition (0007), if the series has one.
_SERIES = load_series(default_patches_dir())
VARIANTS: tuple[str, ...] = tuple(_SERIES.variants)
LAST = VARIANTS[-1]
TWIN_FIX = next((v for v in reversed(VARIANTS[1:]) if _SERIES.role(v) == Role.TWIN), LAST)
DEFINED = next((v for v in VARIANTS[1:] if _SERIES.role(v) == Role.DEFINITION), None)
# the variant that serves each draft as it was trained (0008): a DEFINED with drafts marked as trained
# with image rows, a TWIN_FIX with any other; None if the series has none
AS_TRAINED = next((v for v in VARIANTS[1:] if _SERIES.role(v) == Role.AS_TRAINED), None)
# every variant of role as-trained: 0008's, and 0009's on top of it, which serves DFlash drafts alike
SERVED_AS_TRAINED = tuple(v for v in VARIANTS[1:] if _SERIES.role(v) == Role.AS_TRAINED)
# the first variant that feeds MTP an image's rows (0009; every later one does too), None if none does
FEEDS_MTP = next((v for v in VARIANTS if any("mtp-feed-the-image" in p.name for p in _SERIES.prefix(v))), None)
