"""Bad input: each one ends in a Python exception or a non-zero exit that names the file or the
parameter and the reason; none kills the interpreter, none writes outside the build cache.

Tried for real, on the tiny models and the built libraries (no mocks). Where llama.cpp itself
aborts (a GGML_ASSERT in the loader), the raw call is shown to kill a child interpreter and the
guarded call (``Model.load_checked``, ``guard.run_in_child``) to raise instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from series_variants import VARIANTS

import pyllama_dflash
from pyllama_dflash.env import CPU_ENV
from pyllama_dflash.harness import tiny
from pyllama_dflash.harness.tiny import image
from pyllama_dflash.paths import CACHE_ENV, cache_root
from pyllama_dflash.product import api
from pyllama_dflash.product.llamabuild import PatchError, VariantNotBuilt
from pyllama_dflash.product.process import guard

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory, models: tiny.TinyModels) -> dict[str, Path]:
    """Broken GGUFs made from the tiny target, by name."""
    out = tmp_path_factory.mktemp("bad")
    data = models.target.read_bytes()
    files = {
        "header-only": data[:24],
        "cut-in-tensor-info": data[:4096],
        "cut-in-tensor-data": data[: len(data) // 2],
        "not-gguf": b"PK\x03\x04 a zip file, say\n",
        "empty": b"",
    }
    # corrupt header: a key/value count no file can hold
    files["huge-kv-count"] = data[:16] + (2**40).to_bytes(8, "little") + data[24:]
    for name, blob in files.items():
        (out / f"{name}.gguf").write_bytes(blob)
    # well-formed files whose values make llama.cpp's loader abort the process
    _edited(models.target, out / "block-count-1000.gguf", "qwen35.block_count", 1000)  # GGML_ASSERT
    _edited(models.target, out / "attention-interval-0.gguf", "qwen35.full_attention_interval", 0)  # SIGFPE
    _edited(models.target, out / "rope-dims-0.gguf", "qwen35.rope.dimension_count", 0)  # loads; decode never returns
    return {p.stem: p for p in out.iterdir()}


def _edited(src: Path, dst: Path, key: str, value: int) -> None:
    """Copy src to dst with one scalar metadata value replaced in place."""
    shutil.copyfile(src, dst)
    reader = tiny.gguf_module().GGUFReader(dst, "r+")
    field = reader.fields[key]
    field.parts[field.data[0]][0] = value
    reader.data.flush()
    del reader


def _run(
    args: list[str], env: dict | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})}
    )


# ---- model files ---------------------------------------------------------------------------------


def test_a_missing_model_file(lib_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(api.ModelLoadError, match="no such file") as info:
        api.Model(missing)
    assert str(info.value) == f"cannot load {missing}: no such file"


@pytest.mark.parametrize(
    "name, reason",
    [
        ("header-only", "failed to read key-value pairs"),
        ("cut-in-tensor-info", "failed to read tensor info"),
        ("cut-in-tensor-data", "is not within the file bounds, model is corrupted or incomplete"),
    ],
)
def test_a_truncated_gguf(lib_dir: Path, bad: dict[str, Path], name: str, reason: str) -> None:
    with pytest.raises(api.ModelLoadError) as info:
        api.Model(bad[name])
    assert str(info.value).startswith(f"cannot load {bad[name]}: ") and reason in str(info.value)


def test_a_corrupt_gguf_header(lib_dir: Path, bad: dict[str, Path]) -> None:
    with pytest.raises(api.ModelLoadError, match="exceeds maximum") as info:
        api.Model(bad["huge-kv-count"])
    assert str(bad["huge-kv-count"]) in str(info.value) and "failed to read key-value pairs" in str(info.value)


@pytest.mark.parametrize(
    "name, signal_name, reason",
    [
        (
            "block-count-1000",
            "SIGABRT",
            "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS) "
            "failed at src/llama-model.cpp",
        ),
        ("attention-interval-0", "SIGFPE", "Floating point exception"),
    ],
)
def test_a_corrupt_gguf_that_makes_llama_cpp_abort_is_loaded_in_a_child(
    lib_dir: Path, bad: dict[str, Path], name: str, signal_name: str, reason: str
) -> None:
    path = bad[name]
    # unguarded, llama.cpp takes the interpreter down with it ...
    code = f"from pyllama_dflash import api; api.init({str(lib_dir)!r}); api.Model({str(path)!r})"
    raw = _run([PY, "-c", code], env={"GGML_NO_BACKTRACE": "1"})
    assert raw.returncode < 0, raw.stderr[-2000:]
    # ... guarded, this one raises and lives on
    with pytest.raises(api.ModelLoadError) as info:
        api.Model.load_checked(path)
    message = str(info.value)
    assert message.startswith(
        f"cannot load {path}: llama.cpp aborted while loading it ({signal_name}, in a child process)"
    )
    assert reason in message
    assert isinstance(info.value.__cause__, guard.NativeAbort)


def test_load_checked_loads_a_good_file_and_refuses_cheap_cases_without_a_child(
    lib_dir: Path, models: tiny.TinyModels, bad: dict[str, Path]
) -> None:
    with api.Model.load_checked(models.target) as model:
        assert model.arch == "qwen35"
    with pytest.raises(api.ModelLoadError, match="not a GGUF file"):
        api.Model.load_checked(bad["not-gguf"])
    with pytest.raises(api.ModelLoadError, match="failed to read tensor info"):  # llama.cpp's own error
        api.Model.load_checked(bad["cut-in-tensor-info"])


@pytest.mark.parametrize("name", ["not-gguf", "empty"])
def test_a_file_that_is_not_gguf(lib_dir: Path, bad: dict[str, Path], name: str) -> None:
    with pytest.raises(api.ModelLoadError, match=r"not a GGUF file \(magic b'.*', expected b'GGUF'\)") as info:
        api.Model(bad[name])
    assert str(bad[name]) in str(info.value)


def test_a_folder_instead_of_a_model(lib_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(api.ModelLoadError, match="not a regular file"):
        api.Model(tmp_path)


# ---- models that do not fit together ---------------------------------------------------------------


def test_a_draft_with_another_n_embd(target: api.Context, tmp_path: Path) -> None:
    narrow = tiny.write_models(tmp_path, config=tiny.TinyConfig(n_embd=32))
    with api.Model(narrow.draft) as draft, pytest.raises(api.IncompatibleModelsError) as info:
        api.Context.draft(draft, target)
    assert str(info.value) == (
        f"draft {narrow.draft} has n_embd 32 but target {target.model.path} has n_embd 64: "
        "the draft reuses the target's token embeddings, so they must match"
    )


@pytest.mark.parametrize("n_vocab", [100, 200])
def test_a_draft_with_another_vocab(target: api.Context, tmp_path: Path, n_vocab: int) -> None:
    # llama.cpp accepts it: DFlash then samples n_vocab floats from rows of the target's 128
    other = tiny.write_models(tmp_path, config=tiny.TinyConfig(n_vocab=n_vocab))
    with api.Model(other.draft) as draft, pytest.raises(api.IncompatibleModelsError) as info:
        api.Context.draft(draft, target)
    assert str(info.value) == (
        f"draft {other.draft} has n_vocab {n_vocab} but target {target.model.path} has n_vocab 128: "
        "the draft drafts from the target's output head, so the vocabs must match"
    )


def test_an_mmproj_made_for_another_n_embd(target_model: api.Model, tmp_path: Path) -> None:
    other = tiny.write_models(tmp_path, config=tiny.TinyConfig(n_embd=32))
    with pytest.raises(api.ModelLoadError) as info:
        api.Projector(other.mmproj, target_model)
    assert str(info.value).startswith(f"cannot load {other.mmproj}: ")
    assert "mismatch between text model (n_embd = 64) and mmproj (n_embd = 32)" in str(info.value)
    with pytest.raises(api.ModelLoadError, match="mismatch between text model"):  # the guarded path says the same
        api.Projector.load_checked(other.mmproj, target_model)


# ---- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"not an image at all", image.png_bytes(image.rgb(56, 56))[:40], b""],
    ids=["text", "truncated-png", "empty"],
)
def test_image_bytes_that_are_not_an_image(target_model: api.Model, models: tiny.TinyModels, data: bytes) -> None:
    with api.Projector(models.mmproj, target_model) as proj, pytest.raises(api.NativeCallError) as info:
        proj.tokenize(f"look {proj.marker}", [image.png_bytes(image.rgb(56, 56)), data])
    assert str(info.value) == "mtmd_helper_bitmap_init_from_buf: image 1: not an image mtmd can read"


def test_an_image_too_large_for_n_ctx(target: api.Context, target_model: api.Model, models: tiny.TinyModels) -> None:
    with api.Projector(models.mmproj, target_model) as proj:
        chunks = proj.tokenize(f"hi {proj.marker}", [image.rgb(504, 504)])  # 18 x 18 = 324 tokens
        img = chunks[1]
        assert img.n_tokens > target.n_ctx_seq == 256
        with pytest.raises(ValueError) as info:
            proj.decode_image(target, img, chunks[0].n_tokens)
    assert str(info.value) == (
        "decode_image: image chunk 1 of 324 tokens (18x18) cannot fit in n_ctx 256 per sequence: "
        "raise n_ctx or pass image_max_tokens to the Projector"
    )
    assert target.pos_max(0) == -1  # nothing reached the context


# ---- batches and contexts ----------------------------------------------------------------------------


def test_a_draft_n_ubatch_smaller_than_its_block(target: api.Context, models: tiny.TinyModels) -> None:
    # llama.cpp: GGML_ASSERT(... "non-causal attention requires n_ubatch >= n_tokens") on the first draft()
    with (
        api.Model(models.draft) as dm,
        api.Context.draft(dm, target, n_ubatch=2) as draft,
        pytest.raises(api.ContextError) as info,
    ):
        api.Speculative(target, draft)
    assert str(info.value) == (
        "draft context n_ubatch 2 < the draft's block size 4: DFlash decodes its noise block of 4 rows in one "
        "non-causal ubatch (llama.cpp would abort); use n_ubatch >= 4"
    )


@pytest.mark.parametrize(
    "pos, seq, message",
    [
        ([-1, 0, 1], 0, "pos of row 0 is [-1]: positions must be >= 0"),
        ([0, 0, 1], 0, "pos of row 1 repeats 0 after 0 in sequence 0: positions must increase within a sequence"),
        ([0, 2, 1], 0, "pos of row 2 goes back to 1 after 2 in sequence 0: positions must increase within a sequence"),
    ],
    ids=["negative", "repeated", "decreasing"],
)
@pytest.mark.parametrize("route", ["decode", "process"])
def test_a_batch_with_bad_positions(target: api.Context, pos: list[int], seq: int, message: str, route: str) -> None:
    # llama.cpp stores the first two without complaint (and misreports the third)
    call = target.decode if route == "decode" else target.process_rc
    via = "llama_decode" if route == "decode" else "llama_process"
    with pytest.raises(ValueError) as info:
        call(api.Batch.tokens([9, 10, 11], pos, seq_id=seq))
    assert str(info.value) == f"{via}: {message}"
    assert target.pos_max(0) == -1 and target.n_decode_calls == 0


def test_an_image_batch_may_repeat_its_temporal_position(target: api.Context, target_model: api.Model) -> None:
    embd = np.zeros((4, target_model.n_embd_inp), dtype=np.float32)
    pos = np.array([[3, 3, 3, 3], [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]], dtype=np.int32)
    assert target.decode(api.Batch.embeddings(embd, pos)) == 0
    back = pos.copy()
    back[0] = [5, 5, 4, 4]  # a temporal position that goes back is still refused
    with pytest.raises(ValueError, match=r"pos of row 2 goes back to 4 after 5 in sequence 0"):
        target.decode(api.Batch.embeddings(embd, back))


# ---- the guard itself ------------------------------------------------------------------------------


def _load_unguarded(path: str) -> str:
    with api.Model(path) as m:
        return m.arch


def test_run_in_child_returns_raises_and_survives_an_abort(
    lib_dir: Path, models: tiny.TinyModels, bad: dict[str, Path], tmp_path: Path
) -> None:
    assert guard.run_in_child(_load_unguarded, str(models.target)) == "qwen35"
    with pytest.raises(api.ModelLoadError, match="no such file"):  # the child's exception, as itself
        guard.run_in_child(_load_unguarded, str(tmp_path / "missing.gguf"))
    with pytest.raises(guard.NativeAbort) as info:
        guard.run_in_child(_load_unguarded, str(bad["block-count-1000"]), call="load block-count-1000")
    assert info.value.how == "SIGABRT"
    assert str(info.value).startswith(
        "load block-count-1000: llama.cpp aborted the child process running it (SIGABRT): "
        "GGML_ASSERT(hparams.n_layer_all > 0"
    )


def _decode_once(path: str) -> int:
    with api.Model(path) as m, api.Context(m, n_ctx=64, n_batch=16, n_ubatch=16) as ctx:
        return ctx.decode(api.Batch.tokens([9, 10, 11]))


def test_a_corrupt_gguf_whose_decode_never_returns_times_out_in_a_child(lib_dir: Path, bad: dict[str, Path]) -> None:
    with pytest.raises(guard.NativeAbort) as info:
        guard.run_in_child(_decode_once, str(bad["rope-dims-0"]), call="decode rope-dims-0", timeout=5)
    assert str(info.value).startswith("decode rope-dims-0: the child process running it timed out after 5s")


# ---- variants and the build ----------------------------------------------------------------------------


def test_an_unknown_variant_everywhere(tmp_path: Path) -> None:
    with pytest.raises(PatchError) as info:
        pyllama_dflash.load("x")
    known = ", ".join(VARIANTS)
    assert str(info.value) == f"unknown variant 'x' (this series has: {known})"

    proc = _run([PY, str(REPO / "build.py"), "--variants", "x"])
    assert proc.returncode == 2
    assert f"build.py: error: unknown variant 'x' (this series has: {known})" in proc.stderr
    assert "resolving the llama.cpp source" not in proc.stderr  # refused before any source work

    for extra in ([], ["--no-build"]):
        proc = _run([PY, "-m", "pyllama_dflash.harness.repro", "--variants", "x", *extra], cwd=REPO)
        assert proc.returncode == 2, proc.stderr
        assert f"repro: error: unknown variant 'x' (this series has: {known})" in proc.stderr


def test_a_variant_that_is_not_built(variants, pristine: Path, tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "cache"
    empty.mkdir()
    monkeypatch.setenv(CACHE_ENV, str(empty))  # never the real cache: nothing there is touched
    mode = os.environ.get(CPU_ENV)  # the suite may run on avx2 builds: the lookup then asks for those
    asked, flag = (f" for --cpu {mode}", f" --cpu {mode}") if mode else ("", "")
    with pytest.raises(VariantNotBuilt) as info:
        pyllama_dflash.load("full")
    assert str(info.value) == (
        f"variant 'full' is not built{asked} in {empty}/variants; run: python build.py --variants full{flag}"
        " (--cpu portable: a build that runs on any x86-64 CPU)"
    )

    proc = _run(
        [PY, "-m", "pyllama_dflash.harness.repro", "--no-build", "--variants", "full"],
        cwd=REPO,
        env={CACHE_ENV: str(empty), "LLAMA_CPP_DIR": str(pristine)},
    )
    assert proc.returncode == 2
    assert (
        f"repro: error: variant 'full' is not built{asked} in {empty}/variants; run: python build.py --variants full"
        in proc.stderr
    )
    assert list(empty.iterdir()) == []


def test_llama_dir_that_is_not_llama_cpp(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "README.md").write_text("not llama.cpp\n")
    proc = _run([PY, str(REPO / "build.py"), "--variants", "baseline", "--llama-dir", str(tmp_path / "tree")])
    assert proc.returncode == 2
    assert (
        f"build.py: error: --llama-dir {tmp_path / 'tree'}: not a llama.cpp source tree (missing CMakeLists.txt, "
        "include/llama.h, common/speculative.cpp, tools/mtmd/mtmd.h)"
    ) in proc.stderr
    proc = _run([PY, str(REPO / "build.py"), "--llama-dir", str(tmp_path / "nowhere")])
    assert proc.returncode == 2
    assert f"build.py: error: --llama-dir {tmp_path / 'nowhere'}: no such directory" in proc.stderr


# ---- nothing written outside the cache -----------------------------------------------------------------

_SCRIPT = r"""
import sys
import pyllama_dflash
from pyllama_dflash import api
pyllama_dflash.load("baseline")
target, draft_other_vocab, mmproj_other, cut, aborting = sys.argv[1:6]
def attempt(name, fn):
    try:
        fn()
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
    else:
        print(f"{name}: no error", flush=True)
attempt("missing", lambda: api.Model(target + ".missing"))
attempt("truncated", lambda: api.Model(cut))
attempt("aborting", lambda: api.Model.load_checked(aborting))
tm = api.Model(target)
ctx = api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32)
attempt("vocab", lambda: api.Context.draft(api.Model(draft_other_vocab), ctx))
attempt("mmproj", lambda: api.Projector(mmproj_other, tm))
attempt("positions", lambda: ctx.decode(api.Batch.tokens([9, 10], [4, 4])))
print("alive", flush=True)
"""


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root (Python's own __pycache__ aside) with its size and mtime."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_bad_inputs_write_nothing_outside_the_cache(
    variants, pristine: Path, models: tiny.TinyModels, bad: dict[str, Path], tmp_path: Path
) -> None:
    """Each command given bad input fails with its message, and the checkout, HOME, the working folder,
    TMPDIR and an empty cache are left as they were: in one piece because one snapshot before and after
    brackets every command, where parts would each copy the checkout and write the models again."""
    # A copy of the checkout runs the commands: this tree is shared and edited while tests run,
    # so a before/after snapshot of it would not say who wrote what; the copy's does.
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    shutil.copytree(REPO / "pyllama_dflash", checkout / "pyllama_dflash", ignore=ignore)
    shutil.copytree(REPO / "patches", checkout / "patches", ignore=ignore)
    shutil.copy2(REPO / "build.py", checkout / "build.py")
    home, cwd, tmp, empty_cache = (tmp_path / d for d in ("home", "cwd", "tmp", "empty-cache"))
    for d in (home, cwd, tmp, empty_cache):
        d.mkdir()
    other_vocab = tiny.write_models(tmp_path / "vocab200", config=tiny.TinyConfig(n_vocab=200))
    other_embd = tiny.write_models(tmp_path / "embd32", config=tiny.TinyConfig(n_embd=32))
    before = _snapshot(checkout)

    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", CACHE_ENV, "PYTHONPATH")}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(checkout), LLAMA_CPP_DIR=str(pristine))
    real_cache = {CACHE_ENV: str(cache_root())}  # named explicitly: the builds live there
    runs = [
        ([str(checkout / "build.py"), "--variants", "x"], {}, "unknown variant 'x'"),
        (
            [str(checkout / "build.py"), "--variants", "baseline", "--llama-dir", str(cwd)],
            {},
            "not a llama.cpp source tree",
        ),
        (["-m", "pyllama_dflash.harness.repro", "--variants", "x"], {}, "unknown variant 'x'"),
        (
            ["-m", "pyllama_dflash.harness.repro", "--no-build", "--variants", "full"],
            {CACHE_ENV: str(empty_cache)},
            "is not built",
        ),
        (["-c", "import pyllama_dflash; pyllama_dflash.load('full')"], {CACHE_ENV: str(empty_cache)}, "is not built"),
        (
            [
                "-c",
                _SCRIPT,
                str(models.target),
                str(other_vocab.draft),
                str(other_embd.mmproj),
                str(bad["cut-in-tensor-info"]),
                str(bad["block-count-1000"]),
            ],
            real_cache,
            "alive",
        ),
    ]
    outputs = []
    for args, extra, expected in runs:
        proc = subprocess.run([PY, *args], capture_output=True, text=True, cwd=cwd, env={**env, **extra}, timeout=300)
        assert expected in proc.stdout + proc.stderr, (args[:3], proc.stdout[-2000:], proc.stderr[-3000:])
        outputs.append(proc.stdout)
    script = outputs[-1]
    for line in (
        "missing: ModelLoadError: cannot load",
        "truncated: ModelLoadError: cannot load",
        "aborting: ModelLoadError: cannot load",
        "vocab: IncompatibleModelsError: draft",
        "mmproj: ModelLoadError: cannot load",
        "positions: ValueError: llama_decode: pos of row 1 repeats 4",
    ):
        assert line in script, script

    assert _snapshot(checkout) == before
    for d in (home, cwd, tmp, empty_cache):
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == [], f"{d.name} was written"


def test_repro_draft_that_is_no_draft_gets_a_clear_error(variants, models, tmp_path):
    """--draft alone swaps the tiny plain draft; a missing file or a GGUF that is not a DFlash draft
    is named, and nothing is run."""
    for draft, expected in (
        (tmp_path / "nope.gguf", "no such file"),
        (models.target, "not a DFlash draft (general.architecture is 'qwen35')"),
    ):
        proc = _run([PY, "-m", "pyllama_dflash.harness.repro", "--no-build", "--draft", str(draft)])
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "repro: error: --draft" in proc.stderr and str(draft) in proc.stderr and expected in proc.stderr, (
            proc.stderr
        )


def test_sizes_llama_cpp_asserts_on_are_refused_up_front(lib_dir, target_model):
    """The target keeps n_rs_seq state snapshots: its last n_rs_seq + 1 rows of a sequence must share a
    ubatch, which llama.cpp asserts at the first decode. The API and repro refuse it before."""
    with pytest.raises(ValueError, match=r"n_ubatch 4 with n_rs_seq 3: .* must be larger than 4"):
        api.Context(target_model, n_ctx=64, n_batch=4, n_ubatch=4, n_rs_seq=3)
    with api.Context(target_model, n_ctx=64, n_batch=5, n_ubatch=5, n_rs_seq=3) as ctx:  # one more is fine
        assert ctx.n_ubatch == 5
    proc = _run([PY, "-m", "pyllama_dflash.harness.repro", "--no-build", "--n-batch", "4", "--scenarios", "S8"])
    assert proc.returncode == 2 and "repro: error: n_ubatch 4: the target keeps n_max = 3" in proc.stderr, proc.stderr
    assert "CRASH" not in proc.stdout
    proc = _run([PY, "-m", "pyllama_dflash.harness.repro", "--no-build", "--draft-n-ubatch", "2", "--scenarios", "S8"])
    assert proc.returncode == 2 and "draft n_ubatch 2: the noise block of 4 rows" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args, named",
    [
        (
            ["--only", "speed", "--rows-per-image", "64,256"],
            "--rows-per-image 64,256: the speed section takes one image size",
        ),
        (
            ["--only", "speed", "--rows-per-image", "100"],
            "--rows-per-image '100': a comma-separated choice of 64, 256, 1024",
        ),
        (["--only", "speed", "--conversations", "0"], "--conversations 0: at least one conversation per column"),
    ],
)
def test_a_bench_flag_the_speed_section_cannot_take_is_refused_before_anything_runs(capsys, args, named) -> None:
    from pyllama_dflash.lab.bench.__main__ import main as bench_main

    with pytest.raises(SystemExit) as info:
        bench_main(args)
    assert info.value.code == 2 and named in capsys.readouterr().err
