"""Changing the fix: the series as commits of a git work tree, and back.

``tree`` (``pyllama-dflash develop``: a copy of the pinned source, committed, with one commit per
patch of a variant), ``writeback`` (``pyllama-dflash write-back``: one patch per commit, back into
the series, each in its own form), ``mailpatch`` (a patch file's parts: header, message, diffstat,
diff, trailer), ``git`` (running git, and DevelopError). docs/changing-the-fix.md walks the loop.
"""

from .git import DevelopError
from .tree import Developed, develop
from .writeback import Outcome, write_back

__all__ = ["DevelopError", "Developed", "Outcome", "develop", "write_back"]
