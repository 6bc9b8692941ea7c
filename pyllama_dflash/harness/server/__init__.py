"""llama-server over loopback: run a built variant's server, and the end-to-end checks on it.

- :mod:`.server_process`: :class:`ServerProcess` starts a variant's ``llama-server`` on the models
  (with or without the DFlash draft), waits for ``/health`` and stops it; :func:`serve` is the
  short way in.
- :mod:`.client`: what a server is asked over HTTP (``requests``) and how it answers
  (:class:`Response`): tokenize, slot save, restore and erase, generation, with one failure
  policy; and the servers a check starts beside its own (a fresh slot folder, no draft).
- :mod:`.checks`: the checks, each one function registered with what it must see per kind of
  variant (:mod:`.expect` holds the one rule that judges them, :mod:`.bodies` what they send);
  :func:`run_server_checks` (:mod:`.run_checks`) runs them on one variant.
"""

from .checks import CHECKS, FAMILY, REGISTRY, SIBLINGS_CHECKS, Check, check
from .client import Response
from .expect import SPEC_BATCH_ERROR, Expect, Result, Seen
from .run_checks import run_server_checks
from .server_process import (
    HOST,
    ServerError,
    ServerModels,
    ServerOptions,
    ServerProcess,
    free_port,
    model_args,
    resolve_binary,
    serve,
    server_command,
)

__all__ = [
    "CHECKS",
    "FAMILY",
    "HOST",
    "REGISTRY",
    "SIBLINGS_CHECKS",
    "SPEC_BATCH_ERROR",
    "Check",
    "Expect",
    "Result",
    "Seen",
    "check",
    "Response",
    "ServerError",
    "ServerModels",
    "ServerOptions",
    "ServerProcess",
    "free_port",
    "model_args",
    "resolve_binary",
    "run_server_checks",
    "serve",
    "server_command",
]
