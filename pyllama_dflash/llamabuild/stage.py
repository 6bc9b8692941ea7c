"""The staged tree a build compiles: the pristine llama.cpp tree, hard-linked, with the
files a patch touches replaced by real copies holding the variant's content.

The pristine tree is never written: every change goes through an atomic replace,
which gives the staged path a new inode (and a fresh mtime, so ninja recompiles it)
while the pristine file keeps its own. One stage serves every variant of a build
folder; switching variants rewrites only the files whose content differs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..files import atomic_write_bytes, atomic_write_json, sha256_bytes

_FARM_MARKER = ".pyllama-dflash-farm"
_STATE = ".pyllama-dflash-stage.json"
_SKIP_DIRS = {".git"}


class Stage:
    def __init__(self, root: Path, pristine: Path):
        self.root = root
        self.pristine = pristine

    @property
    def ready(self) -> bool:
        return (self.root / _FARM_MARKER).is_file()

    def ensure(self, log: Callable[[str], None]) -> None:
        """Create the hard-link farm once; an interrupted creation is redone from scratch."""
        if self.ready:
            return
        log(f"stage: linking {self.pristine} -> {self.root}")
        self.root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.root.name}-", dir=self.root.parent))
        try:
            n_linked, n_copied = _link_tree(self.pristine, tmp)
            (tmp / _FARM_MARKER).write_text(json.dumps({"pristine": str(self.pristine)}) + "\n")
            if self.root.exists():
                shutil.rmtree(self.root)
            os.replace(tmp, self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"stage: {n_linked} files linked, {n_copied} copied")

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
