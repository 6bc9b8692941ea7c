"""The staged tree a build compiles: the pristine llama.cpp tree, hard-linked, with the
files a patch touches replaced by real copies holding the variant's content.

The pristine tree is never written: every change goes through an atomic replace,
which gives the staged path a new inode (and a fresh mtime, so ninja recompiles it)
while the pristine file keeps its own. One stage serves every variant of a build
folder; switching variants rewrites only the files whose content differs.

The linked files are read-only (the pristine tree's mode). Where the pristine tree was
extracted again because a file of it changed anyway (source.PristineRecord), a stage linked
to the older extraction is linked again, and the repaired paths are written as real copies
with a fresh mtime: the links alone would carry the archive's old mtimes, and ninja would
keep the objects compiled from the changed files.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...files import atomic_write_bytes, atomic_write_json, sha256_bytes

if TYPE_CHECKING:
    from .source import PristineRecord

_FARM_MARKER = ".pyllama-dflash-farm"
_STATE = ".pyllama-dflash-stage.json"
_SKIP_DIRS = {".git"}


class Stage:
    def __init__(self, root: Path, pristine: Path, record: PristineRecord | None = None):
        self.root = root
        self.pristine = pristine
        self.record = record  # the pristine tree's guard record, where it has one

    @property
    def ready(self) -> bool:
        return (self.root / _FARM_MARKER).is_file()

    def _linked_generation(self) -> int:
        try:
            return int(json.loads((self.root / _FARM_MARKER).read_text()).get("generation", 0))
        except (FileNotFoundError, ValueError, AttributeError):
            return 0

    def ensure(self, log: Callable[[str], None]) -> None:
        """Create the hard-link farm once; an interrupted creation is redone from scratch, and so is
        a farm linked to an older extraction of the pristine tree."""
        generation = self.record.generation if self.record else 0
        if self.ready and self._linked_generation() >= generation:
            return
        repaired = self.record.repaired_since(self._linked_generation()) if self.ready and self.record else []
        log(f"stage: linking {self.pristine} -> {self.root}")
        self.root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.root.name}-", dir=self.root.parent))
        try:
            n_linked, n_copied = _link_tree(self.pristine, tmp)
            state = self._load_state()  # the variant's rewritten files: kept, they are real copies
            for rel in state:
                if (self.root / rel).is_file():
                    (tmp / rel).unlink(missing_ok=True)  # a link into the pristine tree: never write through it
                    shutil.copy2(self.root / rel, tmp / rel)
            for rel in repaired:  # recompiled: a fresh inode and mtime holding the pristine content
                if (self.pristine / rel).is_file() and rel not in state:
                    (tmp / rel).unlink(missing_ok=True)
                    atomic_write_bytes(tmp / rel, (self.pristine / rel).read_bytes())
            if state:
                atomic_write_json(tmp / _STATE, state)
            marker = {"pristine": str(self.pristine), "generation": generation}
            (tmp / _FARM_MARKER).write_text(json.dumps(marker) + "\n")
            if self.root.exists():
                shutil.rmtree(self.root)
            os.replace(tmp, self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"stage: {n_linked} files linked, {n_copied} copied" + (f", {len(repaired)} repaired" if repaired else ""))

    def sync(self, contents: dict[str, str], touched: list[str]) -> list[str]:
        """Make every file in ``touched`` (and any file an earlier variant changed) hold
        ``contents[path]``, or its pristine content when absent. Returns the paths rewritten."""
        state = self._load_state()
        changed = []
        for rel in dict.fromkeys([*state, *touched]):
            if rel in contents:
                desired: bytes | None = contents[rel].encode("utf-8")
            else:
                pristine = self.pristine / rel
                desired = pristine.read_bytes() if pristine.is_file() else None
            target = self.root / rel
            if desired is None:
                if target.exists():
                    target.unlink()
                    changed.append(rel)
                state.pop(rel, None)
                continue
            digest = sha256_bytes(desired)
            if state.get(rel) == digest and target.is_file():
                continue
            atomic_write_bytes(target, desired)
            state[rel] = digest
            changed.append(rel)
        atomic_write_json(self.root / _STATE, state)
        return changed

    def _load_state(self) -> dict[str, str]:
        try:
            return json.loads((self.root / _STATE).read_text())
        except (FileNotFoundError, ValueError):
            return {}


def _link_tree(src: Path, dst: Path) -> tuple[int, int]:
    linked = copied = 0
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        rel = Path(dirpath).relative_to(src)
        out_dir = dst / rel
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            s, d = Path(dirpath) / name, out_dir / name
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                continue
            try:
                os.link(s, d)
                linked += 1
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                    raise
                shutil.copy2(s, d)
                copied += 1
    return linked, copied
