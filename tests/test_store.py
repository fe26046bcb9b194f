from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kforge.store import BlobNotFound, CorruptBlob, Store, StoreError, canonical_json, digest_of


def test_roundtrip_and_canonical_json(tmp_path: Path) -> None:
    store = Store(tmp_path)
    d = store.put_json({"b": 1, "a": [1, 2]})
    assert store.get_json(d) == {"a": [1, 2], "b": 1}
    assert canonical_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    assert digest_of({"a": 2, "b": 1}) == digest_of({"b": 1, "a": 2})


def test_flipped_byte_is_quarantined(tmp_path: Path) -> None:
    store = Store(tmp_path)
    d = store.put_text("hello kernels")
    path = store.blob_path(d)
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlob, match="failed verification"):
        store.get_bytes(d)
    assert not path.exists()
    assert any(store.quarantine.iterdir())
    # Writing the blob again heals the store.
    assert store.put_text("hello kernels") == d
    assert store.get_text(d) == "hello kernels"


def test_truncated_blob_and_wrong_name(tmp_path: Path) -> None:
    store = Store(tmp_path)
    d = store.put_text("x" * 1000)
    store.blob_path(d).write_text("x" * 10)
    with pytest.raises(CorruptBlob):
        store.get_bytes(d)
    other = store.put_text("other")
    store.blob_path(other).write_text("not other")  # a blob under the wrong name
    with pytest.raises(CorruptBlob):
        store.get_text(other)


def test_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not overwrite")
    d = digest_of("payload")
    target = store.blob_path(d)
    target.parent.mkdir(parents=True)
    os.symlink(secret, target)
    with pytest.raises(CorruptBlob, match="symlink"):
        store.get_bytes(d)
    store.put_bytes(canonical_json("payload"))
    assert secret.read_text() == "do not overwrite"
    assert not store.blob_path(d).is_symlink()


def test_missing_blob_and_bad_digest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(BlobNotFound):
        store.get_bytes("0" * 64)
    with pytest.raises(StoreError, match="not a sha256"):
        store.get_bytes("../../etc/passwd")


def test_two_writers_of_the_same_blob(tmp_path: Path) -> None:
    store = Store(tmp_path)
    payload = os.urandom(1 << 20)
    digests: list[str] = []
    threads = [threading.Thread(target=lambda: digests.append(store.put_bytes(payload))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(digests)) == 1
    assert store.get_bytes(digests[0]) == payload
    leftovers = [p for p in store.blob_path(digests[0]).parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_action_cache_hit_miss_and_corrupt_dependency(tmp_path: Path) -> None:
    store = Store(tmp_path)
    key = digest_of({"stage": "compile", "source": "abc"})
    assert store.action_get(key) is None
    blob = store.put_text("build log")
    store.action_put(key, {"ok": True, "log": blob}, [blob])
    assert store.action_get(key) == {"ok": True, "log": blob}
    store.blob_path(blob).write_text("tampered")
    assert store.action_get(key) is None  # a result whose blobs fail verification is a miss
