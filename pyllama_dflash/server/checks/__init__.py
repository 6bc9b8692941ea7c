"""The end-to-end checks through llama-server: one function each, registered with what it must see.

The checks live in this package's modules, by theme: :mod:`.requests` (one request, exactness,
conversations), :mod:`.slots` (slot save and restore), :mod:`.faults` (restores of damaged slot files),
:mod:`.save_faults` (a save that fails or is killed, and a slot file without a draft part),
:mod:`.drafting` (the drift oracle through the server, and how llama-server picks and runs the drafter),
:mod:`.definition` (0007's draft after an image against a fresh server's first round), :mod:`.idle_slot`
(an idle slot saved to the prompt cache and brought back) and :mod:`.siblings` (MTP and EAGLE3).

A check is a function of a :class:`~.run.Ctx` returning a :class:`~.expect.Result`, registered
once with ``@check(name, baseline=..., twin=...)``: its expectation per role of variant
(llamabuild.variants: ``baseline``, the zero-fill ``shown``, a fix judged against the ``twin``,
``slots``, such a fix whose llama-server saves the draft with a slot, and ``definition``, patch 0007
on top of slots; a role not given takes the twin's, or for ``definition`` slots'). Adding a check
is adding one such function to one of them (docs/server.md says how). ``run.run_server_checks``
runs them, in the order they are registered.

The reproduction: ``baseline`` must answer an image request on a legacy draft with HTTP 500
"failed to process speculative batch"; every patched variant must answer 200, and greedy output
with the draft must equal greedy output without it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...llamabuild.variants import BASELINE_ROLE, SHOWN_ROLE, Variant
from ..client import Response
from ..drafts import LOGS_NO_DRAFTS
from ..expect import Expect, Result
from ..server_process import ServerProcess

# the kinds a check's expectations name; a definition variant (0007, on top of 0005) takes slots' expectations
# where it has none of its own
BASELINE, SHOWN, TWIN, SLOTS, DEFINITION = "baseline", "shown", "twin", "slots", "definition"


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Any], Result]
    expected: dict[str, Expect]  # role -> what it must see; a role not given takes the twin's
    family: bool  # one of the checks each drafter of the family runs (FAMILY)
    sibling: str | None = None  # a check of a sibling drafter's models (mtp, eagle3), not the DFlash family's

    def expect(self, v: Variant | None, *, drafter: str = "dflash") -> Expect:
        kind = _expectation_key(v)
        e = self.expected.get(kind) or (self.expected.get(SLOTS) if kind == DEFINITION else None) or self.expected[TWIN]
        if e.same_drafts is not None and (
            drafter in LOGS_NO_DRAFTS or (kind == SHOWN and drafter != "dflash" and e.same_drafts is False)
        ):
            # a drafter whose drafts the server's log does not show (DFlash2) cannot be judged on
            # them here; and whether the zero-fill's rows move a drafted token depends on the draft's
            # weights (measured per drafter in the matrix). Both are judged through the library.
            e = dataclasses.replace(e, same_drafts=None)
        return e


REGISTRY: dict[str, Check] = {}


def check(name: str, *, family: bool = False, sibling: str | None = None, **expected: Expect) -> Callable:
    """Register a check under ``name`` with its expectations (``baseline=``, ``shown=``, ``twin=``,
    ``slots=``); ``family``: it also runs for every drafter of the family; ``sibling``: it runs on that
    sibling drafter's models (``mtp``, ``eagle3``) instead, under ``repro --siblings --server``."""
    unknown = set(expected) - {BASELINE, SHOWN, TWIN, SLOTS, DEFINITION}
    if unknown or TWIN not in expected:
        raise ValueError(
            f"check {name}: expectations for {sorted(unknown)} (known: baseline, shown, twin, slots, definition)"
        )

    def register(fn: Callable[[Any], Result]) -> Callable[[Any], Result]:
        if name in REGISTRY:
            raise ValueError(f"check {name} is registered twice")
        REGISTRY[name] = Check(name, fn, expected, family, sibling)
        return fn

    return register


def _expectation_key(v: Variant | None) -> str:
    if v is None:
        return TWIN
    if v.role in (BASELINE_ROLE, SHOWN_ROLE):
        return BASELINE if v.role == BASELINE_ROLE else SHOWN
    if v.own_positions:
        return DEFINITION
    return SLOTS if v.saves_draft else TWIN


def keeps_own_positions(ctx) -> bool:
    """Whether the check's draft keeps positions of its own on its variant (0007): every drafter but MTP,
    which drafts in the target's context at the target's positions on every libcommon."""
    v = ctx.variant
    return v is not None and v.own_positions and not getattr(ctx.models, "target_head", False)


def stats(responses: list[Response]) -> list[dict | None]:
    """The draft statistics of each answer (timings.draft_n, draft_n_accepted)."""
    return [r.draft_stats for r in responses]


def server_facts(srv: ServerProcess) -> dict:
    return {"server_alive": srv.alive, "log": str(srv.log_path)}


# the checks register themselves on import, in this order: the order they run and are reported in
for _module in ("requests", "slots", "faults", "save_faults", "drafting", "definition", "idle_slot", "siblings"):
    importlib.import_module(f"{__name__}.{_module}")

CHECKS = tuple(name for name, c in REGISTRY.items() if c.sibling is None)  # on the DFlash family's models
FAMILY = tuple(name for name in CHECKS if REGISTRY[name].family)  # what each drafter of the family runs
SIBLINGS_CHECKS = {
    s: tuple(name for name, c in REGISTRY.items() if c.sibling == s)
    for s in dict.fromkeys(c.sibling for c in REGISTRY.values() if c.sibling)
}
