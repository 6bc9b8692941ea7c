"""A bounded soak of a variant's llama-server: many requests from concurrent clients, each judged.

:func:`soak` starts the variant's server with the draft (four slots, the RAM prompt cache on, a slot
folder) and the same binary without the draft, sends both the same list of requests from concurrent
clients, and judges every answer: its expected status, greedy output equal to the answer without the
draft, and no HTTP 500 where the fix is meant to answer. Image and text chats, streaming and not,
slot saves and restores in between, and a few malformed requests (a broken image, an unknown slot, a
bad file name). Part of the chats go through the ``openai`` client, as llama.cpp's own server tests
do. It talks only to loopback, stops by itself within its time bound, and reports requests, failures
by kind, throughput with and without the draft, and the server's resident memory at start and end.
"""

from __future__ import annotations

from .workload import Request, SoakReport, soak, workload

__all__ = ["Request", "SoakReport", "soak", "workload"]
