"""Running the registered checks on one variant's llama-server: :func:`run_server_checks`.

Each check starts the servers it needs (so a failure in one cannot leave state behind for the next)
and returns ``{check: result}`` where every result has ``status`` (an HTTP code, or a list of them
in request order), ``ok`` (the variant behaved as expected) and ``expected``, plus what the check
measured: contents, token ids, draft statistics (``timings.draft_n`` / ``draft_n_accepted``), the
server log path. It is what ``pyllama-dflash repro --server`` reports under ``"server"``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ...errors import ServerError
from ...product.llamabuild.manifest import Manifest
from ...product.llamabuild.variants import Variant
from ...product.llamabuild.variants import variant as lookup_variant
from ...words import Judged
from ..oracles.references import judged_on
from . import bodies
from .checks import CHECKS, REGISTRY
from .expect import Expect
from .server_process import ServerModels, ServerOptions, ServerProcess, resolve_binary


class Ctx:
    """What every check needs: binary, models, the variant and what it is held to on these models (None
    for a server given by path), base options, images, where logs go."""

    def __init__(
        self,
        binary: Path,
        models: ServerModels,
        v: Variant | None,
        judged: Judged | None,
        base: ServerOptions,
        work_dir: Path,
        images: list[bytes],
        reference: tuple[Path, ServerModels] | None = None,
    ):
        self.binary, self.models, self.variant, self.judged, self.base = binary, models, v, judged, base
        self.work_dir, self.images, self.reference = work_dir, images, reference
        self._once: dict[str, Any] = {}

    def expect(self, check: str) -> Expect:
        saves = self.variant is not None and self.variant.saves_draft
        return REGISTRY[check].expect(self.judged, saves, drafter=getattr(self.models, "drafter", "dflash"))

    def server(
        self,
        name: str,
        *,
        binary: Path | None = None,
        models: ServerModels | None = None,
        short_writes: bool = False,
        **changes: Any,
    ):
        """A server (not started: use it as a context manager) with the base options changed by ``changes``
        (``short_writes``: see ServerProcess)."""
        log = self.work_dir / f"{name}.log"
        log.unlink(missing_ok=True)
        options = self.base.with_(**changes)
        return ServerProcess(
            binary or self.binary, models or self.models, options, log_path=log, short_writes=short_writes
        )

    def image(self, i: int = 0) -> bytes:
        return self.images[i % len(self.images)]

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """What several checks share (the exactness checks' pair of servers), computed once per run."""
        if key not in self._once:
            self._once[key] = compute()
        return self._once[key]


def run_server_checks(
    server: Manifest | str | os.PathLike,
    models: ServerModels,
    *,
    variant: str | None = None,
    checks: Iterable[str] | None = None,
    options: ServerOptions | None = None,
    work_dir: Path | None = None,
    images: list[bytes] | None = None,
    reference: tuple[Manifest | str | os.PathLike, ServerModels] | None = None,
    patches_dir: Path | None = None,
) -> dict[str, dict]:
    """Run the checks on one variant; returns ``{check: {"status", "ok", "expected", ...}}``.

    ``server``: a manifest (its ``variant`` sets the expectations), a variant name, or a
    ``llama-server`` path (then pass ``variant``; a name the series does not know is
    expected to behave as a fix). ``options``: the base server options (default: one thread and
    ``-c 256`` for the tiny models; up to 8 threads and ``-c 4096`` for real ones). ``images``:
    encoded images (default: ``models.image_files``, else synthetic PNGs). ``work_dir``: where the
    server logs go (default: a new temporary directory, kept so that the logs can be read).
    ``reference``: baseline's llama-server (manifest, name or path) and the models with the draft's
    reconverted twin, for ``drafts_vs_twin``.
    """
    binary = resolve_binary(server)
    if variant is None:
        variant = (
            server.variant
            if isinstance(server, Manifest)
            else (str(server) if isinstance(server, str) and os.sep not in str(server) else None)
        )
    wanted = list(checks) if checks is not None else list(CHECKS)
    unknown = sorted(set(wanted) - set(REGISTRY))
    if unknown:
        raise ValueError(f"unknown server checks {unknown}; known: {', '.join(REGISTRY)}")
    real = bool(getattr(models, "real", False))
    base = options or (ServerOptions(n_ctx=4096, threads=min(8, os.cpu_count() or 1)) if real else ServerOptions())
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="pyllama-dflash-server-"))
    work = work / (variant or "server")
    work.mkdir(parents=True, exist_ok=True)
    ref = (resolve_binary(reference[0]), reference[1]) if reference is not None else None
    # an as-trained variant is judged by the draft's image-rows key
    v = lookup_variant(variant, patches_dir) if variant else None
    judged = judged_on(v, models) if v is not None else None
    ctx = Ctx(binary, models, v, judged, base, work, images or bodies.default_images(models), ref)

    results: dict[str, dict] = {}
    for name in wanted:
        try:
            results[name] = REGISTRY[name].run(ctx).to_json()
        except (ServerError, OSError) as e:  # a server that would not start: report it, run the rest
            results[name] = {"status": None, "ok": False, "error": f"{type(e).__name__}: {e}"}
    return results


def run_on_each(
    manifests: Iterable[Manifest],
    models: ServerModels,
    *,
    checks: Iterable[str] | None = None,
    reference: tuple[Manifest | str | os.PathLike, ServerModels] | None = None,
) -> dict[str, dict[str, dict]]:
    """The checks on each variant in turn, with the same models: ``{variant: {check: result}}``
    (see :func:`run_server_checks`)."""
    checks = None if checks is None else list(checks)
    return {m.variant: run_server_checks(m, models, checks=checks, reference=reference) for m in manifests}
