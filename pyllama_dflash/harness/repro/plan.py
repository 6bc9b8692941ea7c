"""What a repro run runs: the variants (built or found), the must-pass variant, the models and their session
config, the scenario rows and the cases (drafter and target) of its tables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import UsageError
from ...flags import pick
from ...paths import cache_root
from ...product.llamabuild import BuildOptions, build, default_must_pass, find_built, variant
from ...product.llamabuild.manifest import Manifest
from ...product.llamabuild.patchset import BASELINE
from ...words import Role
from ..engine import ctest_row
from ..scenarios.catalog import SCENARIOS
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet, tiny_models
from ..tiny import DRAFTERS, TARGET_KINDS

REAL_N_BATCH = 256  # the target's n_batch for real models, unless --n-batch says otherwise


@dataclass(frozen=True)
class Plan:
    """The run's inputs, once the flags are read: ``variants`` in the series' order, ``must_pass`` among them."""

    manifests: list[Manifest]
    must_pass: str
    models: ModelSet
    config: SessionConfig

    @property
    def variants(self) -> list[str]:
        return [m.variant for m in self.manifests]


def manifests(args: argparse.Namespace) -> list[Manifest]:
    """The variants' manifests (BuildError when one cannot be built or found), and baseline's built
    too where the drift references run on it."""
    out = _manifests(args, _variant_names(args))
    if not args.no_drift and BASELINE not in [m.variant for m in out]:
        _manifests(args, [BASELINE])  # the drift references run on baseline
    return out


def must_pass_of(args: argparse.Namespace, variants: list[str]) -> str:
    """The variant that must pass: ``--must-pass``, else default_must_pass's; UsageError when not run."""
    must_pass = args.must_pass or default_must_pass(variants)
    if must_pass not in variants:
        raise UsageError(f"--must-pass {must_pass!r} is not among the variants run ({', '.join(variants)})")
    return must_pass


def _variant_names(args: argparse.Namespace) -> list[str]:
    return args.variants or ["all"]


def _manifests(args: argparse.Namespace, names: list[str]) -> list[Manifest]:
    """The variants' manifests: built where missing, or with --no-build found as they are."""
    server = bool(args.server)  # llama-server only where its checks run: the matrix needs the libraries
    if args.no_build:
        return find_built(names, backend=args.backend, server=server)
    return build(names, BuildOptions(backend=args.backend, cpu=args.cpu, server=server))


def scenario_ids(args: argparse.Namespace) -> list[str]:
    """The rows to run: scenario ids, and C1 for the C++ test."""
    known = [*SCENARIOS, ctest_row.ROW]
    if not args.scenarios:
        return known
    ids = [s.strip().upper() for s in args.scenarios.split(",")]
    unknown = [s for s in ids if s not in known]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return ids


def cases(
    args: argparse.Namespace, models: ModelSet, scenarios: list[str], variants: list[str] = ()
) -> list[tuple[ModelSet, list[str]]]:
    """The (models, scenario ids) of every table: for the tiny models every drafter on the dense
    target, and on the MoE target the image scenarios; real models make one table. Where an
    ``as-trained`` variant runs, which judges a draft by its image-rows key, every tiny table comes
    twice: with the drafts as generated (trained on text) and with the key (trained with image rows)."""
    ids = [sid for sid in scenarios if sid in SCENARIOS]
    if models.real or args.draft:
        if args.drafters or args.targets:
            raise UsageError("--drafters and --targets choose the tiny models; not with --draft")
        return [(models, ids)]
    keys = (False, True) if any(variant(v).role == Role.AS_TRAINED for v in variants) else (False,)
    out = []
    for image_rows in keys:
        for target in pick(args.targets, TARGET_KINDS, "--targets"):
            for drafter in pick(args.drafters, tuple(DRAFTERS), "--drafters"):
                on_target = ids if target == "dense" else [sid for sid in ids if SCENARIOS[sid].image]
                if on_target:
                    out.append((tiny_models(drafter=drafter, target=target, image_rows=image_rows), on_target))
    return out


def models_and_config(args: argparse.Namespace) -> tuple[ModelSet, SessionConfig]:
    """The models (tiny, or the real ones the flags name) and the session config they run with;
    UsageError for a missing file or sizes llama.cpp would assert on (refused here, not in every child)."""
    try:
        models, sizes = _models(args)
        return models, replace(DEFAULT_CONFIG, n_gpu_layers=args.n_gpu_layers, **sizes, **_draft_sizes(args)).check()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _models(args: argparse.Namespace) -> tuple[ModelSet, dict]:
    """The models, and the sizes of the config that are theirs (the tiny ones': the defaults')."""
    real = [args.target, args.draft, args.mmproj]
    if not any((args.target, args.mmproj, args.image)):
        models = tiny_models()
        if args.draft:  # another draft for the tiny target (an upgraded one, say); its twin is derived
            models = _with_draft(models, args.draft)
        return models, {"n_batch": args.n_batch, "n_ubatch": args.n_batch} if args.n_batch else {}
    if not all(real) or not args.image:
        raise ValueError("real models need --target, --draft, --mmproj and at least one --image")
    for flag, path in (
        ("--target", args.target),
        ("--draft", args.draft),
        ("--mmproj", args.mmproj),
        *(("--image", p) for p in args.image),
    ):
        if not path.is_file():
            raise ValueError(f"{flag} {path}: no such file")
    n_batch = args.n_batch or REAL_N_BATCH
    models = ModelSet(
        args.target.resolve(),
        args.draft.resolve(),
        args.mmproj.resolve(),
        image_files=tuple(p.resolve() for p in args.image),
        real=True,
        drafter=args.draft.stem,
        target_kind=args.target.stem,
    )
    return _with_draft(models, args.draft), {"n_batch": n_batch, "n_ubatch": n_batch, "n_ctx": 8192}


def _draft_sizes(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("draft_n_batch", args.draft_n_batch), ("draft_n_ubatch", args.draft_n_ubatch)) if v}


def _with_draft(models: ModelSet, draft: Path) -> ModelSet:
    """The models with this (plain-kind) draft, and its reconverted twin as the M-RoPE draft: the
    draft itself when it has sections, else a copy upgraded into the cache (the drift reference).
    A draft marked as trained with image rows is judged as such (as-trained serves it as the
    definition). The sliding-window drafts are the tiny generator's and do not go with another draft."""
    from pyllama_dflash.product.upgrade.draft import DraftUpgradeError, judged_draft

    if not draft.is_file():
        raise ValueError(f"--draft {draft}: no such file")
    try:
        judged = judged_draft(draft, cache_root() / "twins")
    except DraftUpgradeError as e:
        raise ValueError(f"--draft: {e}") from None
    return replace(
        models,
        draft=draft.resolve(),
        twin=judged.twin,
        draft_swa=None,
        swa_twin=None,
        swa_window=None,
        image_rows=judged.image_rows,
    )
