"""``write-back``: the commits of a develop work tree, back into the series' patch files (the
command, ``pyllama-dflash write-back``, is ``__main__.py``).

Commit k above the ``pristine`` commit becomes patch k of the variant (the order develop made
them in). Each patch keeps its file name and its own form: the ``[PATCH n/m]`` of its subject,
the blank lines around its body, its diffstat, its trailer. What the commit says replaces the
rest: the summary and body of its message, its author, its diff. A file's part of the diff is
kept byte for byte when it still describes the commit exactly (the file before and after the
commit is what the patch on disk gives, or the patch applied at its stated lines turns the one
into the other); otherwise it is written anew with ``git diff`` (myers, 3 lines of context, no
function names in the ``@@`` lines, no ``diff --git``/``index`` lines). The diffstat is written
anew, as git format-patch does, only where a file or a count of lines changed. So a write-back
with nothing edited gives every patch back unchanged, and an edit changes its own patch only.

Before anything is written, the new patches are checked: applied from the pristine commit as the
build applies them, each must give its commit's files, and every variant of the series must
still apply. Each file is written atomically; a patch whose text did not change is not written.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ....errors import PatchError
from ....files import atomic_path, default_file_mode, sha256_bytes
from ....product.llamabuild.patchset import (
    FilePatch,
    Patch,
    Series,
    apply_file_patch,
    load_series,
    parse_patch,
)
from .. import align, mailpatch
from ..git import DevelopError, git, run_git
from ..tree import read_meta, write_meta

Log = Callable[[str], None]

# pinned, whatever the user's git configuration says: the form of the series' diffs
_DIFF_CONFIG = [
    "-c",
    "core.quotePath=false",
    "-c",
    "diff.suppressBlankEmpty=false",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.relative=false",
]
_DIFF_FLAGS = [
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--text",
    "-U3",
    "--inter-hunk-context=0",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]
_FUNC_CONTEXT_RE = re.compile(r"^(@@ -\S+ \+\S+ @@).*$")
_EXTENDED = ("diff --git ", "index ", "new file mode ", "old mode ", "new mode ")


@dataclass(frozen=True)
class Outcome:
    name: str
    commit: str
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


def find_tree(start: Path | None = None) -> Path:
    """The work tree write-back works on when --dir is not given: the one the current folder is in,
    else the one llama.cpp-dev-* folder under it."""
    here = Path(start or Path.cwd()).absolute()
    proc = run_git(["rev-parse", "--show-toplevel"], here, ok=(0, 128))
    if proc.returncode == 0:
        top = Path(proc.stdout.decode().strip())
        try:
            read_meta(top)
            return top
        except DevelopError:
            pass
    found = []
    for candidate in sorted(here.glob("llama.cpp-dev-*")):
        try:
            read_meta(candidate)
            found.append(candidate)
        except DevelopError:
            continue
    if len(found) == 1:
        return found[0]
    if not found:
        raise DevelopError(
            f"{here}: neither in a work tree made by develop nor beside one (llama.cpp-dev-*); pass --dir"
        )
    raise DevelopError(f"{here}: several work trees made by develop ({', '.join(p.name for p in found)}); pass --dir")


def write_back(
    tree: Path,
    patches_dir: Path | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    log: Log = lambda _msg: None,
) -> list[Outcome]:
    """Check the tree against the series it was made from, rewrite each commit as its patch, check the
    new patches, and write those that changed (the module's docstring); the outcome of each patch."""
    tree = Path(tree).absolute()
    meta = read_meta(tree)
    _check_state(tree)
    target = Path(patches_dir if patches_dir is not None else meta["patches_dir"]).absolute()
    series = load_series(target)
    prefix = _prefix(tree, target, series, meta)
    commits = _commits(tree, meta["base"])
    if len(commits) != len(prefix):
        listing = "; ".join(f"{i}: {p.name}" for i, p in enumerate(prefix, 1))
        raise DevelopError(
            f"{tree}: {len(commits)} commit(s) above the pristine commit, but variant {meta['variant']} has "
            f"{len(prefix)} patch(es) ({listing}); keep one commit per patch, in that order: fold a change "
            f"into its patch's commit (git commit --fixup=COMMIT, then git rebase -i --autosquash pristine)"
        )
    if not force:
        _check_unchanged_on_disk(target, meta)

    rewriter = _Rewriter(tree, target, meta["base"])
    outcomes = []
    new_patches: dict[str, Patch] = {}
    parent = meta["base"]
    for commit, patch in zip(commits, prefix, strict=True):
        outcome, new_patches[patch.name] = rewriter.rewrite(parent, commit, patch)
        outcomes.append(outcome)
        parent = commit

    broken = _broken_variants(series, new_patches, rewriter.reader, meta["base"])
    if broken and not force:
        raise DevelopError(
            f"{tree}: with these patches, {'; '.join(broken)}. Develop the variant that carries them all "
            f"(pyllama-dflash develop {series.variants[-1]}) and make the change there, or pass --force; "
            "nothing was written"
        )
    for line in broken:
        log(f"write-back: warning: {line}")
    if not dry_run:
        _publish(tree, target, meta, outcomes)
    return outcomes


def _prefix(tree: Path, target: Path, series: Series, meta: dict) -> tuple[Patch, ...]:
    """The patches of the tree's variant, as the series has them: the ones the tree was made with."""
    variant = meta["variant"]
    try:
        prefix = series.prefix(variant)
    except PatchError as e:
        raise DevelopError(f"{target}: the series no longer has the variant {tree} was made for ({e})") from None
    recorded = [p["name"] for p in meta["patches"]]
    if [p.name for p in prefix] != recorded:
        raise DevelopError(
            f"{target}/series: variant {variant} is now {', '.join(p.name for p in prefix) or 'no patch'}; "
            f"{tree} was made with {', '.join(recorded) or 'no patch'}: make a new work tree with develop"
        )
    return prefix


def _publish(tree: Path, target: Path, meta: dict, outcomes: list[Outcome]) -> None:
    """The patches that changed written, and the tree's record of them when it is the tree's series."""
    for out in outcomes:
        if out.changed:
            _write(target / out.name, out.new)
    if target.resolve() == Path(meta["patches_dir"]).resolve():
        shas = {o.name: sha256_bytes(o.new.encode("utf-8")) for o in outcomes}
        meta["patches"] = [{**p, "sha256": shas[p["name"]]} for p in meta["patches"]]
        write_meta(tree, meta)


@dataclass(frozen=True)
class _Step:
    """One commit above its parent, as the patch ``name`` of the series is to carry it."""

    parent: str
    commit: str
    name: str
    touched: list[str]
    before: dict[str, str | None]  # each touched file at the parent
    after: dict[str, str | None]  # and at the commit


class _Rewriter:
    """The commits rewritten as their patches, one after another, keeping the files in order as the
    patches on disk leave them (``old_state``) and as the patches written back leave them (``new_state``)."""

    def __init__(self, tree: Path, target: Path, base: str):
        self.tree, self.target, self.base = tree, target, base
        self.reader = _Reader(tree)
        self.old_state: dict[str, str | None] = {}
        self.new_state: dict[str, str | None] = {}

    def rewrite(self, parent: str, commit: str, patch: Patch) -> tuple[Outcome, Patch]:
        old_text = (self.target / patch.name).read_text(encoding="utf-8")
        mp = mailpatch.parse(old_text, patch.name)
        old_files = {fp.path: fp for fp in parse_patch(old_text, patch.name)}
        touched = _touched(self.tree, parent, commit)
        before, after = {}, {}
        for path in touched:
            before[path] = self.reader.text(parent, path)
            after[path] = self.reader.text(commit, path)
        step = _Step(parent, commit, patch.name, touched, before, after)
        sections = self._sections(step, mp, old_files, *self._old_applied(old_files, patch.name))
        message, author = _message(self.tree, commit)
        new_text = mp.with_message(message, author).with_sections(sections).render()
        files = self._check_new(step, new_text)
        new_patch = replace(patch, sha256=sha256_bytes(new_text.encode()), files=files)  # its role and place kept
        return Outcome(patch.name, commit, old_text, new_text), new_patch

    def _old_applied(self, old_files: dict, name: str) -> tuple[dict, dict]:
        """The patch on disk, applied to the files as the patches on disk before it left them: each of its
        files before and after it (_UNKNOWN where it does not apply)."""
        old_before, old_after = {}, {}
        for path, fp in old_files.items():
            if path not in self.old_state:
                self.old_state[path] = self.reader.pristine(self.base, path)
            old_before[path] = self.old_state[path]
            try:
                self.old_state[path] = apply_file_patch(self.old_state[path], fp, name)
            except PatchError:
                self.old_state[path] = _UNKNOWN
            old_after[path] = self.old_state[path]
        return old_before, old_after

    def _sections(
        self, step: _Step, mp: mailpatch.MailPatch, old_files: dict, old_before: dict, old_after: dict
    ) -> list[mailpatch.Section]:
        """Each touched file's part of the patch: the one on disk kept, carried over the edit, or a git diff."""
        old_sections = {s.path: s for s in mp.sections}
        order = [p for p in old_sections if p in step.touched] + [p for p in step.touched if p not in old_sections]
        before, after = step.before, step.after
        fresh: dict[str, mailpatch.Section] | None = None
        sections = []
        for path in order:
            keep = path in old_sections and (
                (old_before.get(path) == before[path] and old_after.get(path) == after[path])
                or _applies_as_stated(old_files[path], before[path], after[path], step.name)
            )
            if keep:
                sections.append(old_sections[path])
                continue
            carried = None
            if path in old_sections and _UNKNOWN not in (old_before[path], old_after[path]):
                carried = _carried(old_sections[path], old_before[path], before[path], after[path], step.name)
            if carried is None:
                if fresh is None:
                    fresh = _fresh_sections(self.tree, step.parent, step.commit, step.name)
                carried = fresh[path]
            sections.append(carried)
        return sections

    def _check_new(self, step: _Step, new_text: str) -> tuple[FilePatch, ...]:
        """The new patch, applied as the build applies it, must give the commit's files: its files."""
        files = parse_patch(new_text, step.name)
        for fp in files:
            if fp.path not in self.new_state:
                self.new_state[fp.path] = self.reader.pristine(self.base, fp.path)
            self.new_state[fp.path] = apply_file_patch(self.new_state[fp.path], fp, step.name)
            if self.new_state[fp.path] != step.after[fp.path]:
                raise DevelopError(
                    f"{self.tree}: the patch written for commit {step.commit[:12]} ({step.name}) does not give its "
                    f"{fp.path} (a bug in write-back); nothing was written"
                )
        return files


_UNKNOWN = "\0unknown"  # a file the patches on disk did not apply to: never equal to a real one


class _Reader:
    """Files at a commit, cached; ``pristine`` reads them as the build does (universal newlines)."""

    def __init__(self, tree: Path):
        self.tree = tree
        self._cache: dict[tuple[str, str], str | None] = {}

    def text(self, commit: str, path: str) -> str | None:
        key = (commit, path)
        if key not in self._cache:
            proc = run_git(["cat-file", "blob", f"{commit}:{path}"], self.tree, ok=(0, 128))
            if proc.returncode != 0:
                self._cache[key] = None
            else:
                try:
                    self._cache[key] = proc.stdout.decode("utf-8")
                except UnicodeDecodeError:
                    raise DevelopError(f"{self.tree}: {path} at {commit[:12]} is not UTF-8 text") from None
        return self._cache[key]

    def pristine(self, base: str, path: str) -> str | None:
        text = self.text(base, path)
        return None if text is None else text.replace("\r\n", "\n").replace("\r", "\n")


def _check_state(tree: Path) -> None:
    gitdir = Path(git(["rev-parse", "--absolute-git-dir"], tree).decode().strip())
    for marker, what in (
        ("rebase-merge", "a rebase"),
        ("rebase-apply", "a rebase"),
        ("MERGE_HEAD", "a merge"),
        ("CHERRY_PICK_HEAD", "a cherry-pick"),
        ("REVERT_HEAD", "a revert"),
    ):
        if (gitdir / marker).exists():
            raise DevelopError(f"{tree}: {what} is in progress; finish it (or abort it) first")
    status = git(["status", "--porcelain", "--untracked-files=normal"], tree).decode()
    if status.strip():
        lines = status.splitlines()
        shown = "; ".join(line.strip() for line in lines[:8])
        if len(lines) > 8:
            shown += f"; and {len(lines) - 8} more"
        raise DevelopError(
            f"{tree}: uncommitted changes ({shown}); commit them into their patch's commit "
            "(git commit --amend, or --fixup and a rebase) or stash them, then write back"
        )


def _commits(tree: Path, base: str) -> list[str]:
    if run_git(["merge-base", "--is-ancestor", base, "HEAD"], tree, ok=(0, 1)).returncode != 0:
        raise DevelopError(f"{tree}: HEAD does not descend from the pristine commit {base[:12]}")
    merges = git(["rev-list", "--merges", f"{base}..HEAD"], tree).decode().split()
    if merges:
        raise DevelopError(
            f"{tree}: merge commit(s) above the pristine commit ({merges[0][:12]}); keep a linear history"
        )
    return git(["rev-list", "--reverse", f"{base}..HEAD"], tree).decode().split()


def _check_unchanged_on_disk(target: Path, meta: dict) -> None:
    changed = []
    for entry in meta["patches"]:
        path = target / entry["name"]
        if sha256_bytes(path.read_bytes()) != entry["sha256"]:
            changed.append(str(path))
    if changed:
        raise DevelopError(
            f"{', '.join(changed)}: changed since the work tree was made (or last written back); writing back "
            "would undo that change. Make a new work tree with develop, or pass --force to overwrite"
        )


def _touched(tree: Path, parent: str, commit: str) -> list[str]:
    out = git(["diff", "--name-status", "--no-renames", "-z", parent, commit], tree).decode().split("\0")
    fields = [f for f in out if f]
    touched = []
    for status, path in zip(fields[0::2], fields[1::2], strict=True):
        if status == "D":
            raise DevelopError(f"{tree}: commit {commit[:12]} deletes {path}; the series' patches cannot delete a file")
        if status not in ("A", "M"):
            raise DevelopError(f"{tree}: commit {commit[:12]} changes {path} in a way a patch cannot carry ({status})")
        touched.append(path)
    if not touched:
        raise DevelopError(f"{tree}: commit {commit[:12]} changes nothing")
    return touched


def _applies_as_stated(fp, before: str | None, after: str | None, name: str) -> bool:
    """Whether the patch on disk, each hunk at the line it states, turns before into after."""
    try:
        return apply_file_patch(before, fp, name, max_offset=0) == after
    except PatchError:
        return False


def _carried(
    section: mailpatch.Section, old_before: str | None, before: str | None, after: str | None, name: str
) -> mailpatch.Section | None:
    """The patch's part for one file, carried over an edit of the file before or after it: every
    hunk the edit did not reach stays as it was. None where it cannot be (a git diff is used then)."""
    if after is None or (old_before is None) != (before is None):
        return None  # the file is new in one and not in the other
    a_old, a_new, b_new = (mailpatch.lines_of(t or "") for t in (old_before, before, after))
    try:
        b_old, m_old = align.from_hunks(section.text, a_old, name)
    except PatchError:
        return None
    m_a = list(range(len(a_new))) if a_new == a_old else align.between(a_new, a_old)
    m_b = list(range(len(b_new))) if b_old == b_new else align.between(b_old, b_new)
    m = align.compose(align.compose(m_a, m_old), m_b)
    kept_b = {j for j in m_b if j is not None}
    m = align.refine(a_new, b_new, m, {i for i, k in enumerate(m_a) if k is None}, set(range(len(b_new))) - kept_b)
    lines = mailpatch.lines_of(section.text)
    at = next(i for i in range(len(lines) - 1) if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "))
    hunks = align.unified(a_new, b_new, m)
    if not hunks:
        return None
    (carried,), _ = mailpatch.split_sections(mailpatch.lines_of(lines[at] + lines[at + 1] + hunks), 0, name)
    return carried


def _fresh_sections(tree: Path, parent: str, commit: str, name: str) -> dict[str, mailpatch.Section]:
    raw = git([*_DIFF_CONFIG, "diff", *_DIFF_FLAGS, parent, commit], tree).decode("utf-8")
    lines = []
    for line in mailpatch.lines_of(raw):
        if line.startswith(_EXTENDED):
            continue
        if line.startswith("Binary files "):
            raise DevelopError(f"{tree}: commit {commit[:12]}: {line.strip()}; a patch carries text only")
        m = _FUNC_CONTEXT_RE.match(line)
        lines.append(m.group(1) + "\n" if m else line)
    sections, end = mailpatch.split_sections(lines, 0, name)
    if end != len(lines):
        raise DevelopError(f"{tree}: commit {commit[:12]}: git diff printed what a patch cannot carry: {lines[end]!r}")
    return {s.path: s for s in sections}


def _message(tree: Path, commit: str) -> tuple[str, tuple[str, str]]:
    raw = git(["cat-file", "commit", commit], tree).decode("utf-8")
    message = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""
    name, email = git(["log", "-1", "--format=%an%x00%ae", commit], tree).decode("utf-8").rstrip("\n").split("\0")
    return message, (name, email)


def _broken_variants(series: Series, new: dict[str, Patch], reader: _Reader, base: str) -> list[str]:
    patches = tuple(new.get(p.name, p) for p in series.patches)
    updated = Series(series.directory, patches)
    broken = []
    for variant in updated.variants:
        state: dict[str, str | None] = {}
        try:
            for patch in updated.prefix(variant):
                for fp in patch.files:
                    if fp.path not in state:
                        state[fp.path] = reader.pristine(base, fp.path)
                    state[fp.path] = apply_file_patch(state[fp.path], fp, patch.name)
        except PatchError as e:
            broken.append(f"variant {variant} no longer applies ({e})")
    return broken


def _write(path: Path, text: str) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = default_file_mode()
    with atomic_path(path, mode=mode) as tmp, open(tmp, "wb") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
