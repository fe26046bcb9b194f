"""Content-addressed store: blobs by sha256 and an action cache.

Layout under the store root (``artifacts/`` by default)::

    cas/sha256/ab/cdef...        blob, named by the sha256 of its bytes
    cas/actions/12/3456....json  action key -> result record (digests of outputs + summary)
    cas/quarantine/              blobs that failed verification on read, kept for inspection

Writes are atomic (temp file in the same folder, fsync, rename); a blob is verified on every
read and moved to quarantine on mismatch. An *action key* is the sha256 of the canonical JSON
of everything a stage really depends on (input digests, prompt and code digests, model
settings, tool versions), so a job that Snakemake reruns without a real change finds its
result here and does no work.

Concurrent writers (several processes, or jobs on several nodes over one shared folder, e.g.
NFS) are safe: a blob's bytes depend only on its name, so two writers of one blob write the
same bytes and the last rename wins harmlessly; temp names are unique (``mkstemp``, O_EXCL) and
renames stay within one folder, so a reader sees no file or a whole one. A reader that finds a
bad blob moves it aside and checks what it moved: a good blob a writer renamed into place in
the meantime goes back (the quarantine never eats a good blob). A blob missing on a first look
is looked up again after a fresh listing of its folder (an NFS client can cache "no such file"
for seconds after another node created it). Action entries are only ever replaced whole; a
corrupt one is removed only if it is still the bytes that were read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

HEX = frozenset("0123456789abcdef")


class StoreError(Exception):
    """Base for store failures."""


class BlobNotFound(StoreError):
    pass


class CorruptBlob(StoreError):
    """A blob's bytes do not hash to its name; it has been moved to quarantine."""


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, pydantic models dumped as JSON."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (an action key, a request key)."""
    return sha256_bytes(canonical_json(obj))


def _check_digest(digest: str) -> None:
    if len(digest) != 64 or not set(digest) <= HEX:
        raise StoreError(f"not a sha256 hex digest: {digest!r}")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never half.

    A symlink planted at ``path`` is replaced, never followed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_fresh(path: Path) -> bytes:
    """The bytes at ``path``; on "no such file", list its folder (which makes an NFS client
    revalidate cached lookups) and try once more before giving up."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        try:
            os.listdir(path.parent)
        except FileNotFoundError:
            raise FileNotFoundError(path) from None
        return path.read_bytes()


def _unique_suffix() -> str:
    """Unique across processes and hosts sharing one folder."""
    return f"{socket.gethostname()}.{os.getpid()}.{os.urandom(4).hex()}"


class Store:
    """Blobs and the action cache under one root folder."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.blobs = self.root / "cas" / "sha256"
        self.actions = self.root / "cas" / "actions"
        self.quarantine = self.root / "cas" / "quarantine"

    # ---------------------------------------------------------------- blobs
    def blob_path(self, digest: str) -> Path:
        _check_digest(digest)
        return self.blobs / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def put_bytes(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        path = self.blob_path(digest)
        if path.is_symlink() or not self._holds(path, digest):
            atomic_write(path, data)
        return digest

    @staticmethod
    def _holds(path: Path, digest: str) -> bool:
        """The file at ``path`` is there and hashes to ``digest``. A reader may move a bad copy
        aside between the look and the read (``_quarantine``): gone is not there."""
        try:
            return sha256_bytes(path.read_bytes()) == digest
        except (FileNotFoundError, IsADirectoryError):
            return False

    def put_text(self, text: str) -> str:
        return self.put_bytes(text.encode())

    def put_json(self, obj: Any) -> str:
        return self.put_bytes(canonical_json(obj))

    def get_bytes(self, digest: str) -> bytes:
        path = self.blob_path(digest)
        if path.is_symlink():
            self._quarantine(path, digest)
            raise CorruptBlob(f"blob {digest[:12]} was a symlink; moved to {self.quarantine}")
        try:
            data = _read_fresh(path)
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} is not in the store at {self.blobs}") from None
        if sha256_bytes(data) != digest:
            healed = self._quarantine(path, digest)
            if healed is not None:  # a writer renamed the good blob into place while we looked
                return healed
            raise CorruptBlob(
                f"blob {digest[:12]} failed verification (content hashes to {sha256_bytes(data)[:12]}); "
                f"moved to {self.quarantine}. Rerun the pipeline to regenerate it."
            )
        return data

    def check_blob(self, digest: str) -> str | None:
        """What is wrong with the stored blob ``digest``, or None when it is there and its bytes
        hash to its name. Read-only: unlike :meth:`get_bytes` nothing is quarantined, so an
        inspection (``kforge provenance``, ``kforge audit``) changes nothing and says the same
        thing when run again."""
        try:
            path = self.blob_path(digest)
        except StoreError as err:
            return str(err)
        if path.is_symlink():
            return f"{path} is a symlink, not a blob"
        try:
            data = _read_fresh(path)
        except FileNotFoundError:
            return f"not in the store at {path}"
        except OSError as err:
            return f"cannot read {path}: {err.strerror or err}"
        actual = sha256_bytes(data)
        return None if actual == digest else f"store copy hashes to {actual[:16]}, not {digest[:16]}: tampered"

    def get_text(self, digest: str) -> str:
        return self.get_bytes(digest).decode()

    def get_json(self, digest: str) -> Any:
        return json.loads(self.get_bytes(digest))

    def _quarantine(self, path: Path, digest: str) -> bytes | None:
        """Move a bad blob aside. A concurrent writer may have renamed the good blob into place
        after our read: then what was moved verifies, goes back (any good copy has the same
        bytes, so replacing another is harmless) and its bytes are returned; else None."""
        self.quarantine.mkdir(parents=True, exist_ok=True)
        target = self.quarantine / f"{digest}.{_unique_suffix()}"
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return None
        if not target.is_symlink():
            data = target.read_bytes()
            if sha256_bytes(data) == digest:
                os.replace(target, path)
                return data
        return None

    # ---------------------------------------------------------------- action cache
    def _action_path(self, key: str) -> Path:
        _check_digest(key)
        return self.actions / key[:2] / f"{key[2:]}.json"

    def action_get(self, key: str) -> dict[str, Any] | None:
        """The cached result of an action, or None. Every blob the entry names must still
        verify; if one does not, it is a miss (the recomputed result replaces the entry). A
        corrupt entry is a miss and is removed, unless a writer replaced it meanwhile."""
        path = self._action_path(key)
        if path.is_symlink():
            return None
        try:
            raw = _read_fresh(path)
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("result"), dict):
                raise ValueError("not an entry for this key")
        except ValueError:
            self._remove_if_unchanged(path, raw)
            return None
        try:
            for digest in entry.get("blobs", []):
                self.get_bytes(digest)
        except StoreError:
            return None
        result: dict[str, Any] = entry["result"]
        return result

    def _remove_if_unchanged(self, path: Path, seen: bytes) -> None:
        """Remove ``path`` if it still holds ``seen``: moved aside first (atomic), then put
        back if a writer had replaced it after our read."""
        aside = path.with_name(f".{path.name}.{_unique_suffix()}.bad")
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            return
        if aside.read_bytes() == seen:
            aside.unlink(missing_ok=True)
        else:
            os.replace(aside, path)

    def action_put(self, key: str, result: dict[str, Any], blobs: list[str] | None = None) -> None:
        """Record ``result`` for ``key``; ``blobs`` are digests the result depends on."""
        entry = {"key": key, "result": result, "blobs": sorted(blobs or [])}
        atomic_write(self._action_path(key), canonical_json(entry))
