"""develop and write-back: the series as commits of a git work tree, and back, byte for byte.

The tests marked slow copy and commit the pinned source (about 180 MB, some seconds, once for the
module) and work on the project's own series; they build nothing. The others use a tiny source
tree and a series of their own.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyllama_dflash import command
from pyllama_dflash.files import sha256_file
from pyllama_dflash.lab.develop import DevelopError, align, mailpatch, writeback
from pyllama_dflash.lab.develop import __main__ as develop_cli
from pyllama_dflash.lab.develop.tree import develop, make_tree, read_meta
from pyllama_dflash.lab.develop.writeback import __main__ as writeback_cli
from pyllama_dflash.product.llamabuild.patchset import apply_series, load_series, tree_reader
from pyllama_dflash.product.llamabuild.source import resolve
from pyllama_dflash.words import Role

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"
SERIES = load_series(PATCHES)
LAST = SERIES.variants[-1]  # the variant that carries every patch
# the last variant judged against the twin (slots): its patches' added lines are edited in its tree, which
# holds them all (0007, aside, takes out 0004's path, and 0008 moves a few lines of 0001's and 0005's)
TWIN_FIX = next(v for v in reversed(SERIES.variants[1:]) if SERIES.role(v) == Role.TWIN)
# (variant, index): each patch edited in the tree of the last variant that still holds its lines
EDITS = [(TWIN_FIX, i) for i in range(len(SERIES.prefix(TWIN_FIX)))] + [
    (LAST, i) for i, p in enumerate(SERIES.prefix(LAST)) if p not in SERIES.prefix(TWIN_FIX)
]
IDENTITY = {
    "GIT_AUTHOR_NAME": "tester",
    "GIT_AUTHOR_EMAIL": "tester@example.invalid",
    "GIT_COMMITTER_NAME": "tester",
    "GIT_COMMITTER_EMAIL": "tester@example.invalid",
}


def git(tree: Path, *args: str, **env: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=tree, capture_output=True, text=True, env={**os.environ, **IDENTITY, **env}
    )
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def commits(tree: Path) -> list[str]:
    return git(tree, "rev-list", "--reverse", "pristine..HEAD").split()


def fold_into(tree: Path, commit: str) -> None:
    """Commit what is edited as a fixup of commit, and squash it in (what docs/changing-the-fix.md says)."""
    git(tree, "commit", "-q", "-a", f"--fixup={commit}")
    git(tree, "rebase", "-q", "-i", "--autosquash", "pristine", GIT_SEQUENCE_EDITOR=":")


# ---- the project's series, on a copy of the pinned source -------------------------------------


@pytest.fixture(scope="module")
def pristine() -> Path:
    """The pinned source the builds read, found (or fetched) as they find it; nothing is built."""
    return resolve(log=lambda _msg: None).path


@pytest.fixture(scope="module")
def developed(pristine: Path, tmp_path_factory: pytest.TempPathFactory):
    return develop(LAST, tmp_path_factory.mktemp("develop") / "tree", PATCHES)


@pytest.fixture
def tree(developed) -> Path:
    """The work tree, put back as develop left it after the test."""
    yield from _restored(developed)


@pytest.fixture(scope="module")
def developed_fix(pristine: Path, tmp_path_factory: pytest.TempPathFactory):
    return develop(TWIN_FIX, tmp_path_factory.mktemp("develop-fix") / "tree", PATCHES)


def _restored(developed):
    head = git(developed.tree, "rev-parse", "HEAD").strip()
    meta = read_meta(developed.tree)
    yield developed.tree
    git(developed.tree, "reset", "-q", "--hard", head)
    git(developed.tree, "clean", "-q", "-f", "-d")
    writeback.write_meta(developed.tree, meta)


@pytest.fixture
def patches_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "patches"
    shutil.copytree(PATCHES, dest)
    return dest


@pytest.mark.slow
def test_the_tree_holds_the_pristine_commit_then_one_commit_per_patch(developed, pristine):
    tree = developed.tree
    prefix = SERIES.prefix(LAST)
    assert [p.name for p in prefix][-1] == SERIES.every[-1].name  # the * patches come last, as applied
    shas = commits(tree)
    assert len(shas) == len(prefix) and [c for c, _, _ in developed.commits] == shas
    for sha, patch in zip(shas, prefix, strict=True):
        mp = mailpatch.parse((PATCHES / patch.name).read_text(), patch.name)
        message = git(tree, "log", "-1", "--format=%B", sha)
        assert message.startswith(mp.summary + "\n\n" + mp.body), patch.name  # no [PATCH n/m]
        assert git(tree, "log", "-1", "--format=%an <%ae>", sha).strip() == mp.header("From")
        touched = git(tree, "diff", "--name-only", f"{sha}^", sha).split()
        assert sorted(touched) == sorted(patch.touched), patch.name
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip() == LAST
    assert git(tree, "status", "--porcelain") == ""
    # the tree holds what the build stages for the variant
    for rel, text in apply_series(tree_reader(pristine), prefix).items():
        assert (tree / rel).read_text() == text, rel
    # and the pristine commit holds the pristine tree
    assert git(tree, "diff", "--stat", "pristine", "HEAD", "--", *SERIES.touched) != ""
    assert git(tree, "show", "pristine:common/speculative.cpp") == (pristine / "common/speculative.cpp").read_text()
    assert "write-back" in develop_cli.next_steps(developed)


@pytest.mark.slow
def test_the_tree_is_a_copy_with_no_link_into_the_source_cache(developed, pristine):
    tree = developed.tree
    n = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            assert not path.is_symlink(), path
            assert st.st_nlink == 1, path  # no hard link, to the cache or anywhere
            twin = pristine / path.relative_to(tree)
            if twin.exists():
                assert (st.st_dev, st.st_ino) != (twin.stat().st_dev, twin.stat().st_ino), path
            n += 1
    assert n >= sum(1 for p in pristine.rglob("*") if p.is_file())
    # writing into the tree leaves the pristine file as it was
    rel = "common/speculative.cpp"
    before = sha256_file(pristine / rel)
    with open(tree / rel, "a") as f:
        f.write("// scribble\n")
    try:
        assert sha256_file(pristine / rel) == before
    finally:
        git(tree, "checkout", "--", rel)


@pytest.mark.slow
def test_write_back_with_no_edit_gives_every_patch_back_byte_for_byte(tree, patches_copy, capsys):
    stamps = {p.name: p.stat().st_mtime_ns for p in patches_copy.glob("*.patch")}
    outcomes = writeback.write_back(tree, patches_copy)
    assert [o.name for o in outcomes] == [p.name for p in SERIES.prefix(LAST)]
    assert not any(o.changed for o in outcomes)
    for p in PATCHES.iterdir():
        assert (patches_copy / p.name).read_bytes() == p.read_bytes(), p.name
        if p.suffix == ".patch":
            assert (patches_copy / p.name).stat().st_mtime_ns == stamps[p.name], f"{p.name} was rewritten"
    # the command says so
    assert writeback_cli.main(["--dir", str(tree), "--patches", str(patches_copy), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count(": unchanged (commit ") == len(outcomes), out


@pytest.mark.slow
def test_the_diff_writer_writes_each_patch_of_the_series_as_it_is(tree):
    """The series' patches come from diff -u, git diff and difflib, which place a change among
    equal lines each its own way: the alignment a patch's hunks give, written again, is the patch.
    And the diffstat is git format-patch's."""
    parent = "pristine"
    for sha, patch in zip(commits(tree), SERIES.prefix(LAST), strict=True):
        mp = mailpatch.parse((PATCHES / patch.name).read_text(), patch.name)
        for section in mp.sections:
            before = subprocess.run(
                ["git", "cat-file", "blob", f"{parent}:{section.path}"], cwd=tree, capture_output=True, text=True
            ).stdout
            after, m = align.from_hunks(section.text, mailpatch.lines_of(before), patch.name)
            assert "".join(after) == git(tree, "cat-file", "blob", f"{sha}:{section.path}")
            header = "".join(mailpatch.lines_of(section.text)[:2])
            assert header + align.unified(mailpatch.lines_of(before), after, m) == section.text, section.path
        assert mailpatch.diffstat(mp.sections) == git(tree, "diff", "--stat=72", parent, sha) + "\n"
        parent = sha


def _an_added_line(patch_name: str, tree: Path, sha: str) -> tuple[str, str]:
    """A line the patch adds that appears once in the patch, once in its commit's file and once in
    the tree's, amid the same lines in both (so that a fixup folds into the commit without a
    conflict); a comment where there is one."""
    mp = mailpatch.parse((PATCHES / patch_name).read_text(), patch_name)
    found = []
    for section in mp.sections:
        head = (tree / section.path).read_text().split("\n")
        at_commit = git(tree, "cat-file", "blob", f"{sha}:{section.path}").split("\n")
        for line in section.text.split("\n"):
            body = line[1:]
            if not line.startswith("+") or len(body.strip()) < 8 or body.endswith("\\"):
                continue
            if section.text.count(line + "\n") != 1 or head.count(body) != 1 or at_commit.count(body) != 1:
                continue
            i, j = at_commit.index(body), head.index(body)
            if at_commit[max(i - 4, 0) : i + 5] == head[max(j - 4, 0) : j + 5]:
                found.append((not body.strip().startswith("//"), section.path, body))
    assert found, f"{patch_name}: no added line to edit"
    _, rel, body = min(found)
    return rel, body


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "index"), EDITS)
def test_an_edit_folded_into_its_commit_changes_that_patch_and_that_line_only(request, patches_copy, variant, index):
    """A line a patch adds, changed in the tree and folded into the patch's commit (a fixup and an
    autosquash rebase, or an amend for the last): that line of that patch changes, and nothing
    else, in that patch or another (the patches written by other diff tools than git's included)."""
    developed = request.getfixturevalue("developed" if variant == LAST else "developed_fix")
    restore = _restored(developed)
    tree = next(restore)
    request.addfinalizer(lambda: next(restore, None))
    patch = SERIES.prefix(variant)[index]
    sha = commits(tree)[index]
    rel, line = _an_added_line(patch.name, tree, sha)
    edited = line + " // edited"
    path = tree / rel
    path.write_text(path.read_text().replace(line + "\n", edited + "\n"))
    if index == len(commits(tree)) - 1:
        git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    else:
        fold_into(tree, sha)
    # an edit in slots' tree of a line a later patch rewrites or reads as context (0007's, 0008's) would
    # stop it applying: write-back refuses it
    # (test_a_change_that_breaks_a_later_variant_is_refused_unless_forced); forced here, the round trip is the point
    outcomes = writeback.write_back(tree, patches_copy, force=variant != LAST)
    assert [o.name for o in outcomes if o.changed] == [patch.name]
    for p in PATCHES.glob("*.patch"):
        expected = p.read_text()
        if p.name == patch.name:
            expected = expected.replace("+" + line + "\n", "+" + edited + "\n", 1)
        assert (patches_copy / p.name).read_text() == expected, p.name


@pytest.mark.slow
def test_a_reworded_message_changes_the_header_and_keeps_the_patch_form(tree, patches_copy):
    last = SERIES.prefix(LAST)[-1]
    mp = mailpatch.parse((PATCHES / last.name).read_text(), last.name)
    git(tree, "commit", "-q", "--amend", "-m", "tests : a new summary", "-m", "A new body.")
    (outcome,) = [o for o in writeback.write_back(tree, patches_copy) if o.changed]
    assert outcome.name == last.name
    new = mailpatch.parse(outcome.new, last.name)
    assert new.header("Subject") == f"{mp.prefix}tests : a new summary" and new.body == "A new body.\n"
    assert (new.diff, new.stat, new.trailer, new.gap) == (mp.diff, mp.stat, mp.trailer, mp.gap)


def _develop(*args: str) -> int:
    """develop as the console command runs it (command.py): its error line, its exit code."""
    return command.run(develop_cli.main, args, prog=command.name_prog("develop"))


def _write_back(*args: str) -> int:
    return command.run(writeback_cli.main, args, prog=command.name_prog("write-back"))


def test_develop_refuses_a_folder_that_is_not_empty_and_an_unknown_variant(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine\n")
    assert _develop(LAST, "--dir", str(taken), "--patches", str(PATCHES)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyllama-dflash develop: error: {taken}: already exists and is not empty"), err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert _develop("nope", "--dir", str(tmp_path / "x"), "--patches", str(PATCHES)) == 2
    err = capsys.readouterr().err
    assert "pyllama-dflash develop: error: unknown variant 'nope'" in err and LAST in err, err
    assert not (tmp_path / "x").exists()


def test_write_back_refuses_a_folder_develop_did_not_make(tmp_path, capsys):
    assert _write_back("--dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"pyllama-dflash write-back: error: {tmp_path}: not a work tree made by pyllama-dflash develop"
    ), err


# ---- a tiny series, on a tiny tree --------------------------------------------------------------

LINES = "".join(f"line {i}\n" for i in range(1, 41))


def _diff(path: str, old: str | None, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(True),
            new.splitlines(True),
            f"a/{path}" if old is not None else "/dev/null",
            f"b/{path}",
        )
    )


@pytest.fixture
def tiny(tmp_path: Path):
    """A source tree, a series (two variants and a * patch, listed first) and its work tree."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text(LINES)
    one = LINES.replace("line 5\n", "line five\n")
    two = one.replace("line 30\n", "line thirty\nline 30.5\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-one.patch").write_text(
        "From: A U Thor <a@example.invalid>\nSubject: [PATCH 1/2] one : five\n\nThe first.\n\n---\n"
        + mailpatch.diffstat([mailpatch.Section("f.txt", "", 1, 1)])
        + _diff("f.txt", LINES, one)
        + "-- \ntiny\n"
    )
    (patches / "0002-two.patch").write_text(
        "From: A U Thor <a@example.invalid>\nSubject: [PATCH 2/2] two : thirty\n\nThe second.\n---\n"
        + _diff("f.txt", one, two)
    )
    (patches / "0003-test.patch").write_text("Subject: [PATCH] a test\n\n---\n" + _diff("t.txt", None, "test\n"))
    (patches / "series").write_text("0003-test.patch *\n0001-one.patch one\n0002-two.patch two\n")
    series = load_series(patches)
    made = make_tree(src, series, "two", tmp_path / "dev", "tiny")
    return made.tree, patches


def test_tiny_commits_follow_the_apply_order_and_come_back_unchanged(tiny):
    tree, patches = tiny
    names = [o.name for o in writeback.write_back(tree)]
    assert names == ["0001-one.patch", "0002-two.patch", "0003-test.patch"]
    assert git(tree, "log", "--format=%s", "pristine..HEAD").split("\n")[:3] == ["a test", "two : thirty", "one : five"]
    assert git(tree, "log", "-1", "--format=%an <%ae>", commits(tree)[0]).strip() == "A U Thor <a@example.invalid>"


def test_an_edit_of_an_earlier_patch_moves_the_later_one_by_its_line_numbers_only(tiny):
    tree, patches = tiny
    old = {p.name: p.read_text() for p in patches.glob("*.patch")}
    first = commits(tree)[0]
    (tree / "f.txt").write_text((tree / "f.txt").read_text().replace("line 2\n", "line 2\nline 2.5\n"))
    fold_into(tree, first)
    changed = [o.name for o in writeback.write_back(tree) if o.changed]
    assert changed == ["0001-one.patch", "0002-two.patch"]
    new = {p.name: p.read_text() for p in patches.glob("*.patch")}
    # the first: its hunk grows, its diffstat is written anew (git's), header, body and trailer stay
    assert "+line 2.5\n" in new["0001-one.patch"] and new["0001-one.patch"].endswith("-- \ntiny\n")
    assert " f.txt | 3 ++-\n 1 file changed, 2 insertions(+), 1 deletion(-)\n" in new["0001-one.patch"]
    # the second: one line further down, nothing else
    assert new["0002-two.patch"] == old["0002-two.patch"].replace("@@ -27,7 +27,8 @@", "@@ -28,7 +28,8 @@")
    assert new["0003-test.patch"] == old["0003-test.patch"]
    # written back, the series still builds the tree: the tree's files are what it gives
    contents = apply_series(tree_reader(tree.parent / "src"), load_series(patches).prefix("two"))
    assert contents == {"f.txt": (tree / "f.txt").read_text(), "t.txt": "test\n"}


def test_uncommitted_changes_are_refused_naming_the_folder(tiny, capsys):
    tree, patches = tiny
    before = {p.name: p.read_bytes() for p in patches.iterdir()}
    (tree / "f.txt").write_text("edited\n")
    assert _write_back("--dir", str(tree)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyllama-dflash write-back: error: {tree}: uncommitted changes (M f.txt)"), err
    git(tree, "checkout", "--", "f.txt")
    (tree / "new.txt").write_text("untracked\n")
    with pytest.raises(DevelopError, match=r"uncommitted changes \(\?\? new.txt\)"):
        writeback.write_back(tree)
    assert {p.name: p.read_bytes() for p in patches.iterdir()} == before


def test_one_commit_per_patch_is_required(tiny):
    tree, _ = tiny
    (tree / "f.txt").write_text((tree / "f.txt").read_text() + "more\n")
    git(tree, "commit", "-q", "-a", "-m", "an extra commit")
    with pytest.raises(DevelopError, match=r"4 commit\(s\) above the pristine commit, but variant two has 3"):
        writeback.write_back(tree)
    git(tree, "reset", "-q", "--hard", "HEAD~2")
    with pytest.raises(DevelopError, match=r"2 commit\(s\) above the pristine commit"):
        writeback.write_back(tree)


def test_a_patch_changed_on_disk_since_develop_is_not_overwritten_unless_forced(tiny):
    tree, patches = tiny
    theirs = patches / "0002-two.patch"
    theirs.write_text(theirs.read_text().replace("The second.", "Someone else's change."))
    with pytest.raises(DevelopError, match=r"0002-two.patch: changed since the work tree was made"):
        writeback.write_back(tree)
    assert "Someone else's change." in theirs.read_text()
    (outcome,) = [o for o in writeback.write_back(tree, force=True) if o.changed]
    assert outcome.name == "0002-two.patch" and "The second." in theirs.read_text()
    assert not any(o.changed for o in writeback.write_back(tree))  # the record follows what was written


def test_a_change_that_breaks_a_later_variant_is_refused_unless_forced(tiny, tmp_path):
    _, patches = tiny
    made = make_tree(tmp_path / "src", load_series(patches), "one", tmp_path / "dev-one", "tiny")
    (made.tree / "f.txt").write_text(made.tree.joinpath("f.txt").read_text().replace("line 29\n", "line 29!\n"))
    fold_into(made.tree, commits(made.tree)[0])
    before = (patches / "0001-one.patch").read_text()
    with pytest.raises(DevelopError, match=r"variant two no longer applies.*0002-two.patch"):
        writeback.write_back(made.tree)
    assert (patches / "0001-one.patch").read_text() == before
    warnings = []
    writeback.write_back(made.tree, force=True, log=warnings.append)
    assert "+line 29!\n" in (patches / "0001-one.patch").read_text() and "variant two" in warnings[0]


def test_a_commit_that_deletes_a_file_is_refused(tiny):
    tree, _ = tiny
    git(tree, "rm", "-q", "f.txt")
    git(tree, "commit", "-q", "--amend", "--no-edit")
    with pytest.raises(DevelopError, match=r"deletes f.txt"):
        writeback.write_back(tree)


def test_write_back_finds_the_tree_it_runs_in_or_beside(tiny, monkeypatch):
    tree, _ = tiny
    monkeypatch.chdir(tree)
    assert writeback.find_tree() == tree
    moved = tree.rename(tree.parent / "llama.cpp-dev-two")  # a git work tree moves with its folder
    monkeypatch.chdir(moved.parent)
    assert writeback.find_tree() == moved
    assert not any(o.changed for o in writeback.write_back(writeback.find_tree()))


def test_the_commands_are_registered():
    from pyllama_dflash import cli

    for name in ("develop", "write-back"):
        module = __import__(cli.TOOLS[name][0], fromlist=["main"])
        assert callable(module.main)
