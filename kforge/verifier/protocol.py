"""The wire between a sandboxed worker and its parent.

The parent sends the job as JSON on the worker's stdin (with a per-run nonce); the worker
answers on a private pipe with frames::

    frame  = nonce (16 bytes) | header length (u32 LE) | header JSON | blob 0 | blob 1 | ...
    header = {"kind": "case" | "done" | "error" | ..., ..., "blobs": [len0, len1, ...]}

Tensors travel as raw little-endian bytes (float32/float64/int64) described in the header, so
the parent never unpickles anything and never runs candidate objects: a rigged ``__eq__`` or
a tensor subclass cannot cross the process boundary. The parent accepts exactly one ``done``
frame; frames with a wrong nonce, malformed frames, or bytes after ``done`` are tampering.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

NONCE_BYTES = 16
_LEN = struct.Struct("<I")
MAX_MESSAGE = 1 << 20


class ProtocolError(ValueError):
    """The result pipe held something our worker would not write: forged or corrupt."""


@dataclass
class Frame:
    header: dict[str, Any]
    blobs: list[bytes] = field(default_factory=list)


def tensor_bytes(t: Any) -> bytes:
    """A CPU tensor's elements as raw bytes in C order, without numpy (a cpu candidate's
    sandbox has none: ``sandbox_view.py``). The host's byte order is little-endian (x86-64,
    arm64), the wire's."""
    import ctypes

    data = t.detach().contiguous()
    n = data.numel() * data.element_size()
    return ctypes.string_at(data.data_ptr(), n) if n else b""


def encode_frame(nonce: bytes, header: dict[str, Any], blobs: list[bytes] | None = None) -> bytes:
    blobs = blobs or []
    head = dict(header, blobs=[len(b) for b in blobs])
    raw = json.dumps(head, allow_nan=True).encode()
    return b"".join([nonce, _LEN.pack(len(raw)), raw, *blobs])


def send_frame(fd: int, nonce: bytes, header: dict[str, Any], blobs: list[bytes] | None = None) -> None:
    data = memoryview(encode_frame(nonce, header, blobs))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def decode_frames(data: bytes, nonce: bytes) -> list[Frame]:
    """Split the pipe's bytes into frames; raise ProtocolError on anything forged or torn."""
    frames: list[Frame] = []
    pos = 0
    done = False
    while pos < len(data):
        if done:
            raise ProtocolError("bytes after the final frame (written after the worker finished)")
        if data[pos : pos + NONCE_BYTES] != nonce:
            raise ProtocolError("frame without this run's nonce")
        pos += NONCE_BYTES
        if pos + _LEN.size > len(data):
            raise ProtocolError("torn frame header")
        (hlen,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        try:
            header = json.loads(data[pos : pos + hlen])
        except (ValueError, UnicodeDecodeError) as err:
            raise ProtocolError(f"frame header is not JSON: {err}") from None
        if not isinstance(header, dict) or not isinstance(header.get("blobs"), list):
            raise ProtocolError("frame header has no blob table")
        pos += hlen
        blobs = []
        for size in header["blobs"]:
            if not isinstance(size, int) or size < 0 or pos + size > len(data):
                raise ProtocolError("torn blob")
            blobs.append(data[pos : pos + size])
            pos += size
        frames.append(Frame(header=header, blobs=blobs))
        done = header.get("kind") == "done"
    return frames


# --------------------------------------------------------------------------- tensor payloads

WIRE_DTYPES = {"float64": "<f8", "float32": "<f4", "int64": "<i8"}


def wire_dtype(torch_dtype: str) -> str:
    """Which wire type carries values of ``torch_dtype`` without loss."""
    if torch_dtype in {"torch.float64", "torch.complex128"}:
        return "float64"
    if "float" in torch_dtype or "complex" in torch_dtype:
        return "float32"
    return "int64"


# Messages between trusted processes (the parent, a worker's harness, the judge): length-prefixed
# JSON objects, small, never pickle.


def write_message(fd: int, data: dict[str, Any]) -> None:
    raw = json.dumps(data, allow_nan=True).encode()
    view = memoryview(_LEN.pack(len(raw)) + raw)
    while view:
        view = view[os.write(fd, view):]


def read_message(fd: int) -> dict[str, Any] | None:
    """One length-prefixed JSON object; None at EOF. Raises ValueError on anything malformed."""
    head = read_exact(fd, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes")
    body = read_exact(fd, n)
    if body is None:
        raise ValueError("torn message")
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("message is not an object")
    return data


def read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None if not buf else buf
        buf += chunk
    return buf
