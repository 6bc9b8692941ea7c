"""llama-server over loopback: run a built variant's server, and the end-to-end checks on it.

- :mod:`.process`: :class:`ServerProcess` starts a variant's ``llama-server`` on the models
  (with or without the DFlash draft), waits for ``/health``, talks HTTP (``requests``) and
  stops it; :func:`serve` is the short way in.
- :mod:`.checks`: :func:`run_server_checks` runs the checks (``CHECKS``) on one variant and
  judges each answer against the table ``EXPECTED`` (baseline's row, or the patched one).
"""

from .checks import (
    CHECKS,
    EXPECTED,
    SPEC_BATCH_ERROR,
    Expect,
    expectation,
    run_server_checks,
)
from .process import (
    HOST,
    Response,
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
    "EXPECTED",
    "HOST",
    "SPEC_BATCH_ERROR",
    "Expect",
    "Response",
    "ServerError",
    "ServerModels",
    "ServerOptions",
    "ServerProcess",
    "expectation",
    "free_port",
    "model_args",
    "resolve_binary",
    "run_server_checks",
    "serve",
    "server_command",
]
