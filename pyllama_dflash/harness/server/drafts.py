"""What a llama-server's DFlash draft drafted, read from its debug log: the one parser of that log.

At debug verbosity (``-lv 5``) ``common/speculative.cpp`` logs, for every drafted position, the
draft's top candidates::

     - seq_id 0, draft candidate   0, pos   1:     68 (   0.412) 'abc'

Candidate 0 is what the draft proposes at that position; a round starts again where the position
does not grow (DFlash and an anchor-first DSpark log from 0, a bonus-anchor DSpark block from 1).
If the server drafted (its ``timings.draft_n`` says so) and no such line is found, the log
format changed: :class:`DraftLogChanged` says so rather than a check comparing nothing.

DFlash2 logs no candidates at all (its draft() walks the selector's lattice and logs nothing per
position): its drafts cannot be read from the server (``LOGS_NO_DRAFTS``), and the checks that
compare drafts do not judge them for it; the scenario matrix judges them through the library.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import PyllamaError

DEBUG_VERBOSITY = 5  # LOG_LEVEL_DEBUG in b11434's common/log.h: LOG_DBG needs -lv 5 or more

_CANDIDATE = re.compile(r"- seq_id (?P<seq>\d+), draft candidate +(?P<k>\d+), pos +(?P<pos>\d+): +(?P<id>-?\d+) ")


LOGS_NO_DRAFTS = frozenset({"dflash2"})  # drafters whose draft() logs no candidate lines in b11434


class DraftLogChanged(PyllamaError, RuntimeError):
    """The server drafted, but its log has no draft candidate lines this parser knows."""


def drafted_rounds(log_text: str, seq: int | None = None) -> list[list[int]]:
    """The rounds the draft drafted, in order: per round the candidate-0 token of each position."""
    rounds: list[list[int]] = []
    last = None
    for m in _CANDIDATE.finditer(log_text):
        if m["k"] != "0" or (seq is not None and int(m["seq"]) != seq):
            continue
        pos = int(m["pos"])
        if last is None or pos <= last:
            rounds.append([])
        rounds[-1].append(int(m["id"]))
        last = pos
    return rounds


def read_drafted_rounds(
    log: Path, *, since: int = 0, drafted: int | None = None, seq: int | None = None
) -> list[list[int]]:
    """:func:`drafted_rounds` of the log from byte offset ``since``; ``drafted`` is how many tokens
    the server says it drafted there (``timings.draft_n``), so that silence can be told from a
    changed format."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    rounds = drafted_rounds(text, seq)
    if drafted and not rounds:
        raise DraftLogChanged(
            f"{log}: the server drafted {drafted} tokens but logged no line like "
            f"' - seq_id N, draft candidate K, pos P: ID' (was it started with -lv {DEBUG_VERBOSITY}, "
            "or did common/speculative.cpp change its debug log?)"
        )
    return rounds


# every candidate line, with the probability as the log prints it (three decimals)
_CANDIDATE_P = re.compile(
    r"- seq_id (?P<seq>\d+), draft candidate +(?P<k>\d+), pos +(?P<pos>\d+): +(?P<id>-?\d+) \( *(?P<p>[^)]*)\)"
)
# llama-server's line after each verification (SLT_DBG): how many tokens the round added (ids.size: the
# accepted drafts and the target's own next token)
_ACCEPTED = re.compile(r"add accepted tokens: sampled=(?P<sampled>-?\d+), ids\.size=(?P<n>\d+)")
# llama-server's line where a slot starts a request's prompt (one per /completion or chat request)
NEW_PROMPT = "| new prompt, n_ctx_slot"
PROMPT_CACHE_FOUND = "found better prompt"  # b11434's prompt cache, when a cached prompt beats the slot's

Candidates = list[tuple[int, int, str]]  # per drafted position: (position, token, probability as logged)


def drafted_candidates(log_text: str, seq: int | None = None) -> list[Candidates]:
    """The rounds the draft drafted, in order: per round every candidate line (the top three per position,
    each with its probability as logged). Two rounds that agree here drafted alike to three decimals of
    every candidate's probability, far finer than :func:`drafted_rounds`' candidate 0."""
    rounds: list[Candidates] = []
    last = None
    for m in _CANDIDATE_P.finditer(log_text):
        if seq is not None and int(m["seq"]) != seq:
            continue
        pos = int(m["pos"])
        if m["k"] == "0":
            if last is None or pos <= last:
                rounds.append([])
            last = pos
        if rounds:
            rounds[-1].append((pos, int(m["id"]), m["p"]))
    return rounds


def request_logs(log_text: str) -> list[str]:
    """The log cut where each request's prompt starts (llama-server's ``new prompt`` line): one piece per
    request that ran a prompt, in order, without what came before the first."""
    return log_text.split(NEW_PROMPT)[1:]


def rounds_with_history(piece: str, seq: int = 0) -> list[tuple[int, Candidates]]:
    """A request's drafting rounds from its piece of the log (:func:`request_logs`), each with how many of
    the request's output ids the sequence held when it was drafted. The ids each verified round added
    (``add accepted tokens ... ids.size``) are counted in log order, a replay after a speculative checkpoint
    included, so a round drafted by another drafter of the server (an n-gram one, which logs no candidates)
    leaves the count right. Only one slot may draft while the piece is written (``--parallel 1``, or
    requests one after another)."""
    out: list[tuple[int, Candidates]] = []
    m, last = 0, None
    for line in piece.splitlines():
        a = _ACCEPTED.search(line)
        if a:
            m, last = m + int(a["n"]), None
            continue
        c = _CANDIDATE_P.search(line)
        if not c or int(c["seq"]) != seq:
            continue
        pos = int(c["pos"])
        if c["k"] == "0":
            if last is None or pos <= last:
                out.append((m, []))
            last = pos
        if out:
            out[-1][1].append((pos, int(c["id"]), c["p"]))
    return out
