"""The draft part of a slot file (``<file>.draft``, patch 0005's framing), for the checks that damage it
or write it in the older format.

    u32 magic, u32 version, u32 n_tokens, n_tokens x i32 token, u64 n_state, n_state bytes of state,
    then from version 2: u64 n_spec, n_spec bytes of the drafter's state (EAGLE3's pending row; 0 bytes
    for a drafter that keeps none)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<III")
LENGTH = struct.Struct("<Q")
WITH_DRAFTER_STATE = 2  # the version that carries the drafter's state


@dataclass(frozen=True)
class DraftPart:
    version: int
    n_tokens: int
    state_at: int  # where the draft's sequence state begins (after its u64 length)
    n_state: int
    n_spec: int | None  # the drafter state's length; None in a version-1 part

    @classmethod
    def parse(cls, data: bytes) -> DraftPart:
        """The framing of a whole, undamaged part; ValueError where it is not one."""
        if len(data) < HEADER.size:
            raise ValueError(f"a draft part of {len(data)} bytes has no header")
        _magic, version, n_tokens = HEADER.unpack_from(data)
        state_at = HEADER.size + 4 * n_tokens + LENGTH.size
        (n_state,) = LENGTH.unpack_from(data, state_at - LENGTH.size)
        n_spec = None
        if version >= WITH_DRAFTER_STATE:
            (n_spec,) = LENGTH.unpack_from(data, state_at + n_state)
        return cls(version, n_tokens, state_at, n_state, n_spec)

    @property
    def tokens_end(self) -> int:
        """Where the tokens end: the header and the tokens come before, the states' frames after."""
        return self.state_at - LENGTH.size

    @property
    def spec_at(self) -> int:
        """Where the drafter's state begins (after its u64 length), in a version-2 part."""
        return self.state_at + self.n_state + LENGTH.size


def as_version_1(data: bytes) -> bytes:
    """The same part in format version 1: its drafter state left out, as a server before version 2 wrote it."""
    part = DraftPart.parse(data)
    return data[:4] + struct.pack("<I", 1) + data[8 : part.state_at + part.n_state]


def token_count(data: bytes) -> int:
    """The token count a part's header gives, whatever follows it."""
    return HEADER.unpack_from(data)[2]
