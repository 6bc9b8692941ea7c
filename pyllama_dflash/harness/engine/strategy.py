"""Hypothesis strategies for schedules: raw requests drawn freely, then made valid in order.

A raw step is a small tuple of integers. Most are *requests*, shaped like llama-server's: a
boundary (continue the sequence's cache, rewind it to a checkpoint or to 0, or restore a saved
state into the target alone), a prompt (text, or text and images; or none, as when a cached
prompt is the whole prompt: S10), then drafting rounds. The others are a two-sequence text
batch, a standalone drafting round, which interleave the sequences further, and the second
slot restored to a state saved from the first, then drafting (S16).

Like llama-server, every request is checkpointed after its prompt and again after its
generation, so a rewind or a restore always has states to pick from (were saves drawn
separately, a restore would mostly find nothing saved yet); only the saves a later step uses
are kept in the schedule.

:func:`normalize` turns the raw steps into steps in order, against a
:class:`~.schedule.Tracker`, and drops the parts that cannot come next (a restore with
nothing saved, a batch with one sequence, a prompt that would overflow the cache). Shrinking
works on the list of raw steps: deleting one keeps the rest meaningful, and smaller integers
mean no boundary, shorter texts, smaller grids, earlier states, no drafting.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..tiny import drafter
from .schedule import GRID_MAX, GRID_MIN, N_BATCH, N_MAX, Schedule, Step, Tracker, words

MAX_TEXT = 20  # tokens of one text prompt: past n_batch (16), so some take two batches
MAX_WORDS_AROUND = 4  # text before and after an image
MAX_GEN = 8

CONTINUE, REWIND, RESTORE = 0, 1, 2

_seq = st.integers(0, 1)
_pick = st.integers(0, 7)
_free_grid = st.tuples(st.integers(GRID_MIN, GRID_MAX), st.integers(GRID_MIN, GRID_MAX))
# grids whose rows end exactly at a sub-batch boundary of n_batch 16 (4x4, 4x8, 8x8) or one row past
# it (7x7: a one-row last sub-batch, which is not pinned): where the fix has broken before (S11)
BOUNDARY_GRIDS = ((4, 4), (4, 8), (8, 8), (7, 7))
_grid = st.one_of(_free_grid, st.sampled_from(BOUNDARY_GRIDS))


def _content(grid: st.SearchStrategy) -> st.SearchStrategy[tuple]:
    return st.one_of(
        st.tuples(st.just("text"), st.integers(1, MAX_TEXT)),
        st.tuples(
            st.just("image"),
            st.integers(0, MAX_WORDS_AROUND),
            st.lists(grid, min_size=1, max_size=2),
            st.integers(0, MAX_WORDS_AROUND),
        ),
        st.tuples(st.just("none")),
    )


def _request(grid: st.SearchStrategy) -> st.SearchStrategy[tuple]:
    return st.tuples(
        st.just("request"), _seq, st.integers(CONTINUE, RESTORE), _pick, _content(grid), st.integers(0, MAX_GEN)
    )


_generate = st.tuples(st.just("generate"), _seq, st.integers(1, MAX_GEN))
_batch = st.tuples(st.just("batch"), st.integers(1, N_BATCH // 2), st.integers(1, N_BATCH // 2))
# llama-server's POST /slots/N?action=restore then a request whose prompt is all cached: the target
# is restored alone and drafting starts at once, with the draft behind it (S10, the draft()-side
# alignment); drawn freely it takes a restore, an empty prompt and a state ahead of the draft at once
_restore_and_generate = st.tuples(
    st.just("request"), _seq, st.just(RESTORE), _pick, st.just(("none",)), st.integers(1, MAX_GEN)
)

# the same on the second slot with a state saved from the first: the draft is behind on a sequence
# other than 0 (S16), where a fill that draft() makes must be removed from that sequence
_adopt_and_generate = st.tuples(st.just("adopt"), _pick, st.integers(1, MAX_GEN))

# one_of draws a branch uniformly, and drops a strategy object it already has: three distinct
# request strategies make requests three times as likely as each of the others
raw_steps = st.one_of(
    _request(_grid), _request(_grid), _request(_grid), _generate, _batch, _restore_and_generate, _adopt_and_generate
)
# the strategy before the weighting above, kept to measure what the weighting buys (fuzz --unweighted)
raw_steps_unweighted = st.one_of(_request(_free_grid), _request(_free_grid), _request(_free_grid), _generate, _batch)

DRAFT_UBATCHES = (None, 4)  # the draft's n_batch and n_ubatch: the target's (16), or 4 (S15)
# the drafting settings llama-server takes (--spec-draft-n-max, -n-min, -p-min, backend sampling);
# the defaults (n_max 3, no cut-off, backend sampling on) in half the schedules
_drafting = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "n_max": st.integers(1, N_MAX),
            "n_min": st.integers(0, 2),
            "p_min": st.sampled_from((0.05, 0.15, 0.3)),
            "backend_sampling": st.booleans(),
        },
    ),
)

RawStep = tuple


def _prompt(seq: int, content: tuple, index: int) -> Step | None:
    if content[0] == "text":
        return {"op": "prompt", "seq": seq, "parts": [words(content[1], index)]}
    if content[0] == "image":
        _, before, grids, after = content
        parts: list = [words(before, index)] if before else []
        parts += [{"image": list(g)} for g in grids]
        parts += [words(after, index + 3)] if after else []
        return {"op": "prompt", "seq": seq, "parts": parts}
    return None


def expand(raw: RawStep, t: Tracker, index: int) -> list[Step]:
    """The steps raw stands for after what t has seen (each still checked by the caller)."""
    kind = raw[0]
    if kind == "batch":
        if t.n_seq < 2:
            return []
        return [{"op": "batch", "texts": [[0, words(raw[1], index)], [1, words(raw[2], index + 7)]]}]
    if kind == "adopt":
        names = [name for name, slot in t.slots.items() if slot.seq == 0]
        if t.n_seq < 2 or not names:
            return []
        # a slot that never ran has an empty draft, which is not behind: a short request on it first
        first = [{"op": "prompt", "seq": 1, "parts": [words(1, index)]}] if t.seqs[1].cells == 0 else []
        return first + [
            {"op": "restore", "seq": 1, "name": names[raw[1] % len(names)]},
            {"op": "generate", "seq": 1, "n": raw[2]},
            {"op": "save", "seq": 1, "name": None},
        ]
    seq = raw[1] % t.n_seq
    if kind == "generate":
        return [{"op": "generate", "seq": seq, "n": raw[2]}]
    _, _, boundary, pick, content, n_gen = raw
    steps: list[Step] = []
    if boundary == REWIND:
        options: list[str | None] = [None, *t.seqs[seq].checkpoints]
        steps.append({"op": "rewind", "seq": seq, "to": options[pick % len(options)]})
    elif boundary == RESTORE and t.slots:
        names = list(t.slots)
        steps.append({"op": "restore", "seq": seq, "name": names[pick % len(names)]})
    prompt = _prompt(seq, content, index)
    if prompt is not None:
        steps += [prompt, {"op": "save", "seq": seq, "name": None}]  # the prompt's checkpoint
    if n_gen:
        steps += [{"op": "generate", "seq": seq, "n": n_gen}, {"op": "save", "seq": seq, "name": None}]
    return steps


def normalize(n_seq: int, raws: list[RawStep]) -> Schedule:
    t = Tracker(n_seq)
    steps: list[Step] = []

    def add(step: Step) -> bool:
        if step["op"] == "save":
            step = {**step, "name": f"s{len(t.slots)}"}
        if t.problem(step) is None:
            t.apply(step)
            steps.append(step)
            return True
        return False

    for raw in raws:
        for step in expand(raw, t, len(steps)):
            # a generate with nothing to draft from yet: a one-word prompt first, as a request would have
            if (
                not add(step)
                and step["op"] == "generate"
                and add({"op": "prompt", "seq": step["seq"], "parts": [words(1, len(steps))]})
            ):
                add(step)
    return Schedule(n_seq, _used_saves_only(steps))


def _used_saves_only(steps: list[Step]) -> list[Step]:
    """Drop the saves no later step uses, and name the rest c0, c1, ... in order."""
    used = {s.get("name") for s in steps if s["op"] == "restore"} | {s.get("to") for s in steps if s["op"] == "rewind"}
    names: dict[str, str] = {}
    out = []
    for s in steps:
        if s["op"] == "save":
            if s["name"] not in used:
                continue
            names[s["name"]] = f"c{len(names)}"
            s = {**s, "name": names[s["name"]]}
        elif s["op"] == "restore":
            s = {**s, "name": names[s["name"]]}
        elif s["op"] == "rewind" and s["to"] is not None:
            s = {**s, "to": names[s["to"]]}
        out.append(s)
    return out


@st.composite
def schedules(
    draw: st.DrawFn,
    max_steps: int = 8,
    weighted: bool = True,
    drafters: tuple[str, ...] = (),
    targets: tuple[str, ...] = (),
) -> Schedule:
    """Schedules of up to max_steps raw steps (a request is up to four schedule steps). Weighted, the
    situations that have broken before come more often: a target restored alone then drafting,
    images ending at a sub-batch boundary, a draft whose ubatch is smaller than a hole. Each draws
    its drafter and target from those given (none: the models the search runs on) and its
    drafting settings."""
    n_seq = draw(st.integers(1, 2))
    schedule = normalize(
        n_seq, draw(st.lists(raw_steps if weighted else raw_steps_unweighted, min_size=1, max_size=max_steps))
    )
    if weighted:
        schedule.draft_n_ubatch = draw(st.sampled_from(DRAFT_UBATCHES))
    if drafters:
        schedule.drafter = draw(st.sampled_from(drafters))
    if targets:
        schedule.target = draw(st.sampled_from(targets))
    schedule.drafting = draw(_drafting)
    if schedule.drafter and drafter(schedule.drafter).refuses_p_min:
        schedule.drafting.pop("p_min", None)  # a configuration llama.cpp refuses to start with
    return schedule
