"""The package's shape, checked: one error root, imports that run one way, a package per folder.

No native code: these read the source (ast) and import the modules.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import pyllama_dflash
from pyllama_dflash.errors import PyllamaError

PACKAGE_DIR = Path(pyllama_dflash.__file__).parent

# Exceptions that steer control flow inside the harness and never reach a caller, so they need
# not derive from PyllamaError: each is raised and caught within one run of the harness.
INTERNAL = {
    "pyllama_dflash.harness.slotloop.record.StopScenario": "ends a scenario run at its first failing call; "
    "the runner catches it",
    "pyllama_dflash.harness.engine.invariant.Violation": "a broken invariant handed to hypothesis, which shrinks and "
    "reports it",
}


def _modules() -> list[str]:
    names = ["pyllama_dflash"]
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="pyllama_dflash."):
        names.append(info.name)
    return names


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE_DIR.parent / rel).with_suffix(".py").is_file() or (
        PACKAGE_DIR.parent / rel / "__init__.py"
    ).is_file()


def import_graph() -> dict[str, set[str]]:
    """Every import between the package's modules, function-level ones included."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        me = _module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        edges = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("pyllama_dflash"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if not src.startswith("pyllama_dflash"):
                    continue
                for alias in node.names:  # `from pkg import module` imports the module
                    sub = f"{src}.{alias.name}"
                    edges.add(sub if _is_module(sub) else src)
        edges.discard(me)
    return graph


def test_every_public_exception_derives_from_pyllama_error():
    found = {}
    for name in _modules():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{name}.{cls.__qualname__}"] = cls
    assert len(found) > 20, sorted(found)  # the walk saw the package, not an empty shell
    internal_roots = tuple(cls for key, cls in found.items() if key in INTERNAL)
    assert len(internal_roots) == len(INTERNAL), "an INTERNAL entry names no class"
    outside = sorted(
        key for key, cls in found.items() if not issubclass(cls, PyllamaError) and not issubclass(cls, internal_roots)
    )
    assert outside == [], f"not under PyllamaError: {outside}"


def test_one_except_catches_what_load_raises_for_a_missing_variant(tmp_path, monkeypatch):
    monkeypatch.setenv("PYLLAMA_DFLASH_CACHE", str(tmp_path))
    with pytest.raises(PyllamaError, match="is not built"):
        pyllama_dflash.load("full")


def test_no_module_imports_a_module_that_imports_it_back():
    """Strongly connected components of the import graph, function-level imports included."""
    graph = import_graph()
    assert (
        "pyllama_dflash.product.api.model" in graph
        and "pyllama_dflash.product.process.guard" in graph["pyllama_dflash.product.api.model"]
    )
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == [], cycles


# A package with a __main__.py is a command (``python -m pyllama_dflash.<layer>.<tool>``), on top of the rest.
# llamabuild, tiny, draftmodel and upgrade are the layers with a command of their own: the builds of the
# variants, which everything that loads or runs one looks up; the tiny models, which the scenarios, the
# server checks and every command run on; the reference model of the draft with its trained drafts, which
# the acceptance measurement runs on; and the remedy's GGUF reading and writing, which the scenarios, the
# tiny models and repro use. Each __main__.py writes files, and nothing imports it.
# layer: a module below the commands that imports it
LAYERS_WITH_A_COMMAND = {
    "pyllama_dflash.product.llamabuild": "pyllama_dflash.harness.engine.matrix",
    "pyllama_dflash.harness.tiny": "pyllama_dflash.harness.slotloop.models",
    "pyllama_dflash.lab.draftmodel": "pyllama_dflash.lab.acceptance.worker",
    "pyllama_dflash.product.upgrade": "pyllama_dflash.harness.scenarios.catalog",
}


def _commands() -> list[str]:
    return sorted(
        _module_name(main.parent / "__init__.py")
        for main in PACKAGE_DIR.rglob("__main__.py")
        if _module_name(main.parent / "__init__.py") not in LAYERS_WITH_A_COMMAND
    )


def _command_of(module: str, commands: list[str]) -> str | None:
    return next((c for c in commands if module == c or module.startswith(c + ".")), None)


def test_no_command_imports_another_command():
    """repro, fuzz, mutate, bench, soak, upgrade (and any tool added with a __main__.py): what two of
    them share lives below them (the engine, the scenarios, the GGUF modules), never in one of them."""
    graph = import_graph()
    commands = _commands()
    named = ("harness.repro", "harness.fuzz", "lab.mutate", "lab.bench", "harness.soak")
    assert {f"pyllama_dflash.{c}" for c in named} <= set(commands)
    crossing = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if _command_of(m, commands) and _command_of(d, commands) not in (None, _command_of(m, commands))
    )
    assert crossing == [], crossing


def test_nothing_below_the_commands_imports_one():
    """The commands sit on top: no module outside them imports one (cli.py names them as strings)."""
    graph = import_graph()
    commands = _commands()
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if not _command_of(m, commands) and _command_of(d, commands)
    )
    assert upward == [], upward
    # no one imports a __main__, a layer's own command included
    mains = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if d.endswith(".__main__"))
    assert mains == [], mains
    # a layer with a command is a layer: something below the commands needs it
    for layer, below in LAYERS_WITH_A_COMMAND.items():
        assert any(d == layer or d.startswith(layer + ".") for d in graph[below]), (layer, below)


def test_every_folder_of_python_code_is_a_package():
    missing = sorted(
        str(d.relative_to(PACKAGE_DIR.parent))
        for d in PACKAGE_DIR.rglob("*")
        if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py")) and not (d / "__init__.py").is_file()
    )
    assert missing == []


def test_the_api_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE_DIR / "product" / "api").glob("*.py")}
    assert max(sizes.values()) <= 350, sizes


MAX_MODULE_LINES = 500  # no module of the package over this
# modules over it, each with its reason; an entry whose module is back under the limit fails too
LONG_MODULES: dict[str, str] = {}


def test_no_module_is_too_long_to_read():
    """A module over 500 lines is split by idea, as its functions are (a package of modules, or a class
    whose parts are mixed in from modules of their own: pyllama_dflash.harness.slotloop)."""
    sizes = {str(p.relative_to(PACKAGE_DIR)): len(p.read_text().splitlines()) for p in PACKAGE_DIR.rglob("*.py")}
    too_long = sorted(f"{m}: {n} lines" for m, n in sizes.items() if n > MAX_MODULE_LINES and m not in LONG_MODULES)
    assert too_long == [], too_long
    stale = sorted(m for m in LONG_MODULES if sizes.get(m, 0) <= MAX_MODULE_LINES)
    assert stale == [], f"LONG_MODULES entries no longer over {MAX_MODULE_LINES} lines (or gone): {stale}"


# the slot loop's pipeline, bottom up: the child processes, guard and logs; the API over the bindings; the slot
# loop over the API; the oracles, which say what the slot loop's reference runs mean; the scenarios, judged by
# them; the engine, which runs scenarios and schedules in children
PIPELINE = (
    "product.process",
    "product.api",
    "harness.slotloop",
    "harness.oracles",
    "harness.scenarios",
    "harness.engine",
)


def test_the_pipeline_runs_one_way():
    """No package of the pipeline imports one after it: the slot loop knows nothing of the oracles, the
    oracles nothing of the scenarios, the scenarios nothing of the engine."""
    graph = import_graph()
    rank = {f"pyllama_dflash.{p}": i for i, p in enumerate(PIPELINE)}

    def rank_of(module: str) -> int | None:
        return next((i for p, i in rank.items() if module == p or module.startswith(p + ".")), None)

    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if rank_of(m) is not None and rank_of(d) is not None and rank_of(d) > rank_of(m)
    )
    assert upward == [], upward
    assert all(any(rank_of(m) == i for m in graph) for i in rank.values()), "a PIPELINE package is gone"


# the package's three folders, bottom up: what a user installs (product), what the fix is tested with
# (harness), what it is measured and developed with (lab); the modules at the top are shared by all three
LAYERS = ("product", "harness", "lab")


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_layers_are_folders_and_import_one_way():
    """product imports neither harness nor lab, harness not lab; a shared module at the top imports no
    folder but product (the builder and the API it loads), and every package sits in one of the folders."""
    top = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert top == set(LAYERS), top
    graph = import_graph()
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if d.startswith("pyllama_dflash.") and (_layer_of(d) or 0) > (_layer_of(m) if _layer_of(m) is not None else 0)
    )
    assert upward == [], upward
    assert all(any(_layer_of(m) == i for m in graph) for i in range(len(LAYERS))), "a layer is empty"


# ---- functions short enough to read, commands run one way -----------------------------------------

MAX_LINES = 80  # no function over this
LONG_LINES = 60  # over this, its docstring says why it is in one piece
REASON = "in one piece because"


def _functions():
    """Every function of the package and of the tests."""
    for path in sorted([*PACKAGE_DIR.rglob("*.py"), *(PACKAGE_DIR.parent / "tests").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno} {node.name}"
                yield where, node.end_lineno - node.lineno + 1, ast.get_docstring(node) or ""


def test_no_function_is_too_long_to_read():
    """A function over 80 lines is split by idea (parse, run, verdict, report); one over 60 says in its
    docstring why it is not ("... in one piece because ..."). The tests too."""
    found = list(_functions())
    assert len(found) > 500, len(found)  # the walk saw the package
    too_long = sorted(f"{where}: {n} lines" for where, n, _ in found if n > MAX_LINES)
    assert too_long == [], too_long
    unexplained = sorted(f"{where}: {n} lines" for where, n, doc in found if n > LONG_LINES and REASON not in doc)
    assert unexplained == [], f"over {LONG_LINES} lines without '{REASON} ...' in the docstring: {unexplained}"


def test_every_command_runs_through_the_one_runner():
    """Each __main__.py ends in ``sys.exit(command.run(main))``: its prog, its error line and its exit
    codes are command.py's (tests/test_cli.py runs each with a missing file and with Ctrl-C)."""
    mains = sorted(PACKAGE_DIR.rglob("__main__.py"))
    assert len(mains) >= 10, mains
    for path in mains:
        tree = ast.parse(path.read_text(), str(path))
        (block,) = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert [ast.unparse(n) for n in block.body] == ["sys.exit(command.run(main))"], path
        assert "def main(" in path.read_text(), path


# What a comment must not carry: where a line came from belongs in docs/regression.md and
# docs/performance.md, beside the figures it explains, not in the code that outlives it.
_HISTORY = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"  # a date
    r"|\b(?:bound|offset|drop|negate|swap|const)-[0-9a-f]{8}\b"  # a mutant's id
    r"|\b[Ii]ssue #?\d+|\(#\d{2,6}\)"  # an issue or pull request
)


def test_the_package_source_carries_no_history():
    hits = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE_DIR.rglob("*"))
        if path.suffix in (".py", ".cpp", ".h")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _HISTORY.search(line)
    ]
    assert not hits, "\n".join(hits)
