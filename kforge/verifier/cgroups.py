"""Per-run control groups: a process-count cap that holds as root (``pids.max``), a memory cap
the kernel enforces with its OOM killer, and a way to kill every process of a run.

Supports cgroup v1 (one hierarchy per controller, as on our CI VMs) and a pure v2 hierarchy.
``RunCgroup.create`` returns ``None`` when the host does not let us create groups; the sandbox
then falls back to dropping privileges with ``RLIMIT_NPROC`` (see ``sandbox.py``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


@dataclass
class RunCgroup:
    """The cgroups of one sandboxed run (one directory per v1 controller, or one v2 dir)."""

    dirs: list[Path]
    version: int
    pids_dir: Path
    memory_dir: Path | None
    _removed: bool = field(default=False, repr=False)

    @classmethod
    def create(cls, *, max_pids: int, memory_mb: int | None) -> RunCgroup | None:
        name = f"kforge-{uuid.uuid4().hex[:12]}"
        if (CGROUP_ROOT / "cgroup.controllers").is_file():
            return cls._create_v2(name, max_pids, memory_mb)
        return cls._create_v1(name, max_pids, memory_mb)

    @classmethod
    def _create_v1(cls, name: str, max_pids: int, memory_mb: int | None) -> RunCgroup | None:
        pids_parent = CGROUP_ROOT / "pids"
        if not (pids_parent / "cgroup.procs").is_file():
            return None
        dirs: list[Path] = []
        try:
            pids_dir = pids_parent / name
            pids_dir.mkdir()
            dirs.append(pids_dir)
            _write(pids_dir / "pids.max", str(max_pids))
            memory_dir: Path | None = None
            mem_parent = CGROUP_ROOT / "memory"
            if memory_mb is not None and (mem_parent / "cgroup.procs").is_file():
                try:
                    memory_dir = mem_parent / name
                    memory_dir.mkdir()
                    dirs.append(memory_dir)
                    limit = str(memory_mb * 1024 * 1024)
                    _write(memory_dir / "memory.limit_in_bytes", limit)
                    if (memory_dir / "memory.memsw.limit_in_bytes").exists():
                        _write(memory_dir / "memory.memsw.limit_in_bytes", limit)
                except OSError:
                    memory_dir = None  # RLIMIT_DATA still caps memory
        except OSError:
            for d in reversed(dirs):
                _rmdir_quiet(d)
            return None
        return cls(dirs=dirs, version=1, pids_dir=pids_dir, memory_dir=memory_dir)

    @classmethod
    def _create_v2(cls, name: str, max_pids: int, memory_mb: int | None) -> RunCgroup | None:
        try:
            controllers = (CGROUP_ROOT / "cgroup.subtree_control").read_text().split()
            if "pids" not in controllers:
                return None
            d = CGROUP_ROOT / name
            d.mkdir()
        except OSError:
            return None
        try:
            _write(d / "pids.max", str(max_pids))
            memory_dir = None
            if memory_mb is not None and "memory" in controllers:
                _write(d / "memory.max", str(memory_mb * 1024 * 1024))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
                memory_dir = d
        except OSError:
            _rmdir_quiet(d)
            return None
        return cls(dirs=[d], version=2, pids_dir=d, memory_dir=memory_dir)

    def procs_files(self) -> list[str]:
        """Files a freshly forked child writes its pid into (from ``preexec_fn``)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; True when it emptied."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return not self.pids()

    def hit_pids_limit(self) -> bool:
        events = _read_kv(self.pids_dir / "pids.events")
        return events.get("max", 0) > 0

    def hit_memory_limit(self) -> bool:
        if self.memory_dir is None:
            return False
        if self.version == 2:
            return _read_kv(self.memory_dir / "memory.events").get("oom_kill", 0) > 0
        oom = _read_kv(self.memory_dir / "memory.oom_control")
        if oom.get("oom_kill", 0) > 0:
            return True
        try:
            return int((self.memory_dir / "memory.failcnt").read_text().strip() or 0) > 0 and (
                oom.get("under_oom", 0) > 0 or oom.get("oom_kill", 0) > 0
            )
        except (OSError, ValueError):
            return False

    def remove(self) -> None:
        if self._removed:
            return
        self.kill_all()
        for d in reversed(self.dirs):
            _rmdir_quiet(d)
        self._removed = True


def _rmdir_quiet(d: Path) -> None:
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
