"""A greedy pass after hypothesis's shrinking, on the schedule's own steps.

Hypothesis shrinks the raw steps, and there a step can hang on others (a restore picks among
the states saved so far, the words of a text follow its index), so a shrunk schedule may keep
a step that does not matter. This pass tries, until nothing changes, to drop each step and to
simplify it (one word of text, a 3x3 grid, one generated token), and keeps every change after
which the schedule is still valid and still fails with the same kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from .schedule import GRID_MIN, Schedule, ScheduleError, Step, words

MAX_TRIES = 200  # runs at most: a bound, not a goal (a few dozen is usual)


def _simpler(step: Step) -> Iterator[Step]:
    op = step["op"]
    if op == "generate" and step["n"] > 1:
        yield {**step, "n": 1}
    elif op == "prompt":
        for i, part in enumerate(step["parts"]):
            parts = step["parts"]
            if isinstance(part, str) and len(part) > 5:
                yield {**step, "parts": [*parts[:i], words(1), *parts[i + 1 :]]}
            if len(parts) > 1:
                yield {**step, "parts": [*parts[:i], *parts[i + 1 :]]}
            if isinstance(part, dict) and part["image"] != [GRID_MIN, GRID_MIN]:
                yield {**step, "parts": [*parts[:i], {"image": [GRID_MIN, GRID_MIN]}, *parts[i + 1 :]]}
    elif op == "batch":
        for i, (seq, text) in enumerate(step["texts"]):
            if len(text) > 5:
                texts = [list(t) for t in step["texts"]]
                texts[i] = [seq, words(1)]
                yield {**step, "texts": texts}


def _candidates(steps: list[Step]) -> Iterator[list[Step]]:
    for i in range(len(steps)):
        yield steps[:i] + steps[i + 1 :]
    for i, step in enumerate(steps):
        for simpler in _simpler(step):
            yield [*steps[:i], simpler, *steps[i + 1 :]]


def minimize(schedule: Schedule, fails: Callable[[Schedule], bool]) -> tuple[Schedule, int]:
    """The smallest schedule this pass reaches for which fails() still holds; and the runs it took."""
    best, tries, changed = schedule, 0, True
    while changed and tries < MAX_TRIES:
        changed = False
        for steps in _candidates(best.steps):
            candidate = replace(best, steps=steps, found=None)
            try:
                candidate.validate()
            except ScheduleError:
                continue
            tries += 1
            if fails(candidate):
                best, changed = candidate, True
                break
            if tries >= MAX_TRIES:
                break
    if best.n_seq == 2 and not any(s.get("seq") == 1 or s["op"] == "batch" for s in best.steps):
        one = replace(best, n_seq=1, found=None)
        tries += 1
        if fails(one):
            best = one
    return best, tries
