"""One way to run a command: its ``prog``, its error line and its exit codes.

A command is a ``main(argv) -> int`` that parses its flags, does its work and returns its own exit
code (0, or 1 for a verdict such as NOT OK); on an error it raises. :func:`run` runs it, from
``pyllama-dflash NAME`` (cli.py), from ``python -m pyllama_dflash.NAME`` (the command's
``__main__`` block) and from ``python build.py`` alike:

- ``prog`` is ``pyllama-dflash NAME``, ``python -m pyllama_dflash.NAME`` or ``build.py``, as the
  command was started; the usage, argparse's own errors and the error line below all use it;
- an error of the package's (:class:`~.errors.PyllamaError`), or an ``OSError`` about a file (it
  names the file): one line ``PROG: error: MESSAGE`` on stderr, exit 2;
- Ctrl-C or SIGTERM: the children it waits on are killed, its ``finally`` blocks run, then one
  line ``PROG: interrupted`` (and what the command says of what it leaves, see :func:`on_interrupt`),
  exit 130;
- a command that needs a package of an extra checks for it with :func:`require`: the error line
  names the extra to install, before any work.

Any other exception is a bug, and keeps its traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence

from pyllama_dflash.product.process.child import sigterm_as_interrupt

from .errors import PyllamaError
from .flags import PROG, _prog

EXIT_ERROR = 2  # an error of the package's, or about a user's file; argparse's own usage errors too
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C

Main = Callable[[list[str]], int]


class MissingExtra(PyllamaError, ImportError):
    """A command needs a package that an extra of the project installs, and it is not installed."""


def require(module: str, *, extra: str, command: str) -> None:
    """Stop the command at once, naming the extra to install, when ``module`` cannot be imported."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"{command} needs {module}, which is not installed: pip install 'pyllama-dflash[{extra}]'")


def on_interrupt(note: str) -> Callable[[Main], Main]:
    """Mark a command with what its interruption leaves (``nothing was made``), for the line saying so."""

    def mark(main: Main) -> Main:
        main.interrupted = note  # type: ignore[attr-defined]
        return main

    return mark


def module_prog(main: Main) -> str:
    """``python -m PACKAGE`` for a command whose main lives in ``PACKAGE.__main__``, else the module."""
    module = main.__module__
    if module == "__main__":  # run as python -m: the spec names the package
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    return f"python -m {module.removesuffix('.__main__')}"


def name_prog(name: str) -> str:
    """The prog of a command run through the console command: ``pyllama-dflash NAME``."""
    return f"{PROG} {name}"


def run(main: Main, argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run ``main(argv)`` (default: ``sys.argv[1:]``) as a command: see the module's docstring."""
    prog = prog or module_prog(main)
    token = _prog.set(prog)
    try:
        with sigterm_as_interrupt():
            return main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        note = getattr(main, "interrupted", "")
        _say(prog, "interrupted" + (f"; {note}" if note else ""))
        return EXIT_INTERRUPTED
    except PyllamaError as e:
        _say(prog, f"error: {e}")
        return EXIT_ERROR
    except OSError as e:
        if e.filename is None:  # not about a file: a bug, or the system's, with its traceback
            raise
        _say(prog, f"error: {_about_a_file(e)}")
        return EXIT_ERROR
    finally:
        _prog.reset(token)


def _about_a_file(e: OSError) -> str:
    """``PATH: reason`` (``PATH -> OTHER: reason`` for a rename or a link)."""
    where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
    return f"{where}: {e.strerror or e}"


def _say(prog: str, line: str) -> None:
    print(f"{prog}: {line}", file=sys.stderr, flush=True)
