"""The patch series: ``patches/series`` lists patches in order; a variant is a prefix of it.

Series line format: ``<patch file> <variant name> [<role>] [aside]``, or ``<patch file> * [<variant name>]``;
``#`` starts a comment. The variant called ``baseline`` is the empty prefix. A variant line that ends in
``aside`` (ASIDE) makes a variant that stands beside the series: it carries the patches before it, and no
later variant carries it (the zero-fill, shown beside the fixes rather than under them). A patch whose
variant column is ``-`` (CARRIED) makes no variant either: every variant after it carries it, as a fix of
its own that later fixes build on. A patch whose variant column is ``*`` (EVERY) makes no variant: it is
applied on top of every variant, baseline included, after the variant's own patches. That is how a
regression test that must exist on the unfixed tree (to fail there) travels with the series. A ``*`` line
that names a variant made earlier in the file is applied on top of that variant and every variant that
carries it, and nowhere else: the test of a fix that a tree without the fix fails by design (each
request's test must fail there). The role says what a variant is judged as
(:class:`~pyllama_dflash.words.Role`; default ``twin``): the zero-fill, a fix judged against the draft's
reconverted twin, a fix judged against the draft's definition, or a fix that serves each draft as it was
trained (judged as a ``definition`` fix with a draft trained with image rows, as a ``twin`` fix with any
other). Patches are unified diffs (as ``git format-patch`` writes them, header and all) applied with ``git
apply`` semantics: exact context, a hunk may have moved by some lines, no fuzz. A hunk that does not apply
is reported with the patch, the file and the hunk header.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...errors import PatchError
from ...files import sha256_bytes
from ...words import Role
from .hunk import NO_EOL, read_hunk

BASELINE = "baseline"
EVERY = "*"  # the variant column of a patch applied to every variant
CARRIED = "-"  # the variant column of a patch every later variant carries, making none of its own
ASIDE = "aside"  # the last word of a variant line no later variant carries
RETIRED_ROLES = {"seed": Role.SHOWN, "fix": Role.TWIN}  # refused in a series file, naming the new one
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Hunk:
    header: str
    old_start: int
    old_lines: list[str]  # context and removed lines, without line ends
    new_lines: list[str]  # context and added lines, without line ends
    old_no_eol: bool  # "\ No newline at end of file" after the old side's last line
    new_no_eol: bool


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the tree root
    new_file: bool
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    name: str  # file name inside patches/
    variant: str  # EVERY: applied on top of every variant; CARRIED: carried by every later one
    sha256: str
    files: tuple[FilePatch, ...]
    role: Role = Role.TWIN  # what the variant it makes is judged as
    aside: bool = False  # a variant no later variant carries (ASIDE)
    on: str | None = None  # EVERY only: applied on this variant and those that carry it, not on every one

    @property
    def touched(self) -> list[str]:
        return [f.path for f in self.files]


@dataclass(frozen=True)
class Series:
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def variants(self) -> list[str]:
        return [BASELINE] + [p.variant for p in self.own if p.variant != CARRIED]

    @property
    def own(self) -> tuple[Patch, ...]:
        """The patches that make variants, and those later variants carry, in order (a variant is a prefix
        of them)."""
        return tuple(p for p in self.patches if p.variant != EVERY)

    @property
    def every(self) -> tuple[Patch, ...]:
        """The patches applied on top of the variants' own (EVERY), those named ``on`` a variant included."""
        return tuple(p for p in self.patches if p.variant == EVERY)

    def every_on(self, variant: str) -> tuple[Patch, ...]:
        """The EVERY patches applied on top of ``variant``: those for every variant, and those ``on`` a
        variant whose patch ``variant`` carries."""
        return self._every_over(self.own_prefix(variant))

    def _every_over(self, own: tuple[Patch, ...]) -> tuple[Patch, ...]:
        names = {p.name for p in own}
        return tuple(p for p in self.every if p.on is None or self._maker(p.on).name in names)

    def _maker(self, variant: str) -> Patch:
        return next(p for p in self.own if p.variant == variant)

    @property
    def chain(self) -> tuple[Patch, ...]:
        """The own patches every later variant carries: own, less the patches of variants aside."""
        return tuple(p for p in self.own if not p.aside)

    def prefix(self, variant: str) -> tuple[Patch, ...]:
        """The patches that make up a variant, in the order they apply: its :meth:`own_prefix`, then the
        EVERY patches applied on it (:meth:`every_on`)."""
        own = self.own_prefix(variant)
        return own + self._every_over(own)

    def own_prefix(self, variant: str) -> tuple[Patch, ...]:
        """The variant's prefix of the series' own patches, less the variants aside before it."""
        own = self.own
        if variant == BASELINE:
            return ()
        for i, patch in enumerate(own):
            if patch.variant == variant:
                return tuple(p for p in own[:i] if not p.aside) + (patch,)
        known = ", ".join(self.variants)
        raise PatchError(f"unknown variant {variant!r} (this series has: {known})")

    def role(self, variant: str) -> Role:
        """What the variant is judged as: its series line's role."""
        own = [p for p in self.own if p.variant == variant]
        if not own or variant == CARRIED:
            raise PatchError(f"variant {variant!r} is not made by a patch of this series")
        return own[0].role

    def adds(self, variant: str, path: str) -> bool:
        """Whether the variant's patches create the file at path (a test the series brings)."""
        return any(f.path == path and f.new_file for patch in self.prefix(variant) for f in patch.files)

    def changes(self, variant: str, path: str) -> bool:
        """Whether the variant's patches change the file at path (relative to the tree root)."""
        return any(path in patch.touched for patch in self.prefix(variant))

    @property
    def touched(self) -> list[str]:
        seen: dict[str, None] = {}
        for patch in self.patches:
            for path in patch.touched:
                seen.setdefault(path, None)
        return list(seen)


def load_series(directory: Path) -> Series:
    directory = Path(directory)
    series_file = directory / "series"
    if not series_file.is_file():
        raise PatchError(f"{series_file}: no series file (one '<patch> <variant>' per line)")
    patches: list[Patch] = []
    names = {BASELINE}
    for lineno, raw in enumerate(series_file.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        aside = len(parts) > 2 and parts[-1] == ASIDE
        parts = parts[:-1] if aside else parts
        if len(parts) not in (2, 3) or (aside and parts[1] in (EVERY, CARRIED)):
            raise PatchError(
                f"{series_file}:{lineno}: expected '<patch file> <variant name> [<role>] [{ASIDE}]' "
                f"({ASIDE} only for a patch that makes a variant) or '<patch file> {EVERY} [<variant name>]', "
                f"got {raw!r}"
            )
        on = _on_variant(parts, names, f"{series_file}:{lineno}")
        parts = parts[:2] if on else parts
        filename, variant, role = (*parts, Role.TWIN.value) if len(parts) == 2 else parts
        if role in RETIRED_ROLES:
            raise PatchError(f"{series_file}:{lineno}: role {role!r} is now '{RETIRED_ROLES[role]}'")
        if role not in {r.value for r in Role} or (variant in (EVERY, CARRIED) and len(parts) == 3):
            raise PatchError(
                f"{series_file}:{lineno}: bad role {role!r} "
                f"(one of {', '.join(Role)}, for a patch that makes a variant)"
            )
        if variant not in (EVERY, CARRIED) and (not _NAME_RE.match(variant) or variant in ("all", ASIDE)):
            raise PatchError(
                f"{series_file}:{lineno}: bad variant name {variant!r} (lower-case letters, digits, '-'; "
                f"{EVERY} for a patch applied to every variant, or {CARRIED} for one every later variant carries)"
            )
        if variant in names:
            raise PatchError(f"{series_file}:{lineno}: variant name {variant!r} used twice")
        if variant not in (EVERY, CARRIED):
            names.add(variant)
        path = directory / filename
        if not path.is_file():
            raise PatchError(f"{series_file}:{lineno}: patch {filename} not found in {directory}")
        data = path.read_bytes()
        patches.append(
            Patch(
                filename,
                variant,
                sha256_bytes(data),
                parse_patch(data.decode("utf-8"), filename),
                Role(role),
                aside,
                on,
            )
        )
    return Series(directory, tuple(patches))


def _on_variant(parts: list[str], names: set[str], where: str) -> str | None:
    """The variant an EVERY line is applied on (its third column), checked to be one made above it."""
    if len(parts) != 3 or parts[1] != EVERY:
        return None
    on = parts[2]
    if on == BASELINE or on not in names:
        made = ", ".join(sorted(names - {BASELINE})) or "none"
        raise PatchError(
            f"{where}: '{EVERY} {on}' names no variant made above this line (made so far: {made}); "
            f"a '{EVERY}' line's third column is the variant it is applied on, with those that carry it"
        )
    return on


def parse_patch(text: str, name: str) -> tuple[FilePatch, ...]:
    """Parse the diff part of a (git format-)patch; the mail header and diffstat are skipped."""
    lines = text.split("\n")
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = lines[i][4:].split("\t")[0].strip()
            new = lines[i + 1][4:].split("\t")[0].strip()
            if new == "/dev/null":
                raise PatchError(f"{name}: deleting {old} is not supported")
            path = new[2:] if new.startswith("b/") else new
            i += 2
            hunks: list[Hunk] = []
            while i < len(lines) and lines[i].startswith("@@"):
                hunk, i = _parse_hunk(lines, i, name, path)
                hunks.append(hunk)
            if not hunks:
                raise PatchError(f"{name}: {path}: no hunks")
            files.append(FilePatch(path, old == "/dev/null", tuple(hunks)))
        else:
            i += 1
    if not files:
        raise PatchError(f"{name}: no unified diff found")
    return tuple(files)


def _parse_hunk(lines: list[str], i: int, name: str, path: str) -> tuple[Hunk, int]:
    raw = read_hunk(lines, i, f"{name}: {path}")
    old: list[str] = []
    new: list[str] = []
    old_no_eol = new_no_eol = False
    last = " "
    for tag, body in raw.lines:
        if tag == NO_EOL:
            old_no_eol |= last in " -"
            new_no_eol |= last in " +"
        else:
            if tag in " -":
                old.append(body)
            if tag in " +":
                new.append(body)
        last = tag
    return Hunk(raw.header, raw.old_start, old, new, old_no_eol, new_no_eol), raw.end


def apply_file_patch(content: str | None, fp: FilePatch, patch_name: str, max_offset: int = 2000) -> str:
    """Apply one file's hunks to its text; raise PatchError naming patch, file and hunk."""
    if content is None:
        if not fp.new_file:
            raise PatchError(f"{patch_name}: {fp.path}: file not found in the tree")
        content = ""
    ends_with_eol = content.endswith("\n") or content == ""
    lines = split_lines(content)
    no_eol = not ends_with_eol
    for at, hunk in each_hunk(lines, fp, patch_name, max_offset):
        lines[at : at + len(hunk.old_lines)] = hunk.new_lines
        if at + len(hunk.new_lines) == len(lines):
            no_eol = hunk.new_no_eol
    text = "\n".join(lines)
    return text if no_eol or not lines else text + "\n"


def split_lines(content: str) -> list[str]:
    """A file's lines without their ends (the last line's end, if any, makes no empty line)."""
    lines = content.split("\n")
    if content.endswith("\n") or content == "":
        lines.pop()
    return lines


def each_hunk(lines: list[str], fp: FilePatch, patch_name: str, max_offset: int = 2000) -> Iterator[tuple[int, Hunk]]:
    """Each hunk of ``fp`` with the line of ``lines`` it applies at, found as ``git apply`` finds it (exact
    context, moved by up to ``max_offset`` lines); the caller splices each into ``lines`` before the next.
    PatchError names the patch, the file and the hunk that does not apply."""
    delta = 0
    for number, hunk in enumerate(fp.hunks, 1):
        expected = max(hunk.old_start - 1, 0) + delta if hunk.old_lines else hunk.old_start + delta
        at = _find(lines, hunk.old_lines, expected, max_offset)
        if at is None:
            raise PatchError(
                f"{patch_name}: {fp.path}: hunk #{number} ({hunk.header}) does not apply "
                f"(its context was not found near line {hunk.old_start})"
            )
        yield at, hunk
        delta += len(hunk.new_lines) - len(hunk.old_lines)


def _find(lines: list[str], needle: list[str], expected: int, max_offset: int) -> int | None:
    n = len(needle)
    if n == 0:
        return min(max(expected, 0), len(lines))
    for offset in range(max_offset + 1):
        for at in (expected + offset, expected - offset) if offset else (expected,):
            if 0 <= at <= len(lines) - n and lines[at : at + n] == needle:
                return at
    return None


def apply_series(read: callable, patches: tuple[Patch, ...]) -> dict[str, str]:
    """Contents of every file the patches touch, after applying them in order.

    ``read(path)`` returns a pristine file's text, or None when it does not exist.
    """
    contents: dict[str, str | None] = {}
    for patch in patches:
        for fp in patch.files:
            if fp.path not in contents:
                contents[fp.path] = read(fp.path)
            contents[fp.path] = apply_file_patch(contents[fp.path], fp, patch.name)
    return {path: text for path, text in contents.items() if text is not None}


def diff_files(read: Callable[[str], str | None], files: Mapping[str, str]) -> str:
    """The unified diff, 3 lines of context, that turns each of ``files`` (path -> text) from what ``read(path)``
    gives, in path order: the diff of a patch :func:`parse_patch` reads, a file ``read`` has none of (None)
    created from /dev/null. A file the same on both sides adds nothing."""
    diff: list[str] = []
    for path in sorted(files):
        old = read(path)
        diff += difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            files[path].splitlines(keepends=True),
            "/dev/null" if old is None else f"a/{path}",
            f"b/{path}",
            n=3,
        )
    return "".join(diff)


def check_series(series: Series, tree: Path) -> list[str]:
    """Dry-run every variant's patches against a tree; returns one line per patch."""
    report = []
    for variant in series.variants:
        apply_series(tree_reader(tree), series.prefix(variant))
    for patch in series.patches:
        report.append(f"{patch.name}: applies ({', '.join(patch.touched)}) -> {_where(patch)}")
    return report


def _where(patch: Patch) -> str:
    """Which variants a patch reaches, in words."""
    if patch.variant == EVERY:
        on = f"variant {patch.on} and every variant that carries it" if patch.on else "every variant"
        return f"{on}, on top of its own patches"
    if patch.variant == CARRIED:
        return "carried by every later variant"
    return f"variant {patch.variant}" + (", aside: no later variant carries it" if patch.aside else "")


def tree_reader(root: Path) -> Callable[[str], str | None]:
    """The ``read`` that apply_series takes, over a tree: a file's text, None where there is none."""

    def read(rel: str) -> str | None:
        path = root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return read
