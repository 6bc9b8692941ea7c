"""Errors the build raises; each message names the file or parameter and the reason."""


class BuildError(Exception):
    """A build step failed in a way the user can act on."""


class SourceError(BuildError):
    """The llama.cpp source could not be found, fetched or verified."""


class PatchError(BuildError):
    """A patch in the series is malformed or does not apply."""


class ToolchainError(BuildError):
    """The requested backend cannot be built on this machine."""


class VariantNotBuilt(BuildError):
    """A variant was asked for by name but no valid build of it exists."""
