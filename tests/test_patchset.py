"""The patch series parser and applier (pure Python, no build)."""

from pathlib import Path

import pytest

from pyllama_dflash.errors import PatchError
from pyllama_dflash.product.llamabuild import default_must_pass, prerequisites
from pyllama_dflash.product.llamabuild.patchset import (
    BASELINE,
    CARRIED,
    apply_file_patch,
    apply_series,
    load_series,
    parse_patch,
    tree_reader,
)
from pyllama_dflash.words import Role

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent

PATCH = """\
Subject: [PATCH] demo

---
--- a/f.txt
+++ b/f.txt
@@ -2,3 +2,4 @@
 two
 three
+three and a half
 four
"""


def test_applies_at_the_stated_line():
    text = "one\ntwo\nthree\nfour\nfive\n"
    (fp,) = parse_patch(PATCH, "demo.patch")
    assert apply_file_patch(text, fp, "demo.patch") == "one\ntwo\nthree\nthree and a half\nfour\nfive\n"


def test_applies_when_the_context_moved():
    text = "zero\nzero\nzero\none\ntwo\nthree\nfour\nfive\n"
    (fp,) = parse_patch(PATCH, "demo.patch")
    assert "three\nthree and a half\nfour" in apply_file_patch(text, fp, "demo.patch")


def test_a_hunk_that_does_not_apply_names_patch_file_and_hunk():
    (fp,) = parse_patch(PATCH, "demo.patch")
    with pytest.raises(PatchError) as e:
        apply_file_patch("one\ntwo\nTHREE\nfour\n", fp, "demo.patch")
    msg = str(e.value)
    assert "demo.patch" in msg and "f.txt" in msg and "@@ -2,3 +2,4 @@" in msg and "hunk #1" in msg


def test_missing_newline_at_end_of_file_is_kept():
    patch = (
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    )
    (fp,) = parse_patch(patch, "eol.patch")
    assert apply_file_patch("a\nb", fp, "eol.patch") == "a\nc"


def test_new_file():
    patch = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    (fp,) = parse_patch(patch, "new.patch")
    assert fp.new_file and apply_file_patch(None, fp, "new.patch") == "x\ny\n"


def test_a_truncated_hunk_is_refused():
    with pytest.raises(PatchError, match="truncated"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n", "cut.patch")


def test_series_variants_are_prefixes():
    series = load_series(DATA / "test-patches")
    assert series.variants == [BASELINE, "test-comment"]
    assert series.prefix(BASELINE) == ()
    assert [p.name for p in series.prefix("test-comment")] == ["0001-test-comment.patch"]
    with pytest.raises(PatchError, match="unknown variant 'nope'.*baseline, test-comment"):
        series.prefix("nope")


def test_the_project_series_names_zero_fill_first():
    series = load_series(REPO / "patches")
    assert series.variants[:2] == [BASELINE, "zero-fill"]
    # what each variant is judged as comes from its series line
    assert [series.role(v) for v in series.variants[1:]] == [
        "shown",
        "twin",
        "twin",
        "definition",
        "as-trained",
        "as-trained",
    ]
    # 0001 (EAGLE3's bridge) is a fix of libcommon every variant after it carries, with no column of its own;
    # the fix lives in libcommon's driver; 0005 saves the draft with llama-server's slots; 0007 (the
    # definition for every draft, aside) and 0008 (each draft as trained, on slots) each change both, the
    # header libcommon's callers read, and the prompt cache's entries (which carry the drafter's state with
    # it): llama-server asks the drafter which positions it keeps; 0009 (MTP fed the image) changes
    # libllama's batches and graph input, step35's MTP graph, libcommon's batch and MTP (its test is 0012)
    assert [(p.variant, p.touched) for p in series.own][:1] == [(CARRIED, ["common/speculative.cpp"])]
    own_positions = [
        "common/speculative.cpp",
        "common/speculative.h",
        "tools/server/server-context.cpp",
        "tools/server/server-task.cpp",
        "tools/server/server-task.h",
    ]
    assert [p.touched for p in series.own] == [["common/speculative.cpp"]] * 3 + [
        ["tools/server/server-context.cpp"],
        own_positions,
        own_positions,
        [
            "common/common.cpp",
            "common/common.h",
            "common/speculative.cpp",
            "src/llama-batch.cpp",
            "src/llama-batch.h",
            "src/llama-graph.cpp",
            "src/llama-kv-cache-dsv4.cpp",
            "src/models/step35.cpp",
        ],
    ]
    assert all(series.prefix(v)[0] == series.own[0] for v in series.variants[1:])
    # and the regression tests every variant carries, baseline included: two C++ ones (test_ctest.py) and one
    # of llama-server's kind (test_pulls.py); then 0011, which changes the DFlash test where 0008 is, 0012,
    # MTP's test where 0009 is, 0013, llama-server's test of a slot restored with its draft where 0005 is, and
    # 0014, EAGLE3's cases in 0010's llama-server test where 0008 is
    assert [(p.touched, p.on) for p in series.every] == [
        (["tests/CMakeLists.txt", "tests/test-speculative-eagle3-passes.cpp"], None),
        (["tests/CMakeLists.txt", "tests/test-speculative-dflash-image.cpp"], None),
        (["tools/server/tests/unit/test_speculative_dflash_image.py", "tools/server/tests/utils.py"], None),
        (["tests/test-speculative-dflash-image.cpp"], "as-trained"),
        (["tests/CMakeLists.txt", "tests/test-speculative-mtp-image.cpp"], "mtp-fed-images"),
        (["tools/server/tests/unit/test_speculative_slot_restore.py"], "slots"),
        (["tools/server/tests/unit/test_speculative_dflash_image.py"], "as-trained"),
    ]


def test_a_carried_patch_makes_no_variant_and_goes_into_every_later_one(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH)
    (tmp_path / "b.patch").write_text("--- /dev/null\n+++ b/common/b.cpp\n@@ -0,0 +1 @@\n+int b;\n")
    (tmp_path / "series").write_text("b.patch -\na.patch fix\n")
    series = load_series(tmp_path)
    assert series.variants == [BASELINE, "fix"]
    assert [p.name for p in series.prefix("fix")] == ["b.patch", "a.patch"]
    with pytest.raises(PatchError, match="is not made by a patch"):
        series.role(CARRIED)
    (tmp_path / "series").write_text("b.patch - twin\na.patch fix\n")
    with pytest.raises(PatchError, match="bad role"):
        load_series(tmp_path)


def test_a_variant_aside_carries_what_comes_before_it_and_no_later_variant_carries_it(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH)
    (tmp_path / "b.patch").write_text("--- /dev/null\n+++ b/common/b.cpp\n@@ -0,0 +1 @@\n+int b;\n")
    (tmp_path / "c.patch").write_text("--- /dev/null\n+++ b/common/c.cpp\n@@ -0,0 +1 @@\n+int c;\n")
    (tmp_path / "series").write_text("a.patch -\nb.patch side shown aside\nc.patch fix\n")
    series = load_series(tmp_path)
    assert series.variants == [BASELINE, "side", "fix"]
    assert [p.name for p in series.prefix("side")] == ["a.patch", "b.patch"]
    assert [p.name for p in series.prefix("fix")] == ["a.patch", "c.patch"]
    assert [p.name for p in series.chain] == ["a.patch", "c.patch"]
    assert series.role("side") == Role.SHOWN
    bad = {
        "b.patch - aside": r"expected .*\[aside\]",
        "b.patch * aside": r"expected .*\[aside\]",
        "b.patch side shown aside extra": r"expected .*\[aside\]",
        "b.patch aside": "bad variant name 'aside'",
    }
    for line, why in bad.items():
        (tmp_path / "series").write_text(f"a.patch -\n{line}\n")
        with pytest.raises(PatchError, match=f"series:2: {why}"):
            load_series(tmp_path)


def test_every_patch_of_the_project_applies_with_only_the_prerequisites_its_header_names(pristine):
    """What upstream may take one at a time: each patch on b11434 with only the patches its header names
    (``pyllama-dflash build --check``; ``build --alone`` compiles them so)."""
    series = load_series(REPO / "patches")
    assert prerequisites.check(series, tree_reader(pristine)) == []
    named = {p.name[:4]: [q.name[:4] for q in prerequisites.named(series, p)] for p in series.patches}
    # the EAGLE3 bridge, the tests, the zero-fill, the twin's fix, the server's slots and MTP fed the image
    # stand alone
    alone = ["0001", "0002", "0003", "0004", "0005", "0006", "0009", "0010", "0012", "0013"]
    assert [n for n, needs in named.items() if not needs] == alone
    assert named["0007"] == ["0001", "0004", "0005"]
    assert named["0008"] == ["0001", "0004", "0005"]  # the request stands on the fixes, not on 0007 aside
    assert named["0011"] == ["0006"]  # new cases in 0006's test; MTP's test (0012) compiles without 0009
    assert named["0014"] == ["0010"]  # EAGLE3's cases in 0010's llama-server test


def test_no_fix_stands_on_a_variant_aside():
    """The zero-fill and the definition for every draft are shown beside the fixes, not under them: no later
    variant carries either, and no patch's header names one among its prerequisites."""
    series = load_series(REPO / "patches")
    asides = [p for p in series.own if p.aside]
    assert [(p.name[:4], p.role) for p in asides] == [("0003", Role.SHOWN), ("0007", Role.DEFINITION)]
    for aside in asides:
        assert [v for v in series.variants if aside in series.prefix(v)] == [aside.variant]
        assert [p.name for p in series.patches if aside in prerequisites.named(series, p)] == []


def test_a_header_that_names_no_prerequisites_or_a_later_patch_is_refused(tmp_path):
    for name, header in (("a.patch", "Subject: a\n\nPrerequisites: 0002\n"), ("b.patch", "Subject: b\n")):
        (tmp_path / name).write_text(header + "\n---\n" + PATCH)
    (tmp_path / "series").write_text("a.patch one\nb.patch two\n")
    series = load_series(tmp_path)
    with pytest.raises(PatchError, match="prerequisites 0002 are not earlier patches"):
        prerequisites.named(series, series.patches[0])
    with pytest.raises(PatchError, match="names no prerequisites"):
        prerequisites.named(series, series.patches[1])
    problems = prerequisites.check(series, lambda rel: None)
    assert len(problems) == 2 and all("with only its named prerequisites" in p for p in problems)


def test_a_patch_for_every_variant_goes_on_top_of_each(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH)
    (tmp_path / "t.patch").write_text("--- /dev/null\n+++ b/tests/t.cpp\n@@ -0,0 +1 @@\n+int main() {}\n")
    (tmp_path / "series").write_text("t.patch *\na.patch fix\n")
    series = load_series(tmp_path)
    assert series.variants == [BASELINE, "fix"]
    assert [p.name for p in series.prefix(BASELINE)] == ["t.patch"]
    assert [p.name for p in series.prefix("fix")] == ["a.patch", "t.patch"]  # listed first, applied last
    assert series.adds(BASELINE, "tests/t.cpp") and not series.adds(BASELINE, "f.txt")


def test_a_patch_on_a_variant_goes_on_top_of_it_and_of_the_variants_that_carry_it_only(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH)
    (tmp_path / "b.patch").write_text("--- /dev/null\n+++ b/common/b.cpp\n@@ -0,0 +1 @@\n+int b;\n")
    (tmp_path / "c.patch").write_text("--- /dev/null\n+++ b/common/c.cpp\n@@ -0,0 +1 @@\n+int c;\n")
    (tmp_path / "t.patch").write_text("--- /dev/null\n+++ b/tests/t.cpp\n@@ -0,0 +1 @@\n+int main() {}\n")
    (tmp_path / "u.patch").write_text("--- /dev/null\n+++ b/tests/u.cpp\n@@ -0,0 +1 @@\n+int main() {}\n")
    (tmp_path / "series").write_text("a.patch one\nc.patch aside-one aside\nb.patch two\nt.patch *\nu.patch * one\n")
    series = load_series(tmp_path)
    assert series.variants == [BASELINE, "one", "aside-one", "two"]
    on = {v: [p.name for p in series.every_on(v)] for v in series.variants}
    assert on == {
        BASELINE: ["t.patch"],
        "one": ["t.patch", "u.patch"],
        "aside-one": ["t.patch", "u.patch"],
        "two": ["t.patch", "u.patch"],
    }
    assert [p.name for p in series.prefix("two")] == ["a.patch", "b.patch", "t.patch", "u.patch"]
    (tmp_path / "series").write_text("a.patch one\nc.patch aside-one aside\nb.patch two\nt.patch *\nu.patch * two\n")
    series = load_series(tmp_path)
    assert [v for v in series.variants if series.adds(v, "tests/u.cpp")] == ["two"]  # not the aside before it
    (tmp_path / "series").write_text("u.patch * one\na.patch one\n")  # a variant below the line
    with pytest.raises(
        PatchError, match=r"series:1: '\* one' names no variant made above this line \(made so far: none"
    ):
        load_series(tmp_path)
    (tmp_path / "series").write_text("a.patch one\nu.patch * baseline\n")
    with pytest.raises(PatchError, match=r"series:2: '\* baseline' names no variant made above this line"):
        load_series(tmp_path)


def test_bad_series_lines_are_refused(tmp_path):
    (tmp_path / "series").write_text("missing.patch  some-variant\n")
    with pytest.raises(PatchError, match="missing.patch not found"):
        load_series(tmp_path)
    (tmp_path / "series").write_text("a.patch Bad_Name\n")
    (tmp_path / "a.patch").write_text(PATCH)
    with pytest.raises(PatchError, match=r"bad variant name.*\* for a patch applied to every variant, or - for one"):
        load_series(tmp_path)


def test_a_series_line_names_its_role_or_is_refused_naming_the_line(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH)
    (tmp_path / "series").write_text("a.patch  one  definition\n")
    assert load_series(tmp_path).role("one") == "definition"
    (tmp_path / "series").write_text("a.patch  one\n")
    assert load_series(tmp_path).role("one") == "twin"  # the default
    (tmp_path / "series").write_text("a.patch  one  twinned\n")
    with pytest.raises(PatchError, match=r"series:1: bad role 'twinned'"):
        load_series(tmp_path)
    (tmp_path / "series").write_text("a.patch  *  shown\n")  # a patch for every variant makes none
    with pytest.raises(PatchError, match=r"series:1: '\* shown' names no variant made above this line"):
        load_series(tmp_path)
    for old, new in (("seed", "shown"), ("fix", "twin")):  # the roles' retired names say their new ones
        (tmp_path / "series").write_text(f"a.patch  one  {old}\n")
        with pytest.raises(PatchError, match=rf"series:1: role '{old}' is now '{new}'"):
            load_series(tmp_path)


def test_must_pass_means_the_variant_that_serves_each_draft_as_trained_unless_named():
    """--must-pass's default: paired acceptance measures that each draft accepts best served as it was trained
    (docs/performance.md), which the as-trained variant does per draft; without it, the last fix exact
    to the twin (what the drafts users have, trained on text only, were trained for)."""
    series = load_series(REPO / "patches")
    # the last of them: 0009 (MTP fed the image) on top of 0008 is served as 0008 serves DFlash drafts
    assert default_must_pass(series.variants) == "mtp-fed-images"
    assert default_must_pass([v for v in series.variants if v != "mtp-fed-images"]) == "as-trained"
    fixes = [v for v in series.variants if v != "baseline" and series.role(v) == "twin"]
    trained = ("as-trained", "mtp-fed-images")
    assert default_must_pass([v for v in series.variants if v not in trained]) == fixes[-1] == "slots"
    assert default_must_pass(["baseline", "zero-fill", "full"]) == "full"
    assert default_must_pass(["baseline", "definition"]) == "definition"  # no fix among those run: the last


def _diff(path: str, old: str, new: str) -> str:
    import difflib

    body = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    return "Subject: s\n\n---\n" + "".join(body)


def test_a_line_a_later_patch_removes_is_counted_against_the_patch_that_added_it(tmp_path):
    """undone_lines: 'two' removes one of 'one''s lines and one pristine line, and keeps the other line of
    'one' it only moves past; only the first counts, against 'one'."""
    from pyllama_dflash.product.llamabuild.undone import by_pair, undone_lines

    pristine = "a\nb\nc\nd\ne\nf\ng\n"
    first = "a\nb\nfill the hole\nc\nd\nkeep me\ne\nf\ng\n"
    second = "a\nb\nc\nd\nkeep me\ne\ng\n"  # drops 'fill the hole' (one's) and 'f' (pristine)
    (tmp_path / "one.patch").write_text(_diff("x.c", pristine, first))
    (tmp_path / "two.patch").write_text(_diff("x.c", first, second))
    (tmp_path / "series").write_text("one.patch one\ntwo.patch two\n")
    series = load_series(tmp_path)
    found = undone_lines(lambda rel: pristine if rel == "x.c" else None, series.own)
    assert [(u.patch, u.added_by, u.line) for u in found] == [("two.patch", "one.patch", "fill the hole")]
    assert by_pair(found) == {("two.patch", "one.patch"): 1}
    assert apply_series(lambda rel: pristine, series.own) == {"x.c": second}


def test_fix_patches_are_counted_along_the_chain_and_a_variant_aside_apart(tmp_path):
    """fixes_undone: a fix after a variant aside does not stand on it, so its lines are the pristine ones
    (none counted); asides_undone: the variant aside's own removal of a carried patch's line."""
    from pyllama_dflash.product.llamabuild.undone import asides_undone, fixes_undone

    pristine = "a\nb\nc\nd\ne\nf\ng\n"
    carried = "a\nb\ncarried\nc\nd\ne\nf\ng\n"
    (tmp_path / "one.patch").write_text(_diff("x.c", pristine, carried))
    (tmp_path / "side.patch").write_text(_diff("x.c", carried, "a\nb\nside\nc\nd\ne\nf\ng\n"))
    (tmp_path / "two.patch").write_text(_diff("x.c", carried, "a\nb\ncarried\nc\nd\ntwo\nf\ng\n"))
    (tmp_path / "series").write_text("one.patch -\nside.patch side shown aside\ntwo.patch two\n")
    series = load_series(tmp_path)

    def read(rel):
        return pristine if rel == "x.c" else None

    assert fixes_undone(read, series) == []
    aside = [(u.patch, u.added_by, u.line) for u in asides_undone(read, series)]
    assert aside == [("side.patch", "one.patch", "carried")]


def test_the_floor_counts_what_a_later_tree_no_longer_has_of_an_earlier_variants_patches(tmp_path):
    """removed_between: 'two' takes out one's line and 'three' puts it back, so the chain counts it undone
    while three's tree still has it (floor 0); two's tree lacks it (floor 1), however the patches are split."""
    from pyllama_dflash.product.llamabuild.undone import fixes_undone, removed_between

    pristine = "a\nb\nc\nd\ne\nf\ng\n"
    first = "a\nb\nfrom one\nc\nd\ne\nf\ng\n"
    second = "a\nb\nc\nd\ne\nfrom two\nf\ng\n"
    third = "a\nb\nfrom one\nc\nd\ne\nfrom two\nf\ng\n"
    (tmp_path / "one.patch").write_text(_diff("x.c", pristine, first))
    (tmp_path / "two.patch").write_text(_diff("x.c", first, second))
    (tmp_path / "three.patch").write_text(_diff("x.c", second, third))
    (tmp_path / "series").write_text("one.patch one\ntwo.patch two\nthree.patch three\n")
    series = load_series(tmp_path)

    def read(rel):
        return pristine if rel == "x.c" else None

    assert [(u.patch, u.added_by, u.line) for u in fixes_undone(read, series)] == [
        ("two.patch", "one.patch", "from one")
    ]
    assert [(u.added_by, u.line) for u in removed_between(read, series, "one", "two")] == [("one.patch", "from one")]
    assert removed_between(read, series, "one", "three") == []


def test_no_fix_patch_removes_a_line_an_earlier_fix_patch_added(pristine):
    """The series is additive (pyllama-dflash build --check): each fix patch, applied on the ones before it,
    keeps every line they add. A line it takes out is named here, by the patch that added it."""
    from pyllama_dflash.product.llamabuild.undone import fixes_undone

    found = fixes_undone(tree_reader(pristine), load_series(REPO / "patches"))
    assert [(u.patch, u.added_by, u.path, u.line) for u in found] == []


def test_the_last_tree_keeps_every_line_that_slots_patches_add(pristine):
    """However the patches after slots were split, the last variant's tree against slots' removes nothing
    of slots' patches: the floor that no split can go below is 0."""
    from pyllama_dflash.product.llamabuild.undone import removed_between

    series = load_series(REPO / "patches")
    floor = removed_between(tree_reader(pristine), series, "slots", series.variants[-1])
    assert [(u.added_by, u.path, u.line) for u in floor] == []
