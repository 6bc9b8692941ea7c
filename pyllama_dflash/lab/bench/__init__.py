"""The project's performance figures (``python -m pyllama_dflash.lab.bench``; its module docstring lists the
sections)."""

from ...errors import PyllamaError


class SectionUnavailable(PyllamaError, RuntimeError):
    """A section that cannot run on this machine; the message says why in one line."""
