"""The end-to-end checks through llama-server: one function each, registered with what it must see.

The checks live in this package's modules, by theme: :mod:`.requests` (one request, exactness,
conversations), :mod:`.slots` (slot save and restore), :mod:`.faults` (restores of damaged slot files),
:mod:`.save_faults` (a save that fails or is killed, and a slot file without a draft part),
:mod:`.drafting` (the drift oracle through the server, and how llama-server picks and runs the drafter),
:mod:`.definition` (0007's draft after an image against a fresh server's first round), :mod:`.idle_slot`
(an idle slot saved to the prompt cache and brought back) and :mod:`.siblings` (MTP and EAGLE3).

A check is a function of a :class:`~.run.Ctx` returning a :class:`~.expect.Result`, registered
once with ``@check(name, baseline=..., twin=...)``: its expectation per :class:`~pyllama_dflash.words.Judged`
(what the run is held to: ``baseline``, the zero-fill ``shown``, a fix held to the ``twin`` or to the
``definition``), and ``saving_draft``: a fix's where its llama-server saves the draft with a slot (0005).
A fix's expectation not given takes ``saving_draft``'s where its server saves the draft, else the twin's;
``baseline``'s and ``shown``'s not given take the twin's. Adding a check
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

from ....words import Judged
from ..client import Response
from ..drafts import LOGS_NO_DRAFTS
from ..expect import Expect, Result
from ..server_process import ServerProcess

# the expectation of a fix whose llama-server saves the draft with a slot (0005), beside the Judged ones
SAVING_DRAFT = "saving_draft"
EXPECTATION_KEYS = (*(j.value for j in Judged), SAVING_DRAFT)


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Any], Result]
    expected: dict[str, Expect]  # EXPECTATION_KEYS -> what it must see
    family: bool  # one of the checks each drafter of the family runs (FAMILY)
    sibling: str | None = None  # a check of a sibling drafter's models (mtp, eagle3), not the DFlash family's

    def expect(self, judged: Judged | None, saves_draft: bool, *, drafter: str = "dflash") -> Expect:
        """What the check must see on a run held to ``judged`` (None: a server given by path, a fix), whose
        llama-server saves the draft with a slot or not."""
        judged = judged or Judged.TWIN
        fix = judged in (Judged.TWIN, Judged.DEFINITION)
        e = (
            (self.expected.get(judged) if judged is not Judged.TWIN else None)
            or (self.expected.get(SAVING_DRAFT) if fix and saves_draft else None)
            or self.expected[Judged.TWIN]
        )
        if e.same_drafts is not None and (
            drafter in LOGS_NO_DRAFTS or (judged is Judged.SHOWN and drafter != "dflash" and e.same_drafts is False)
        ):
            # a drafter whose drafts the server's log does not show (DFlash2) cannot be judged on
            # them here; and whether the zero-fill's rows move a drafted token depends on the draft's
            # weights (measured per drafter in the matrix). Both are judged through the library.
            e = dataclasses.replace(e, same_drafts=None)
        return e


REGISTRY: dict[str, Check] = {}


def check(name: str, *, family: bool = False, sibling: str | None = None, **expected: Expect) -> Callable:
    """Register a check under ``name`` with its expectations (``baseline=``, ``shown=``, ``twin=``,
    ``definition=``, ``saving_draft=``; ``twin=`` at least); ``family``: it also runs for every drafter of
    the family; ``sibling``: it runs on that sibling drafter's models (``mtp``, ``eagle3``) instead, under
    ``repro --siblings --server``."""
    unknown = set(expected) - set(EXPECTATION_KEYS)
    if unknown or Judged.TWIN not in expected:
        raise ValueError(
            f"check {name}: expectations for {sorted(unknown)} (known: {', '.join(EXPECTATION_KEYS)}; twin required)"
        )

    def register(fn: Callable[[Any], Result]) -> Callable[[Any], Result]:
        if name in REGISTRY:
            raise ValueError(f"check {name} is registered twice")
        REGISTRY[name] = Check(name, fn, expected, family, sibling)
        return fn

    return register


def keeps_own_positions(ctx) -> bool:
    """Whether the check's draft keeps positions of its own on its variant (0007): every drafter but MTP,
    which drafts in the target's context at the target's positions on every libcommon."""
    return ctx.judged is not None and ctx.judged.own_positions and not getattr(ctx.models, "target_head", False)


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
