"""Tell whether a DFlash draft lacks M-RoPE sections, and add them the way b11434's converter does.

A draft converted for an M-RoPE target (one with ``{arch}.rope.dimension_sections``, e.g.
qwen35) by llama.cpp b11434 carries ``dflash.rope.dimension_sections = [head_dim // 2, 0, 0, 0]``
(``conversion/qwen.py``, ``DFlashModel.set_gguf_parameters``). Drafts converted before lack it;
llama-server then breaks on images. Adding that one key, and touching nothing else, turns such a
legacy draft into its reconverted twin.

A draft trained with the target's image rows in its context (a SpecForge multimodal DFlash draft, say)
may also be marked so, with the bool ``dflash.trained_with_image_rows = true`` (``IMAGE_ROWS_KEY``):
patch 0008 then serves it every row of the prompt, image rows included, at positions of its own. Every
public DFlash draft is trained on text and goes without it; ``upgrade(image_rows=True)`` adds it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import DraftUpgradeError
from ...files import atomic_path, default_file_mode
from .gguf_stream import (
    CHUNK_SIZE,
    GGUFError,
    GGUFFile,
    KeyValue,
    ValueType,
    make_kv,
    read_gguf,
    write_with_kvs,
)

DFLASH_ARCH = "dflash"
SECTIONS_KEY = f"{DFLASH_ARCH}.rope.dimension_sections"
KEY_LENGTH_KEY = f"{DFLASH_ARCH}.attention.key_length"
EMBEDDING_KEY = f"{DFLASH_ARCH}.embedding_length"
HEAD_COUNT_KEY = f"{DFLASH_ARCH}.attention.head_count"
# the bool key of a draft trained with the target's image rows (patch 0008's
# COMMON_SPECULATIVE_DFLASH_IMAGE_ROWS_KEY): the drafts of the DFlash family read it under this prefix
IMAGE_ROWS_KEY = f"{DFLASH_ARCH}.trained_with_image_rows"
# the rows of a DFlash draft's block (the anchor and the masks); libcommon assumes 16 without the key
BLOCK_SIZE_KEY = f"{DFLASH_ARCH}.block_size"
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class DraftInfo:
    """What a draft (and, if given, its target) say about the M-RoPE sections."""

    path: Path
    architecture: str | None
    is_dflash: bool
    sections: tuple[int, ...] | None  # the draft's own rope.dimension_sections, if any
    sections_to_write: tuple[int, ...] | None  # what upgrade() would add (None: nothing to add)
    target: Path | None
    target_mrope: bool | None  # None when no target was given
    image_rows: bool = False  # the draft carries IMAGE_ROWS_KEY = true (trained with image rows)
    block_size: int = 0  # a DFlash draft's block, as libcommon reads it (0: not a DFlash draft)

    @property
    def has_sections(self) -> bool:
        return self.sections is not None

    @property
    def affected(self) -> bool:
        """True only when known: a DFlash draft without sections for an M-RoPE target."""
        return self.is_dflash and not self.has_sections and self.target_mrope is True


@dataclass(frozen=True)
class UpgradeResult:
    """What :func:`upgrade` did; ``written`` is False for a no-op (and ``out`` is then None)."""

    draft: Path
    out: Path | None
    written: bool
    sections: tuple[int, ...] | None  # the sections added, or the ones already there
    reason: str  # one human line
    image_rows: bool = False  # IMAGE_ROWS_KEY = true added, or already there

    def __str__(self) -> str:
        return self.reason


def _read(path: Path) -> GGUFFile:
    try:
        return read_gguf(path)
    except GGUFError as exc:
        raise DraftUpgradeError(path, exc.reason) from None
    except OSError as exc:
        raise DraftUpgradeError(path, f"cannot read: {exc.strerror or exc}") from None


def _int(g: GGUFFile, key: str) -> int | None:
    v = g.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise DraftUpgradeError(g.path, f"{key} is {v!r}, expected an integer")
    return v


def converter_sections(g: GGUFFile) -> tuple[int, int, int, int]:
    """``[head_dim // 2, 0, 0, 0]`` as the converter writes it; head_dim from key_length, else
    embedding_length // head_count (the converter's ``head_dim or hidden_size // n_heads``)."""
    head_dim = _int(g, KEY_LENGTH_KEY)
    if head_dim is None:
        n_embd, n_head = _int(g, EMBEDDING_KEY), _int(g, HEAD_COUNT_KEY)
        if n_embd is None or not n_head:
            raise DraftUpgradeError(
                g.path,
                f"cannot tell the head size: no {KEY_LENGTH_KEY}, and "
                f"{EMBEDDING_KEY} / {HEAD_COUNT_KEY} are missing or zero",
            )
        head_dim = n_embd // n_head
    if head_dim < 2:
        raise DraftUpgradeError(g.path, f"head size {head_dim} is too small for rope sections")
    return (head_dim // 2, 0, 0, 0)


def _sections(g: GGUFFile) -> tuple[int, ...] | None:
    v = g.get(SECTIONS_KEY)
    return None if v is None else tuple(v)


def _marked(g: GGUFFile) -> bool:
    """Whether the draft carries IMAGE_ROWS_KEY as the bool true (the only form patch 0008 reads)."""
    kv = g.kv(IMAGE_ROWS_KEY)
    return kv is not None and kv.type is ValueType.BOOL and kv.value is True


def target_uses_mrope(target: Path | str) -> bool:
    """Whether the target GGUF has ``{arch}.rope.dimension_sections`` (arch: its architecture)."""
    g = _read(Path(target))
    if g.architecture is None:
        raise DraftUpgradeError(g.path, "no general.architecture: cannot tell whether it uses M-RoPE")
    return f"{g.architecture}.rope.dimension_sections" in g


def inspect(draft: Path | str, target: Path | str | None = None) -> DraftInfo:
    """Read the draft's (and target's) metadata only; never reads tensor data, writes nothing."""
    g = _read(Path(draft))
    is_dflash = g.architecture == DFLASH_ARCH
    sections = _sections(g) if is_dflash else None
    to_write = converter_sections(g) if is_dflash and sections is None else None
    mrope = target_uses_mrope(target) if target is not None else None
    return DraftInfo(
        g.path,
        g.architecture,
        is_dflash,
        sections,
        to_write,
        Path(target) if target is not None else None,
        mrope,
        is_dflash and _marked(g),
        _int(g, BLOCK_SIZE_KEY) or (DEFAULT_BLOCK_SIZE if is_dflash else 0),
    )


def default_output(draft: Path | str) -> Path:
    """Where upgrade() writes when given neither out nor in_place: the twin, ``NAME-twin.gguf`` beside it."""
    p = Path(draft)
    return p.with_name(f"{p.stem}-twin{p.suffix or '.gguf'}")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def upgrade(
    draft: Path | str,
    out: Path | str | None = None,
    in_place: bool = False,
    *,
    target: Path | str | None = None,
    image_rows: bool = False,
    chunk_size: int = CHUNK_SIZE,
) -> UpgradeResult:
    """Write the draft with ``dflash.rope.dimension_sections`` added; the input is never modified.

    ``out`` defaults to :func:`default_output`; ``in_place=True`` replaces the draft itself
    (atomically: a temp file beside it, then ``os.replace``). An ``out`` that is the draft is
    refused without ``in_place``. A draft that already has sections, or (when ``target`` is given)
    whose target does not use M-RoPE, is a no-op that writes nothing and says why.

    ``image_rows=True`` (a draft trained with the target's image rows) also writes
    ``IMAGE_ROWS_KEY = true`` where the draft lacks it, with the sections or alone; the no-op is then
    a draft that has both (or the key, for a target without M-RoPE).
    """
    draft = Path(draft)
    g = _read(draft)
    if g.architecture != DFLASH_ARCH:
        found = repr(g.architecture) if g.architecture is not None else "missing"
        raise DraftUpgradeError(draft, f"not a DFlash draft (general.architecture is {found})")
    dest = _destination(draft, out, in_place)

    existing, marked = _sections(g), _marked(g)
    add_mark = image_rows and not marked
    also = f" and {IMAGE_ROWS_KEY} = true" if image_rows else ""
    if existing is not None and not add_mark:
        why = f"already has rope.dimension_sections {list(existing)}{also}: nothing to do"
        return UpgradeResult(draft, None, False, existing, f"{draft}: {why}", marked)
    sections = converter_sections(g) if existing is None else None
    if sections is not None and target is not None and not target_uses_mrope(target):
        sections = None
        if not add_mark:
            why = f"target {target} does not use M-RoPE, so the draft needs no rope.dimension_sections"
            why += f" (and it already has {IMAGE_ROWS_KEY} = true)" if image_rows else ""
            return UpgradeResult(draft, None, False, None, f"{draft}: {why}: nothing to do", marked)

    kvs: list[KeyValue] = []
    added: list[str] = []
    if sections is not None:
        kvs.append(make_kv(SECTIONS_KEY, ValueType.ARRAY, list(sections), ValueType.INT32))
        added.append(f"{SECTIONS_KEY} = {list(sections)}")
    if add_mark:
        kvs.append(make_kv(IMAGE_ROWS_KEY, ValueType.BOOL, True))
        added.append(f"{IMAGE_ROWS_KEY} = true")
    _write_atomic(g, dest, kvs, keep_mode=in_place, chunk_size=chunk_size)
    verb = "replaced" if in_place else "wrote"
    shown = sections if sections is not None else existing
    return UpgradeResult(draft, dest, True, shown, f"{verb} {dest}: added {' and '.join(added)}", image_rows or marked)


def _destination(draft: Path, out: Path | str | None, in_place: bool) -> Path:
    """Where upgrade() writes; refuses an output that is the input without in_place, and a
    different output with it."""
    if in_place:
        if out is not None and not _same_file(draft, Path(out)):
            raise DraftUpgradeError(draft, f"in_place and a different output {out} were both given")
        return draft.resolve()  # through a symlink: replace the file, not the link
    dest = Path(out) if out is not None else default_output(draft)
    if dest.exists() and _same_file(draft, dest):
        raise DraftUpgradeError(
            draft, f"output {dest} is the input file; pass in_place=True (--in-place) to replace it"
        )
    return dest


def _write_atomic(g: GGUFFile, dest: Path, kvs: Sequence[KeyValue], *, keep_mode: bool, chunk_size: int) -> None:
    """Temp file in dest's directory, checked, then renamed: no half-written file is ever seen."""
    if not dest.parent.is_dir():
        raise DraftUpgradeError(dest, "output directory does not exist")
    mode = g.path.stat().st_mode & 0o7777 if keep_mode else default_file_mode()
    try:
        with atomic_path(dest, mode=mode) as tmp:
            with open(tmp, "wb") as f:
                write_with_kvs(g, f, kvs, chunk_size=chunk_size)
                f.flush()
                os.fsync(f.fileno())
            try:
                check = read_gguf(tmp)  # the output must parse and cover its tensors
            except GGUFError as exc:
                raise DraftUpgradeError(dest, f"the written file does not read back: {exc.reason}") from None
            if not all(_reads_back(check, kv) for kv in kvs) or len(check.tensors) != len(g.tensors):
                raise DraftUpgradeError(dest, "the written file does not read back as expected")
    except GGUFError as exc:  # reading the input while streaming it
        raise DraftUpgradeError(exc.path, exc.reason) from None
    except OSError as exc:
        raise DraftUpgradeError(dest, f"cannot write: {exc.strerror or exc}") from None


def _reads_back(g: GGUFFile, kv: KeyValue) -> bool:
    """The written file has the entry as it was meant: same type, value and encoding."""
    got = g.kv(kv.key)
    return got is not None and (got.type, got.item_type, got.value, got.raw) == (
        kv.type,
        kv.item_type,
        kv.value,
        kv.raw,
    )


def reconverted_twin(draft: Path | str, cache_dir: Path | str) -> Path:
    """The draft's reconverted twin: the draft itself when it has sections, else an upgraded copy
    in cache_dir (made once per draft file, keyed by its path, size and mtime; written atomically).

    The drift oracle runs the twin on baseline as the reference for the draft.
    """
    import hashlib

    draft = Path(draft).resolve()
    info = inspect(draft)
    if not info.is_dflash:
        raise DraftUpgradeError(draft, f"not a DFlash draft (general.architecture is {info.architecture!r})")
    if info.has_sections:
        return draft
    st = draft.stat()
    key = hashlib.sha256(f"{draft}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"{draft.stem}-twin-{key}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        upgrade(draft, out)
    return out


@dataclass(frozen=True)
class JudgedDraft:
    """What a run needs to judge a draft as the series serves it: its reconverted twin (the reference where
    the draft is served as b11434 serves it) and whether it is marked as trained with image rows (then
    as-trained serves it as its definition has it)."""

    twin: Path
    image_rows: bool


def judged_draft(draft: Path | str, cache_dir: Path | str) -> JudgedDraft:
    """The draft's :class:`JudgedDraft`, its twin made in cache_dir where needed (:func:`reconverted_twin`)."""
    return JudgedDraft(reconverted_twin(draft, cache_dir), inspect(draft).image_rows)
