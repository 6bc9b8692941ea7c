"""The invariant a schedule must keep on the ``full`` variant, checked as the calls happen.

After every call of the schedule:

1. every target call returns 0 (llama_process, the image decode, state and memory calls), and
   every ``common_speculative_process`` returns true;
2. for every sequence s, the draft's memory ends where the target's does::

       draft.pos_max(s) == target.pos_max(s)

   checked wherever the driver has just handled s, i.e. after a ``process()`` that carried s,
   after an image chunk of s, and after every step. A ``draft()`` for s (which llama-server and
   the harness follow by trimming the draft's noise block back to the target's end) leaves the
   draft's memory where it was: checked too, against what held before it (see below);
3. where a reference is given (see execute.py), the drafts equal the reference's: the same
   schedule on baseline with the draft's reconverted twin drafts the same tokens in every round.

For a draft with positions of its own (patch 0007), "where the target's ends" is the index of the
sequence's last row (Session.memory_ends), and the first exception below does not arise: every row
goes in, an image's pinned ones too. The session checks such a draft's memory further after every
``process()`` and image: it starts at 0 too (:class:`DraftMisplaced` otherwise).

Three exceptions, each because nothing can fail there:

- **After a pinned image.** The target holds an image's rows at one temporal position P, and
  ``process()`` skips such a batch by design (a windowed draft cache could not hold it), so
  right after an image whose last sub-batch was skipped the draft ends one short:
  ``draft.pos_max(s) == P - 1`` (checked exactly). The next ``process()`` or ``draft()`` of s
  fills [P, next) and the equality holds again. An image whose last sub-batch is one row
  (not pinned) is injected at P, so the equality holds right after it.
- **After a target-only restore.** ``restore`` puts a saved state into the target alone (a
  cached prompt whose draft part did not load): until ``process()`` next handles s, the draft
  may end anywhere, ahead or behind. A ``draft()`` in between fills a draft that is behind for
  its noise block only and removes the fill again, as the twin, which needs no fill, would
  end: the draft stays behind until ``process()`` realigns it.
- **An empty draft memory.** llama.cpp's batch check is skipped for a sequence with no cells,
  so an empty draft accepts any next position and cannot make a call fail; the fix leaves it
  empty on purpose, as its twin's would be. It happens when a state is restored into a
  sequence whose draft holds nothing. These checks are counted (``empty_draft``), not hidden.

A call that fails raises the matching :class:`Violation` subclass at once; each subclass is a
separate bug to hypothesis, so each is shrunk on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..slotloop.record import DRAFT_ROWS, Call, Record, StopScenario

_X = re.compile(r"\bX = (-?\d+)")
_Y = re.compile(r"\bY = (-?\d+)")


class Violation(Exception):
    """The invariant broke. ``schedule`` is attached by the executor (the schedule that broke it)."""

    kind = "violation"

    def __init__(self, message: str, call: Call | None = None) -> None:
        super().__init__(f"{self.kind}: {message}")
        self.call = call
        self.schedule: dict | None = None


class DraftHole(Violation):
    kind = "draft-hole"  # process() false: the rows start past the draft's end + 1 (Y > X + 1)


class DraftAhead(Violation):
    kind = "draft-ahead"  # process() false: the rows start at or before the draft's end (Y <= X)


class SpecFailed(Violation):
    kind = "spec-failed"  # process() false for another reason


class TargetFailed(Violation):
    kind = "target-failed"


class DraftBehind(Violation):
    kind = "draft-behind"  # every call succeeded, but the draft's memory ends before it should


class DraftMisplaced(Violation):
    kind = "draft-misplaced"  # every call succeeded, but a draft with positions of its own holds rows elsewhere


class DraftPast(Violation):
    kind = "draft-past"  # every call succeeded, but the draft's memory ends after it should


class OutputDiffers(Violation):
    kind = "output-differs"  # the greedy output differs from decoding without the draft


class DraftDrift(Violation):
    kind = "drift"  # every call succeeded and the output is exact, but the drafts differ from the reference


class DraftStarved(Violation):
    # every call succeeded, but a drafting round drafted nothing (DEGRADED in the matrix): the noise
    # block was refused, as when draft() meets a draft behind the target and does not align it
    kind = "starved"


def failed_call(call: Call) -> Violation:
    """The violation a failing call stands for; for the driver, told apart by the batch check's X and Y."""
    if call.api == DRAFT_ROWS:
        return DraftMisplaced(call.summary(), call)
    if call.who != "spec":
        return TargetFailed(call.summary(), call)
    text = "\n".join(call.log)
    x, y = _X.search(text), _Y.search(text)
    if x and y:
        if int(y.group(1)) > int(x.group(1)) + 1:
            return DraftHole(call.summary(), call)
        return DraftAhead(call.summary(), call)
    return SpecFailed(call.summary(), call)


@dataclass(frozen=True)
class Memories:
    """All the invariant observes of a session: where each memory of a sequence ends."""

    ends: Callable[[int], tuple[int, int]]  # seq -> (the draft's last position, the target's)
    n_seq: int
    # the draft takes an image's pinned rows too (0007, its own positions): no lag after an image
    pinned_injected: bool = False


class CheckedRecord(Record):
    """A Record that checks the invariant at each call it is given; bind() it to its session's
    Memories first."""

    def __init__(self) -> None:
        super().__init__()
        self.memories: Memories | None = None
        self.free: set[int] = set()  # restored on the target alone, not yet handled by the driver
        # seq -> where the target ended when a target-only restore left the draft behind it: the draft lacks
        # the rows up to there, as the twin's does, until a rewind takes the target below them
        self.restored_over: dict[int, int] = {}
        self.lag: dict[int, int] = {}  # seq -> P: its last rows were a pinned image at P, skipped
        self.sub_batch: dict[int, tuple[int, int, int]] = {}  # seq -> (lo, hi, n) of the last image sub-batch
        self.batch_seqs: tuple[int, ...] = ()  # the sequences of the text batch under way (its calls say seq -1)
        self.stats: Counter[str] = Counter()

    def bind(self, memories: Memories) -> None:
        self.memories = memories

    def add(self, call: Call) -> Call:
        try:
            super().add(call)
        except StopScenario:
            raise failed_call(call) from None
        if call.who == "spec" and call.api == "common_speculative_process":
            if "sub-batch" in call.step:
                # Session._image labels its sub-batches so and reports them after the whole image
                # was decoded: judge the image at its own call, by its last sub-batch
                self.sub_batch[call.seq] = (call.pos[0], call.pos[1], call.n)
            else:
                for seq in self._seqs(call.seq):
                    self._handled(seq)
        elif call.who == "spec" and call.api == "common_speculative_draft":
            # draft() leaves the memory as it was: a restored or lagging sequence stays so
            self.check(call.seq)
        elif call.api == "mtmd_helper_decode_image_chunk":
            lo, hi, n = self.sub_batch.pop(call.seq)
            if n > 1 and lo == hi and not self.memories.pinned_injected:  # pinned: process() skipped it
                if call.seq not in self.free:
                    self.lag[call.seq] = lo
                    self.check(call.seq, call)
            else:
                self._handled(call.seq)
        return call

    def restored(self, seq: int) -> None:
        """The target alone took a saved state of seq: the draft is free until the driver handles seq."""
        self.free.add(seq)
        self.lag.pop(seq, None)
        assert self.memories is not None, "bind() the memories of a speculative session"
        draft, target = self.memories.ends(seq)
        if draft < target and not self.memories.pinned_injected:
            self.restored_over[seq] = target
        else:
            self.restored_over.pop(seq, None)

    def rewound(self, seq: int, pos: int) -> None:
        """Both memories of seq were cut back to pos. Where that reaches into the rows a target-only restore
        left the draft without, the draft ends at the last row it holds below them, as right after the
        restore (the twin's too: found by the fuzzer at seed 407): free again until the driver handles seq."""
        top = self.restored_over.get(seq)
        if top is None:
            return
        if pos <= 0:
            self.restored_over.pop(seq)
        elif pos - 1 <= top:
            self.restored_over[seq] = pos - 1
            self.free.add(seq)

    def _seqs(self, seq: int) -> tuple[int, ...]:
        return self.batch_seqs if seq < 0 else (seq,)

    def _handled(self, seq: int) -> None:
        """The driver has just handled seq: from here on its draft must end where the target does."""
        self.free.discard(seq)
        self.lag.pop(seq, None)
        self.check(seq)

    def check(self, seq: int, call: Call | None = None) -> None:
        assert self.memories is not None, "bind() the memories of a speculative session"
        if seq in self.free:
            self.stats["free"] += 1
            return
        draft, target = self.memories.ends(seq)
        self.stats["checks"] += 1
        if draft == -1 and target != -1:
            self.stats["empty_draft"] += 1
            return
        if seq in self.lag:
            expected, why = self.lag[seq] - 1, f"after the pinned image at {self.lag[seq]}"
            self.stats["image_lag"] += 1
        else:
            expected, why = target, "the target's"
        if draft != expected:
            where = self.calls[-1].step if self.calls else "start"
            cls = DraftBehind if draft < expected else DraftPast
            raise cls(
                f"{where}: seq {seq}: the draft's memory ends at {draft}, expected {expected} ({why}; "
                f"target ends at {target})",
                call or (self.calls[-1] if self.calls else None),
            )

    def check_all(self) -> None:
        assert self.memories is not None
        for seq in range(self.memories.n_seq):
            self.check(seq)
