"""The `unshare` sandbox's filesystem: the run's view (``sandbox_view.py``) built from nothing,
then a chroot into it. For hosts without bwrap (the GPU hosts), as root.

Run as a script (no kforge import: it starts the sandboxed worker) by
:func:`kforge.verifier.sandbox._wrap` inside a fresh mount and PID namespace::

    python -I ro_mounts.py VIEW_JSON -- setpriv ... -- python -m kforge.verifier.worker_main

It makes the mount tree private, mounts an empty tmpfs as the new root (on the namespace's own
``/dev/shm``, which no view binds), binds into it what the view names (the system folders
recursively, everything else not), makes every mount in it read-only but the scratch, the
private ``/tmp`` and ``/dev/shm``, the namespace's own ``/proc`` and (with a GPU) ``/dev``,
chroots into it, checks with statvfs that each mount is as it should be, and execs the rest of
its argv, which drops every capability (``setpriv --bounding-set -all``), so the worker can
neither mount nor chroot again. If anything fails it exits with status 97 and says what,
before the worker runs: a candidate never runs in a half-built view.

``/proc`` is the namespace's own procfs (``unshare --mount-proc``) and stays writable: with it
read-only CUDA's initialisation failed with error 304 ("OS call failed") on the H200 and H100
hosts (the CUDA runtime names its helper threads through ``/proc/self/task/TID/comm``). The view
binds its host-wide parts (``/proc/sys``, ``/proc/sysrq-trigger``, ...) read-only on top. ``/dev/shm`` is a private tmpfs: torch's CUDA IPC (the
candidate's outputs to the judge, both inside) makes its files there.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
ST_RDONLY = 1
# flags a remount keeps: a container's user namespace locks them (changing one is EPERM)
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
FAILED = 97
STAGE = "/dev/shm"  # the namespace's own tmpfs goes here first; the new root is a tmpfs under it
RECURSIVE = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/sys")
WRITABLE_TMPFS = ("/tmp", "/dev/shm")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


class ViewError(RuntimeError):
    pass


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points() -> list[tuple[str, int]]:
    """(mount point, the flags of KEEP it has) for every mount this process can see."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            options = parts[5].split(",")
            flags = sum(bit for name, bit in KEEP.items() if name in options)
            if "noatime" not in options and "relatime" not in options:
                flags |= MS_STRICTATIME
            found.append((_unescape(parts[4]), flags))
    return found


class Mounter:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        rc = self.libc.mount(source.encode() if source else None, target.encode(),
                             fstype.encode() if fstype else None, flags, data.encode() if data else None)
        if rc != 0:
            err = ctypes.get_errno()
            raise ViewError(f"mount {source or fstype} on {target}: {os.strerror(err)}")

    def chroot(self, path: str) -> None:
        if self.libc.chroot(path.encode()) != 0:
            raise ViewError(f"chroot {path}: {os.strerror(ctypes.get_errno())}")


def _mount_point(target: str, like: str | None) -> None:
    """Create what a bind of ``like`` (None: a folder) needs at ``target``."""
    if like is not None and not os.path.isdir(like):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            open(target, "w").close()
    else:
        os.makedirs(target, exist_ok=True)


def build_root(view: dict, m: Mounter) -> tuple[str, set[str]]:
    """Mount the view under a fresh tmpfs; returns (the new root, its writable mount points)."""
    m.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing leaks out of this namespace
    m.mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=755")
    root = os.path.join(STAGE, "root")
    os.makedirs(root)
    m.mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=755")
    writable: set[str] = set()
    for spec in view["mounts"]:
        kind, dest, source = spec["kind"], spec["dest"], spec.get("source", "")
        target = root + dest
        if kind in ("ro", "rw", "dev"):
            if not os.path.lexists(source):
                continue
            _mount_point(target, source)
            rec = MS_REC if dest in RECURSIVE else 0
            m.mount(source, target, None, MS_BIND | rec)
            if kind != "ro":
                writable.add(dest)
        elif kind == "tmpfs":
            _mount_point(target, None)
            mode = "1777" if dest in WRITABLE_TMPFS else "755"
            m.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size=4g,mode={mode}")
            if dest in WRITABLE_TMPFS:
                writable.add(dest)
        elif kind == "symlink":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(source, target)
        elif kind == "proc":  # the namespace's own procfs (unshare --mount-proc); the view binds
            _mount_point(target, None)  # its host-wide parts read-only on top
            m.mount("/proc", target, None, MS_BIND)
            writable.add(dest)
        elif kind == "devices":  # a minimal /dev, as bwrap's --dev
            _mount_point(target, None)
            m.mount("tmpfs", target, "tmpfs", MS_NOSUID, "size=1m,mode=755")
            for name in DEVICES:
                if os.path.exists(f"/dev/{name}"):
                    _mount_point(f"{target}/{name}", f"/dev/{name}")
                    m.mount(f"/dev/{name}", f"{target}/{name}", None, MS_BIND)
            for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(to, f"{target}/{name}")
        else:
            raise ViewError(f"unknown mount kind {kind!r}")
    for point, flags in mount_points():
        if point != root and not point.startswith(root + "/"):
            continue
        if (point[len(root):] or "/") in writable:  # device nodes stay usable on a read-only mount
            continue
        try:
            m.mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except ViewError:
            m.mount(None, point, None, MS_REMOUNT | MS_RDONLY | flags)  # a tmpfs remounts without MS_BIND
    return root, writable


def still_writable(writable: set[str]) -> list[str]:
    """After the chroot: mount points that should be read-only and are not."""
    bad = []
    for point, _ in mount_points():
        if point in writable:
            continue
        try:
            if not os.statvfs(point).f_flag & ST_RDONLY:
                bad.append(point)
        except OSError:  # hidden under another mount: not reachable
            continue
    return bad


def enter(view: dict) -> None:
    m = Mounter()
    root, writable = build_root(view, m)
    m.chroot(root)
    os.chdir(view.get("chdir") or "/")
    bad = still_writable(writable)
    if bad:
        raise ViewError(f"could not make {', '.join(bad[:5])} read-only")


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: ro_mounts.py VIEW_JSON -- COMMAND...")
    try:
        view = json.loads(argv[1])
        enter(view)
    except (ViewError, OSError, ValueError) as err:
        print(f"sandbox: the view was not built ({err}); not running the worker", file=sys.stderr)
        sys.exit(FAILED)
    os.execvp(argv[3], argv[3:])


if __name__ == "__main__":
    main(sys.argv)
