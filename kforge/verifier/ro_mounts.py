"""The `unshare` sandbox's filesystem: every mount read-only except the run's scratch folder,
the namespace's own /proc, and private tmpfs mounts on /dev/shm and /tmp.

Run as a script (no kforge import: it starts the sandboxed worker) by
:func:`kforge.verifier.sandbox._wrap` inside a fresh mount namespace, as root, on hosts without
bwrap::

    python -I ro_mounts.py SCRATCH [KEEP...] -- setpriv ... -- python -m kforge.verifier.worker_main

It binds SCRATCH onto itself, remounts every other mount point read-only (keeping nosuid, nodev,
noexec and the atime flags), checks with statvfs that each one now is, and execs the rest of its argv, which
drops every capability (``setpriv --bounding-set -all``) so the worker cannot mount anything
writable again. Device nodes stay usable (a read-only mount does not stop writes to /dev/nvidia*).
If any mount point stays writable it exits with status 97 and says which, before the worker
runs: a candidate never runs with a writable root.

One exception: ``/proc``, the namespace's own procfs (``unshare --mount-proc``), stays writable.
With every mount read-only, CUDA's initialisation failed with error 304 ("OS call failed") in
every sandboxed job on the H200 and H100 hosts, and a read-only /proc stops a process naming its
threads (``pthread_setname_np`` on another thread writes ``/proc/self/task/TID/comm``), which the
CUDA runtime does for its helper threads: the likely cause. What
in /proc reaches beyond the sandbox's own processes (``/proc/sys``, ``/proc/sysrq-trigger``,
``/proc/irq``, ``/proc/bus``, ``/proc/fs``, ``/proc/acpi``, ``/proc/scsi``,
``/proc/latency_stats``: the host's sysctls and the SysRq trigger, which a root
without capabilities could still write by file mode) is bound onto itself and made read-only
like every other mount, as container runtimes do. With that, CUDA and Triton work inside
(scripts/sandbox_gpu_smoke.sh on the H100 and the H200, 2026-12-06).

``/dev/shm`` is a private tmpfs (1 GB, nosuid, nodev, noexec), empty and writable: torch's CUDA IPC,
which hands the candidate's outputs to the judge (``gpu_compare.py``, both in the sandbox),
creates its reference-count files there, and with the host's /dev/shm read-only every GPU
verification failed at its first shared tensor (H100, 2026-12-06). Nothing written there
outlives the sandbox or reaches the host.

``/tmp`` is a private tmpfs too, as bwrap's ``--tmpfs /tmp``, with the scratch and the
read-only inputs that lie under /tmp (``KEEP`` arguments) bound back at their own paths:
torch.compile's baseline, loaded from a warm job's kept caches, wrote under that job's scratch
path in /tmp, and failed with the host's /tmp read-only (H100, 2026-12-06).
"""

from __future__ import annotations

import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
ST_RDONLY = 1
# flags a remount keeps: a container's user namespace locks them (changing one is EPERM)
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
FAILED = 97


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
    """(mount point, the flags of KEEP it has) for every mount in this namespace."""
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


def _mount(libc: ctypes.CDLL, source: str | None, target: str, flags: int) -> int:
    rc = libc.mount(source.encode() if source else None, target.encode(), None, flags, None)
    return 0 if rc == 0 else ctypes.get_errno()


PROC = "/proc"
SHM = "/dev/shm"
SHM_OPTIONS = b"size=1g,mode=1777"
TMP = "/tmp"
TMP_OPTIONS = b"size=4g,mode=1777"
MNT_DETACH = 2
PROC_HOST_WIDE = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/acpi",
                  "/proc/scsi", "/proc/latency_stats")


def _private_tmp(libc: ctypes.CDLL, keep: list[str]) -> list[str]:
    """An empty tmpfs on /tmp, as bwrap's ``--tmpfs /tmp``, with the ``keep`` paths under it
    (the scratch, read-only inputs) bound back at their own paths; problems, else []."""
    hold = os.path.join(SHM, ".kforge-hold")  # the sandbox's own /dev/shm (mounted before)
    held = []
    for i, path in enumerate(keep):  # out of the way while /tmp is covered
        spot = os.path.join(hold, str(i))
        if os.path.isdir(path):
            os.makedirs(spot)
        else:
            os.makedirs(hold, exist_ok=True)
            open(spot, "w").close()
        if err := _mount(libc, path, spot, MS_BIND | MS_REC):
            return [f"{path} (hold: {os.strerror(err)})"]
        held.append((path, spot))
    if libc.mount(b"tmpfs", TMP.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, TMP_OPTIONS) != 0:
        return [f"{TMP} (private tmpfs: {os.strerror(ctypes.get_errno())})"]
    for path, spot in held:
        if os.path.isdir(spot):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        if err := _mount(libc, spot, path, MS_BIND | MS_REC):
            return [f"{path} (bind back: {os.strerror(err)})"]
        libc.umount2(spot.encode(), MNT_DETACH)
    return []


def lock_down(scratch: str, keep: list[str] | None = None) -> list[str]:
    """Make everything but ``scratch``, a private ``/tmp`` and ``/proc`` (less its host-wide
    parts) read-only; the mount points that are still writable. ``keep``: read-only inputs
    under /tmp that must stay visible (bwrap's ``--ro-bind``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if _mount(libc, None, "/", MS_REC | 0x40000):  # MS_PRIVATE: nothing leaks out of this namespace
        return ["/ (could not make the mount tree private)"]
    if err := _mount(libc, scratch, scratch, MS_BIND | MS_REC):
        return [f"{scratch} (bind: {os.strerror(err)})"]
    for part in PROC_HOST_WIDE:  # own mount points now: the read-only pass below takes them
        if os.path.exists(part) and (err := _mount(libc, part, part, MS_BIND | MS_REC)):
            return [f"{part} (bind: {os.strerror(err)})"]
    # a private, empty /dev/shm: CUDA IPC (the worker's outputs to the judge, both in here) makes
    # its reference-count files there; the host's /dev/shm is out of sight and stays untouched
    if os.path.isdir(SHM) and libc.mount(b"tmpfs", SHM.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                         SHM_OPTIONS) != 0:
        return [f"{SHM} (private tmpfs: {os.strerror(ctypes.get_errno())})"]
    # outer paths first: a scratch inside a kept folder is bound after (over) it
    under_tmp = sorted({p for p in [scratch, *(keep or [])] if p.startswith(TMP + "/") and os.path.exists(p)},
                       key=lambda p: p.count("/"))
    if os.path.isdir(TMP) and os.path.isdir(SHM) and (problems := _private_tmp(libc, under_tmp)):
        return problems
    inside = scratch.rstrip("/") + "/"
    points = [(p, f) for p, f in mount_points() if p not in (scratch, PROC, SHM, TMP) and not p.startswith(inside)]
    for point, flags in points:
        _mount(libc, None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    writable = []
    for point, _ in points:
        try:
            if not os.statvfs(point).f_flag & ST_RDONLY:
                writable.append(point)
        except OSError:  # a mount point hidden under another mount: not reachable
            continue
    return writable


def main(argv: list[str]) -> None:
    if "--" not in argv[2:] or len(argv) < 4:
        sys.exit("usage: ro_mounts.py SCRATCH [KEEP...] -- COMMAND...")
    split = argv.index("--", 2)
    scratch = os.path.realpath(argv[1])
    keep = [os.path.realpath(p) for p in argv[2:split]]
    writable = lock_down(scratch, keep)
    if writable:
        print(f"sandbox: could not make {', '.join(writable[:5])} read-only; not running the worker",
              file=sys.stderr)
        sys.exit(FAILED)
    os.chdir(scratch)
    os.execvp(argv[split + 1], argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv)
