"""Where the contents an undo restores are kept: a content-addressed store shared by sessions.

Used by the change scans (orchestrator/changes/tree_state.py), which keep every file's content as
they first see it, and by `warren undo` (orchestrator/changes/undo.py), which reads it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["ContentStore"]


class ContentStore:
    """File contents by SHA-256 under one directory, shared by sessions: one file per blob
    (`ab/cdef...`), and packs (`packs/<name>.pack` with a JSON index beside it) for the
    thousands of files a whole scan keeps at once (creating one file per blob cost 1.2 ms a
    file on the dev box; appending to one pack costs what writing the bytes costs).

    Nothing is fsynced (a first scan keeps a whole tree); `get` checks the hash instead, so a
    blob torn by a crash reads as missing and an undo that needs it refuses instead of
    restoring wrong bytes. A pack whose index was never written (a crash mid-scan) is ignored.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._packed: dict[str, tuple[Path, int, int]] | None = None
        self._pack: tuple[Path, BinaryIO, dict[str, tuple[Path, int, int]]] | None = None

    def _path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha[2:]

    def _index(self) -> dict[str, tuple[Path, int, int]]:
        if self._packed is None:
            self._packed = {}
            for idx in sorted((self.root / "packs").glob("*.idx")):
                with contextlib.suppress(OSError, ValueError, TypeError):
                    pack = idx.with_suffix(".pack")
                    for sha, (offset, size) in json.loads(idx.read_bytes()).items():
                        self._packed[sha] = (pack, int(offset), int(size))
        return self._packed

    def has(self, sha: str) -> bool:
        return self.locate(sha) is not None or self._path(sha).is_file()

    def locate(self, sha: str) -> tuple[Path, int, int] | None:
        """Where a packed blob is: (pack, offset, size); None when not packed."""
        if self._pack is not None and sha in self._pack[2]:
            return self._pack[2][sha]
        return self._index().get(sha)

    @contextlib.contextmanager
    def packing(self) -> Iterator[None]:
        """Blobs `put` inside the block go to one new pack, indexed when the block ends."""
        packs = self.root / "packs"
        packs.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = packs / f"{time.time_ns()}-{os.getpid()}-{threading.get_ident()}.pack"
        added: dict[str, tuple[Path, int, int]] = {}
        try:
            with path.open("xb") as out:
                self._pack = (path, out, added)
                try:
                    yield
                finally:
                    self._pack = None
        finally:
            # Also after a scan stopped half-way: what was written whole is indexed.
            self._index_pack(path, added)

    def _index_pack(self, path: Path, added: dict[str, tuple[Path, int, int]]) -> None:
        with contextlib.suppress(OSError):
            if not added:
                path.unlink()
                return
            idx = path.with_suffix(".idx")
            temp = idx.with_suffix(".tmp")
            temp.write_text(json.dumps({sha: [at, size] for sha, (_, at, size) in added.items()}))
            os.replace(temp, idx)
            self._index().update(added)

    def put(self, data: bytes) -> tuple[str, bool]:
        """Keep `data`; its hash and whether it was new to the store."""
        sha = hashlib.sha256(data).hexdigest()
        if self.has(sha):
            return sha, False
        if self._pack is not None:
            path, out, added = self._pack
            offset = out.tell()
            out.write(data)
            added[sha] = (path, offset, len(data))
            return sha, True
        path = self._path(sha)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return sha, True

    def get(self, sha: str) -> bytes | None:
        """The content with hash `sha`, or None when missing or damaged."""
        try:
            data = self._path(sha).read_bytes()
        except OSError:
            where = self.locate(sha)
            if where is None:
                return None
            try:
                with where[0].open("rb") as pack:
                    pack.seek(where[1])
                    data = pack.read(where[2])
            except OSError:
                return None
        return data if hashlib.sha256(data).hexdigest() == sha else None
