"""The schedule format: a JSON list of steps over one or two sequences, and the rules that keep it valid.

A schedule file (what the fuzzer writes; ``python -m pyllama_dflash.harness.repro --schedule FILE`` replays it)::

    {"format": "pyllama-dflash-schedule", "version": 1, "n_seq": 2, "steps": [...], "found": {...}}

``found`` is optional: where the fuzzer found the schedule (variant, kind, message). So are the
models and the drafting settings a schedule was drawn with (absent: the defaults)::

    "drafter": "dspark", "target": "moe", "drafting": {"n_max": 2, "p_min": 0.1, "n_min": 1,
    "backend_sampling": false}, "draft_n_ubatch": 4

``drafter`` and ``target`` name the tiny models (pyllama_dflash.harness.tiny.drafters, tiny.target);
``drafting`` is llama-server's --spec-draft-n-max, -n-min, -p-min and the draft's backend sampling.

The steps:

``{"op": "prompt", "seq": 0, "parts": ["tree blue ", {"image": [4, 3]}, "moon "]}``
    one request's prompt, evaluated chunk by chunk (``Session.prompt``): text, and images as an
    ``[nx, ny]`` grid of merged tokens (a picture of 28*nx x 28*ny pixels); each image spans
    ``max(nx, ny)`` positions, with every row at the first of them
``{"op": "batch", "texts": [[0, "tree "], [1, "blue moon "]]}``
    both sequences' text in one target batch, as llama-server batches its slots (``Session.text_batch``)
``{"op": "generate", "seq": 0, "n": 4}``
    drafting rounds (draft, verify, accept, trim) until n tokens are generated
``{"op": "save", "seq": 0, "name": "c1"}``
    the target's state of the sequence: a context checkpoint, or a prompt-cache entry
``{"op": "restore", "seq": 1, "name": "c1"}``
    the target alone takes a saved state (any sequence's); the draft keeps what it holds, as when
    llama-server loads a cached prompt but not the draft's part of it (scenarios S7, S10)
``{"op": "rewind", "seq": 0, "to": "c1"}`` / ``{"op": "rewind", "seq": 0, "to": null}``
    llama-server's rewind to a shorter prefix: the target goes back to checkpoint c1 (a save of this
    sequence that is still a prefix of it), then ``slot.mem.seq_rm(seq, p, -1)`` trims both memories
    to it; ``null`` rewinds to position 0 (no common prefix: both memories drop the sequence)

Text is made of four-letter words and a space: five bytes, one token of the tiny "test" vocab.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import ScheduleError
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig

FORMAT = "pyllama-dflash-schedule"
VERSION = 1

OPS = ("prompt", "batch", "generate", "save", "restore", "rewind")
GRID_MIN, GRID_MAX = 3, 8  # the tiny projector's minimum; 8 x 8 = 64 rows = 4 sub-batches of 16
PX_PER_TOKEN = 28  # the tiny qwen2vl projector merges 2 x 2 patches of 14 px
N_BATCH = DEFAULT_CONFIG.n_batch  # the session's n_batch: one text_batch must fit in it
N_SEQS = 2  # a schedule runs one or two sequences, each on its own stream of the session's n_ctx
# KV cells one sequence may fill: its share of n_ctx, less room for two batches in flight; restore and
# rewind replace a sequence's cells, they do not add to them
SEQ_CELLS = DEFAULT_CONFIG.n_ctx // N_SEQS - 2 * N_BATCH
N_MAX = DEFAULT_CONFIG.n_max  # the most a DFlash round drafts: the tiny drafts' block size less one
GEN_EXTRA = 1 + N_MAX  # a drafting round's verify batch: the anchor and the drafted tokens
DRAFTING_KEYS = {"n_max": int, "n_min": int, "p_min": float, "backend_sampling": bool}

WORDS = (
    "tree",
    "blue",
    "moon",
    "rock",
    "fish",
    "lamp",
    "wind",
    "gold",
    "ship",
    "milk",
    "door",
    "rain",
    "salt",
    "wolf",
    "leaf",
    "star",
)

Step = dict[str, Any]


def words(n: int, offset: int = 0) -> str:
    """n tokens of text: n four-letter words, each followed by a space."""
    return "".join(WORDS[(offset + i) % len(WORDS)] + " " for i in range(n))


def image_px(grid: list[int] | tuple[int, int]) -> tuple[int, int]:
    nx, ny = grid
    return PX_PER_TOKEN * nx, PX_PER_TOKEN * ny


def text_cells(text: str) -> int:
    return math.ceil(len(text.encode()) / 5)


def prompt_cells(parts: list) -> int:
    """An upper bound of the KV cells a prompt fills: its text, and per image its rows and wrappers."""
    n = 0
    for p in parts:
        if isinstance(p, str):
            n += text_cells(p) + 1  # + 1: a text piece cut at a marker may round up once more
        else:
            nx, ny = p["image"]
            n += nx * ny + 2  # <|vision_start|>, <|vision_end|>
    return n


@dataclass
class Slot:
    cells: int
    sampled: bool
    seq: int = 0  # the sequence it was saved from


@dataclass
class SeqModel:
    cells: int = 0  # upper bound of the target's KV cells of the sequence
    sampled: bool = False  # it has a sampled token to draft from (generate needs one)
    # saves of this sequence that are still prefixes of it, oldest (shortest) first
    checkpoints: list[str] = field(default_factory=list)


class Tracker:
    """What a schedule has done so far, abstractly: enough to tell whether a next step is valid."""

    def __init__(self, n_seq: int) -> None:
        if not 1 <= n_seq <= N_SEQS:
            raise ScheduleError(f"n_seq must be 1 to {N_SEQS}, not {n_seq!r}")
        self.n_seq = n_seq
        self.seqs = [SeqModel() for _ in range(n_seq)]
        self.slots: dict[str, Slot] = {}

    def problem(self, step: Step) -> str | None:
        """Why step cannot come next, or None if it can."""
        op = step.get("op")
        if op not in OPS:
            return f"unknown op {op!r}"
        if op == "batch":
            return self._batch_problem(step)
        seq = step.get("seq")
        if not isinstance(seq, int) or not 0 <= seq < self.n_seq:
            return f"seq {seq!r} is not a sequence of this schedule (n_seq {self.n_seq})"
        sm = self.seqs[seq]
        if op == "prompt":
            parts = step.get("parts")
            if not isinstance(parts, list) or not parts:
                return "a prompt needs a non-empty list of parts"
            for p in parts:
                if isinstance(p, str):
                    continue
                grid = p.get("image") if isinstance(p, dict) else None
                if not (
                    isinstance(grid, list)
                    and len(grid) == 2
                    and all(isinstance(g, int) and GRID_MIN <= g <= GRID_MAX for g in grid)
                ):
                    return f"an image part is {{'image': [nx, ny]}} with {GRID_MIN} <= nx, ny <= {GRID_MAX}, not {p!r}"
            if not any(isinstance(p, dict) or text_cells(p) for p in parts):
                return "a prompt must evaluate at least one token"
            if sm.cells + prompt_cells(parts) > SEQ_CELLS:
                return f"the prompt would overflow seq {seq}'s {SEQ_CELLS} cells"
        elif op == "generate":
            n = step.get("n")
            if not isinstance(n, int) or n < 1:
                return f"generate needs n >= 1, not {n!r}"
            if not sm.sampled:
                return f"seq {seq} has no sampled token to draft from"
            if sm.cells + n + GEN_EXTRA > SEQ_CELLS:
                return f"generating {n} would overflow seq {seq}'s {SEQ_CELLS} cells"
        elif op == "save":
            name = step.get("name")
            if not isinstance(name, str) or name in self.slots:
                return f"save needs a new name, not {name!r}"
            if sm.cells == 0:
                return f"seq {seq} is empty: nothing to save"
        elif op == "restore":
            if step.get("name") not in self.slots:
                return f"no saved state named {step.get('name')!r}"
        elif op == "rewind":
            to = step.get("to")
            if to is not None and to not in sm.checkpoints:
                return f"{to!r} is not a checkpoint of seq {seq} that is still a prefix of it (valid: {sm.checkpoints})"
        return None

    def _batch_problem(self, step: Step) -> str | None:
        texts = step.get("texts")
        if not isinstance(texts, list) or not texts:
            return "a batch needs a non-empty list of [seq, text]"
        seqs = [t[0] if isinstance(t, list) and len(t) == 2 else None for t in texts]
        if any(not isinstance(s, int) or not 0 <= s < self.n_seq for s in seqs) or len(set(seqs)) != len(seqs):
            return f"a batch takes each sequence of the schedule at most once, not {texts!r}"
        n = [text_cells(t[1]) if isinstance(t[1], str) else 0 for t in texts]
        if min(n) < 1 or sum(n) > N_BATCH:
            return f"a batch needs 1 or more tokens per sequence and {N_BATCH} at most in all, not {n}"
        for s, k in zip(seqs, n, strict=True):
            if self.seqs[s].cells + k > SEQ_CELLS:
                return f"the batch would overflow seq {s}'s {SEQ_CELLS} cells"
        return None

    def apply(self, step: Step) -> None:
        why = self.problem(step)
        if why:
            raise ScheduleError(why)
        op = step["op"]
        if op == "batch":
            for s, text in step["texts"]:
                self.seqs[s].cells += text_cells(text)
                self.seqs[s].sampled = True
            return
        sm = self.seqs[step["seq"]]
        if op == "prompt":
            sm.cells += prompt_cells(step["parts"])
            sm.sampled = True  # every prompt ends with a text row (mtmd closes an image with <|vision_end|>)
        elif op == "generate":
            sm.cells += step["n"] + GEN_EXTRA
        elif op == "save":
            self.slots[step["name"]] = Slot(sm.cells, sm.sampled, step["seq"])
            sm.checkpoints.append(step["name"])
        elif op == "restore":
            slot = self.slots[step["name"]]
            sm.cells, sm.sampled = slot.cells, slot.sampled
            sm.checkpoints = []  # another history: none of its checkpoints is a prefix of it
        elif op == "rewind":
            to = step["to"]
            if to is None:
                sm.cells, sm.sampled, sm.checkpoints = 0, False, []
            else:
                slot = self.slots[to]
                sm.cells, sm.sampled = slot.cells, slot.sampled
                # the later checkpoints lie past the rewind (llama-server erases them too)
                sm.checkpoints = sm.checkpoints[: sm.checkpoints.index(to) + 1]


@dataclass
class Schedule:
    n_seq: int
    steps: list[Step]
    found: dict | None = None  # where the fuzzer found it: variant, kind, message
    # the draft context's n_batch and n_ubatch, when smaller than the target's (a hole then takes
    # several ubatches to fill, and a text batch reaches the driver larger than the draft's ubatch)
    draft_n_ubatch: int | None = None
    drafter: str | None = None  # the tiny drafter and target kind (None: the models the run was given)
    target: str | None = None
    drafting: dict = field(default_factory=dict)  # n_max, n_min, p_min, backend_sampling (DRAFTING_KEYS)

    def validate(self) -> None:
        t = Tracker(self.n_seq)
        for i, step in enumerate(self.steps):
            try:
                t.apply(step)
            except ScheduleError as e:
                raise ScheduleError(f"step {i + 1} {json.dumps(step)}: {e}") from None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"format": FORMAT, "version": VERSION, "n_seq": self.n_seq, "steps": self.steps}
        if self.draft_n_ubatch:
            d["draft_n_ubatch"] = self.draft_n_ubatch
        for key in ("drafter", "target"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        if self.drafting:
            d["drafting"] = dict(self.drafting)
        if self.found:
            d["found"] = self.found
        return d

    @classmethod
    def from_json(cls, d: dict) -> Schedule:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ScheduleError(f"not a schedule file (format {FORMAT!r} expected)")
        if d.get("version") != VERSION:
            raise ScheduleError(f"schedule version {d.get('version')!r}, this reads version {VERSION}")
        draft = d.get("draft_n_ubatch")
        if draft is not None and (not isinstance(draft, int) or not 1 <= draft <= N_BATCH):
            raise ScheduleError(f"draft_n_ubatch must be an integer in 1..{N_BATCH}, not {draft!r}")
        s = cls(
            int(d["n_seq"]),
            list(d["steps"]),
            d.get("found"),
            draft,
            d.get("drafter"),
            d.get("target"),
            _drafting(d.get("drafting") or {}),
        )
        s.validate()
        return s

    def session_config(self, config: SessionConfig = DEFAULT_CONFIG) -> SessionConfig:
        """The session config a run of this schedule takes: config, with its sequences and draft size."""
        draft = (
            {"draft_n_batch": self.draft_n_ubatch, "draft_n_ubatch": self.draft_n_ubatch} if self.draft_n_ubatch else {}
        )
        return replace(config, n_seq=self.n_seq, **draft, **self.drafting)

    def dumps(self) -> str:
        """One step per line, op first: readable in a report, and still JSON."""
        head = {k: v for k, v in self.to_json().items() if k != "steps"}
        body = ",\n".join("    " + json.dumps(_op_first(s)) for s in self.steps)
        return json.dumps(head)[:-1] + ', "steps": [\n' + body + "\n]}"

    def save(self, path: Path) -> Path:
        path.write_text(self.dumps() + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Schedule:
        try:
            data = json.loads(Path(path).read_text())
        except ValueError as e:
            raise ScheduleError(f"{path}: not JSON: {e}") from None
        return cls.from_json(data)


def _drafting(d: dict) -> dict:
    """The drafting settings of a schedule file, checked: known keys, their types, sane ranges."""
    if not isinstance(d, dict):
        raise ScheduleError(f"drafting must be an object, not {d!r}")
    unknown = set(d) - set(DRAFTING_KEYS)
    if unknown:
        raise ScheduleError(
            f"drafting: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(DRAFTING_KEYS)})"
        )
    out = {}
    for key, value in d.items():
        kind = DRAFTING_KEYS[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise ScheduleError(f"drafting.{key} must be a {kind.__name__}, not {value!r}")
        out[key] = value
    if not 1 <= out.get("n_max", 1) <= N_MAX:
        raise ScheduleError(f"drafting.n_max must be in 1..{N_MAX}, not {out['n_max']}")
    if not 0 <= out.get("n_min", 0) <= N_MAX:
        raise ScheduleError(f"drafting.n_min must be in 0..{N_MAX}, not {out['n_min']}")
    if not 0.0 <= out.get("p_min", 0.0) < 1.0:
        raise ScheduleError(f"drafting.p_min must be in [0, 1), not {out['p_min']}")
    return out


def _op_first(step: Step) -> Step:
    return {k: step[k] for k in sorted(step, key=lambda k: (k != "op", k != "seq", k))}
