"""Run a built variant's ``llama-server`` over loopback, for end-to-end checks.

A :class:`ServerProcess` starts the ``llama-server`` of a variant (found through its
manifest, or given as a path) with a target, its ``--mmproj`` and, optionally, the
draft (``-md ... --spec-type draft-dflash``, or the drafter's type), on a free loopback port. It waits
for ``/health``, keeps the server's log in a file and stops it (SIGTERM, then SIGKILL
after a timeout)::

    from pyllama_dflash.product.llamabuild import find
    from pyllama_dflash.harness.server import ServerOptions, serve

    with serve(find("full"), models, ServerOptions(n_parallel=2)) as srv:
        r = srv.chat([{"role": "user", "content": "hi"}], max_tokens=8)
        print(r.status, r.content, r.timings)

``models`` is anything with ``target``, ``draft`` and ``mmproj`` paths (``tiny.TinyModels``,
``slotloop.models.ModelSet``); ``n_draft_max`` is used where it has one. What a server is asked over
HTTP, and how it answers, is its client half (:mod:`.client`).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ...errors import ServerError
from ...product.llamabuild.manifest import Manifest, find
from .client import Client

__all__ = [
    "ServerError",
    "ServerModels",
    "ServerOptions",
    "ServerProcess",
    "free_port",
    "model_args",
    "resolve_binary",
    "serve",
    "server_command",
]

HOST = "127.0.0.1"
# a server's own settings must not leak in from the caller's environment
_ENV_PREFIXES = ("LLAMA_ARG_", "LLAMA_SERVER_", "LLAMA_TRACE")


class ServerModels(Protocol):
    target: Path
    draft: Path
    mmproj: Path | None


@dataclass(frozen=True)
class ServerOptions:
    """How to start the server. ``None`` leaves a flag out, i.e. the server's own default."""

    draft: bool = True  # load the draft (-md, --spec-type)
    # --spec-type: None, the models' own (draft-dflash where they name none); "auto", no flag: the
    # server detects the type from the draft file (a Markov head makes draft-dspark)
    spec_type: str | None = None
    n_parallel: int = 1  # -np: slots (the server's own default is "auto": 4 slots, unified KV)
    n_ctx: int = 256  # -c: the whole KV cache, shared out among the slots
    # -t and -tb. One by default: the tiny models gain nothing from more, and a spinning
    # two-thread pool on a busy two-core machine ran the checks ten times slower
    threads: int = 1
    n_batch: int | None = None  # -b
    n_ubatch: int | None = None  # -ub
    n_draft_max: int | None = None  # --spec-draft-n-max (default: the models' n_draft_max, if any)
    cache_ram_mib: int | None = None  # --cache-ram: the prompt cache across slots/requests (0 = off)
    ctx_checkpoints: int | None = None  # --ctx-checkpoints (per slot; a hybrid target needs them)
    checkpoint_min_step: int | None = None  # --checkpoint-min-step
    cache_prompt: bool | None = None  # --cache-prompt / --no-cache-prompt (per-request default)
    cache_idle_slots: bool | None = None  # --cache-idle-slots / --no-cache-idle-slots
    kv_unified: bool | None = None  # --kv-unified / --no-kv-unified
    slot_save_path: Path | None = None  # --slot-save-path: enables POST /slots/{id}?action=save|restore
    verbosity: int | None = None  # -lv (5 = debug, shows the speculative SPC_DBG lines)
    extra_args: tuple[str, ...] = ()

    def with_(self, **changes: Any) -> ServerOptions:
        return replace(self, **changes)


def model_args(
    models: ServerModels, *, draft: bool = True, n_draft_max: int | None = None, spec_type: str | None = None
) -> list[str]:
    """The model flags: target, projector and (with ``draft``) the draft and its --spec-type."""
    args = ["-m", str(models.target)]
    if getattr(models, "mmproj", None):
        args += ["--mmproj", str(models.mmproj)]
    if draft:
        spec_type = spec_type or getattr(models, "spec_type", None) or "draft-dflash"
        # draft-mtp drafts with the target's own MTP head: no draft file (the model set names the target)
        if not (spec_type == "draft-mtp" and models.draft == models.target):
            args += ["-md", str(models.draft)]
        if spec_type != "auto":
            args += ["--spec-type", spec_type]
        n_max = n_draft_max if n_draft_max is not None else getattr(models, "n_draft_max", None)
        if n_max is not None:
            args += ["--spec-draft-n-max", str(n_max)]
    return args


def server_command(
    binary: Path, models: ServerModels, options: ServerOptions, *, host: str = HOST, port: int
) -> list[str]:
    """The full command line: models, sizes, caching flags, then ``extra_args`` (they win)."""
    o = options
    cmd = [
        str(binary),
        *model_args(models, draft=o.draft, n_draft_max=o.n_draft_max, spec_type=o.spec_type),
        "-c",
        str(o.n_ctx),
        "-np",
        str(o.n_parallel),
        "-t",
        str(o.threads),
        "-tb",
        str(o.threads),
        # no warmup: it would also encode a large dummy image through the projector
        "--no-warmup",
        "--no-webui",
        "--host",
        host,
        "--port",
        str(port),
    ]
    for flag, value in (
        ("-b", o.n_batch),
        ("-ub", o.n_ubatch),
        ("--cache-ram", o.cache_ram_mib),
        ("--ctx-checkpoints", o.ctx_checkpoints),
        ("--checkpoint-min-step", o.checkpoint_min_step),
        ("--slot-save-path", o.slot_save_path),
        ("-lv", o.verbosity),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    for on, off, value in (
        ("--cache-prompt", "--no-cache-prompt", o.cache_prompt),
        ("--cache-idle-slots", "--no-cache-idle-slots", o.cache_idle_slots),
        ("--kv-unified", "--no-kv-unified", o.kv_unified),
    ):
        if value is not None:
            cmd.append(on if value else off)
    return cmd + list(o.extra_args)


def resolve_binary(server: Manifest | str | os.PathLike) -> Path:
    """A manifest (or a variant name, looked up by manifest) or a path -> the llama-server binary."""
    if isinstance(server, Manifest):
        return server.binary("llama-server")
    if isinstance(server, str) and os.sep not in server and not Path(server).exists():
        return find(server, binaries=("llama-server",)).binary("llama-server")
    return Path(server)


def free_port(host: str = HOST) -> int:
    # bind to port 0 and let it go: another process may grab it in between, start() retries
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(eq=False)  # identity semantics: instances live in a WeakSet
class ServerProcess(Client):
    """One ``llama-server`` process on a loopback port. ``start()``/``stop()``, or ``with``; its requests
    are :class:`~.client.Client`'s."""

    binary: Path
    models: ServerModels
    options: ServerOptions = field(default_factory=ServerOptions)
    log_path: Path | None = None  # default: a fresh file under the system temp dir
    host: str = HOST
    port: int | None = None  # default: a free one
    start_timeout: float = 60.0
    env: dict[str, str] | None = None  # extra environment variables
    # SIGXFSZ left ignored (as Python has it), so that a file-size limit set on the server later
    # (resource.prlimit) fails its writes with EFBIG instead of killing it: a short write, on demand
    short_writes: bool = False
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    command: list[str] = field(default_factory=list, init=False)
    _log_file: Any = field(default=None, init=False, repr=False)
    _media_marker: str | None = field(default=None, init=False, repr=False)
    _log_offset: int = field(default=0, init=False, repr=False)  # where this attempt's output starts

    @classmethod
    def for_variant(
        cls, server: Manifest | str | os.PathLike, models: ServerModels, options: ServerOptions | None = None, **kw: Any
    ) -> ServerProcess:
        return cls(resolve_binary(server), models, options or ServerOptions(), **kw)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> ServerProcess:
        if self.alive:
            return self
        if not Path(self.binary).is_file():
            raise ServerError(f"no llama-server at {self.binary}")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fixed_port = self.port is not None
        for attempt in range(3):
            if not fixed_port:
                self.port = free_port(self.host)
            try:
                self._spawn()
                self._wait_healthy()
                return self
            except ServerError:
                port_taken = "bind" in self._log_since_spawn().lower()
                self.stop()
                if fixed_port or not port_taken or attempt == 2:
                    raise
        return self  # not reached

    def _spawn(self) -> None:
        self.command = server_command(Path(self.binary), self.models, self.options, host=self.host, port=self.port)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
        env.update(self.env or {})
        self._log_file = open(self.log_path, "ab")
        self._log_offset = self._log_file.tell()
        self._log_file.write(("$ " + " ".join(self.command) + "\n").encode())
        self._log_file.flush()
        # its own process group, so that stop() reaches nothing else and ^C here does not reach it twice
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            restore_signals=not self.short_writes,
        )
        _RUNNING.add(self)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(
                    f"llama-server exited with code {rc} before it was ready", self.log_tail(), self.log_path
                )
            r = self.request("GET", "/health", timeout=2.0)
            if r.status == 200:
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"llama-server not healthy after {self.start_timeout:.0f}s (last /health: {r.describe()})",
                    self.log_tail(),
                    self.log_path,
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate, then kill after ``timeout``; returns the exit code (None if never started)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._media_marker = None
        _RUNNING.discard(self)
        return self.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- log --------------------------------------------------------------------

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def _log_since_spawn(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")


# servers this interpreter started and has not stopped yet: stopped at exit, never orphaned
_RUNNING: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for srv in list(_RUNNING):
        srv.stop(timeout=5.0)


def serve(
    server: Manifest | str | os.PathLike, models: ServerModels, options: ServerOptions | None = None, **kw: Any
) -> ServerProcess:
    """A not yet started :class:`ServerProcess`: use it as ``with serve(...) as srv:`` or call ``start()``."""
    return ServerProcess.for_variant(server, models, options, **kw)
