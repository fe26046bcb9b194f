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
"""

from __future__ import annotations

import hashlib
import json
import os
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
        if path.is_symlink() or not path.is_file() or sha256_bytes(path.read_bytes()) != digest:
            atomic_write(path, data)
        return digest

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
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} is not in the store at {self.blobs}") from None
        if sha256_bytes(data) != digest:
            self._quarantine(path, digest)
            raise CorruptBlob(
                f"blob {digest[:12]} failed verification (content hashes to {sha256_bytes(data)[:12]}); "
                f"moved to {self.quarantine}. Rerun the pipeline to regenerate it."
            )
        return data

    def get_text(self, digest: str) -> str:
        return self.get_bytes(digest).decode()

    def get_json(self, digest: str) -> Any:
        return json.loads(self.get_bytes(digest))

    def _quarantine(self, path: Path, digest: str) -> None:
        self.quarantine.mkdir(parents=True, exist_ok=True)
        target = self.quarantine / f"{digest}.{os.getpid()}"
        try:
            os.replace(path, target)
        except FileNotFoundError:
            pass

    # ---------------------------------------------------------------- action cache
    def _action_path(self, key: str) -> Path:
        _check_digest(key)
        return self.actions / key[:2] / f"{key[2:]}.json"

    def action_get(self, key: str) -> dict[str, Any] | None:
        """The cached result of an action, or None. A corrupt entry counts as a miss and is
        removed, and every blob it names must still verify."""
        path = self._action_path(key)
        if not path.is_file() or path.is_symlink():
            return None
        try:
            entry = json.loads(path.read_bytes())
            if entry.get("key") != key:
                raise ValueError("key mismatch")
            for digest in entry.get("blobs", []):
                self.get_bytes(digest)
        except (ValueError, StoreError):
            path.unlink(missing_ok=True)
            return None
        result: dict[str, Any] = entry["result"]
        return result

    def action_put(self, key: str, result: dict[str, Any], blobs: list[str] | None = None) -> None:
        """Record ``result`` for ``key``; ``blobs`` are digests the result depends on."""
        entry = {"key": key, "result": result, "blobs": sorted(blobs or [])}
        atomic_write(self._action_path(key), canonical_json(entry))
