#!/usr/bin/env python3
"""A one-node Slurm cluster on localhost, from Debian's packages, for trying the Slurm profile
and for tests/cluster/.

    python3 scripts/cluster/localslurm.py up  [--state DIR]   # prints `export SLURM_CONF=...`
    python3 scripts/cluster/localslurm.py down --state DIR    # cancels jobs, stops, checks

Everything lives under one state folder (configs, a fresh MariaDB data folder, a munge key,
sockets, spool, logs): nothing under /etc is read or written, and free ports are picked, so a
real Slurm or MariaDB on the same host is left alone. No systemd: each daemon runs in the
foreground as a child in its own session, its PID kept in ``pids.json``; started in the order
MariaDB, munged, slurmdbd, slurmctld, slurmd and stopped in reverse, by PID. Needs root (the
daemons switch to the ``munge`` and ``mysql`` users) and the packages of
scripts/cluster/install.sh. No third-party imports.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("mariadbd", "mariadb-install-db", "mariadb", "mungekey", "munged", "munge", "slurmdbd",
            "slurmctld", "slurmd", "sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol")
DAEMONS = ("mariadbd", "munged", "slurmdbd", "slurmctld", "slurmd")  # start order
MARKER = "KFORGE_LOCALSLURM"  # in every daemon's and (through SLURM_CONF) every job's environment


class ClusterError(RuntimeError):
    """The cluster could not be brought up or torn down; the message says which step."""


def missing_requirements() -> str | None:
    """Why this host cannot run the cluster (not root, binaries or users missing), or None."""
    if os.geteuid() != 0:
        return "needs root (the daemons switch to the munge and mysql users)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"missing {', '.join(missing)}: run scripts/cluster/install.sh (Debian packages)"
    for user in ("munge", "mysql"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no system user {user!r}: the munge / mariadb-server packages are not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _owned(path: Path, user: str, mode: int) -> Path:
    shutil.chown(path, user, user)
    path.chmod(mode)
    return path


@dataclass
class LocalSlurm:
    """One cluster under ``state``. ``start()`` brings it up; ``stop()`` tears it down and
    returns the processes it had to kill after the daemons stopped (none, when all is well)."""

    state: Path
    node: str = "kfnode"
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    db_password: str = field(default_factory=lambda: secrets.token_hex(12), repr=False)
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def conf(self) -> Path:
        return self.state / "etc" / "slurm.conf"

    @property
    def cluster_name(self) -> str:
        return "kf" + self.state.name.lower().replace("-", "").replace("_", "")[-10:]

    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (sbatch, sacct, Snakemake's executor) and jobs."""
        return {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.state)}

    # ------------------------------------------------------------------ bring-up
    def start(self, timeout: float = 60.0) -> None:
        why = missing_requirements()
        if why:
            raise ClusterError(why)
        for sub in ("etc", "log", "run", "spool/ctld", "spool/d"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        self.state.chmod(0o755)  # munge and mysql must reach their folders
        self.ports = {k: free_port() for k in ("mysql", "slurmdbd", "slurmctld", "slurmd")}
        try:
            self._start_mariadb(timeout)
            self._start_munge(timeout)
            self._write_slurm_configs()
            self._spawn("slurmdbd", ["slurmdbd", "-D"])
            self._wait(lambda: self._listening("slurmdbd"), timeout, "slurmdbd")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self._run_ok(["scontrol", "ping"], "UP"), timeout, "slurmctld")
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
            self._wait(self._node_idle, timeout, "slurmd (node idle)")
            self._wait(lambda: self._run_ok(["sacct", "-n", "-X", "-a"], ""), timeout, "sacct through slurmdbd")
        except BaseException:
            self.stop()
            raise

    def _start_mariadb(self, timeout: float) -> None:
        (self.state / "mysql").mkdir()
        datadir = _owned(self.state / "mysql", "mysql", 0o700)
        self._run(["mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={datadir}",
                   "--auth-root-authentication-method=normal", "--skip-test-db"], "mariadb-install-db")
        sock = datadir / "mysqld.sock"  # mariadbd runs as mysql: its files live in its folder
        self._spawn("mariadbd", [
            "mariadbd", "--no-defaults", "--user=mysql", f"--datadir={datadir}", f"--socket={sock}",
            f"--port={self.ports['mysql']}", "--bind-address=127.0.0.1", "--skip-name-resolve",
            "--innodb-buffer-pool-size=1G", "--innodb-lock-wait-timeout=900",
            f"--log-error={datadir / 'mariadbd.log'}", f"--pid-file={datadir / 'mariadbd.pid'}",
        ])
        client = ["mariadb", "--no-defaults", f"--socket={sock}", "-uroot"]
        self._wait(lambda: self._run_ok([*client, "-e", "select 1"], "1"), timeout, "mariadbd")
        self._run([*client, "-e",
                   "CREATE DATABASE slurm_acct_db; "
                   f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
                   "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"], "create the accounting database")

    def _start_munge(self, timeout: float) -> None:
        (self.state / "munge").mkdir()
        folder = _owned(self.state / "munge", "munge", 0o755)  # munged: the socket folder must be searchable by all
        key = folder / "munge.key"
        self._run(["mungekey", "--create", f"--keyfile={key}"], "mungekey")
        _owned(key, "munge", 0o600)
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                               f"--seed-file={folder / 'munged.seed'}"], user="munge")
        self._wait(lambda: self._run_ok(["munge", "-n", "-S", str(self.munge_socket)], "MUNGE:"), timeout, "munged")

    @property
    def munge_socket(self) -> Path:
        return self.state / "munge" / "munge.socket"

    def _write_slurm_configs(self) -> None:
        etc, log, run, spool = (self.state / s for s in ("etc", "log", "run", "spool"))
        cpus = os.cpu_count() or 1
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        munge = f"socket={self.munge_socket}"
        (etc / "slurm.conf").write_text("\n".join([
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo={munge}",
            f"StateSaveLocation={spool / 'ctld'}", f"SlurmdSpoolDir={spool / 'd'}",
            f"SlurmctldPidFile={run / 'slurmctld.pid'}", f"SlurmdPidFile={run / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}", f"SlurmdLogFile={log / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory", "DefMemPerCPU=1024",
            "SchedulerType=sched/backfill", "ReturnToService=2",
            "GresTypes=gpu",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['slurmdbd']}", "AccountingStorageTRES=gres/gpu",
            f"AccountingStoragePass={self.munge_socket}",  # the munge socket for slurmdbd connections
            "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=30",
            "AccountingStoreFlags=job_comment",  # sacct shows the rule Snakemake put in --comment
            # one fake GPU (gres.conf: File=/dev/null): GRES requests are scheduled, nothing runs on it
            f"NodeName={self.node} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} "
            f"RealMemory={max(mem_mb - 2048, 1024)} Gres=gpu:1 State=UNKNOWN",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        (etc / "gres.conf").write_text(f"NodeName={self.node} Name=gpu File=/dev/null\n")
        dbd = etc / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo={munge}", "DbdHost=localhost", "DbdAddr=127.0.0.1",
            f"DbdPort={self.ports['slurmdbd']}", "SlurmUser=root",
            f"PidFile={run / 'slurmdbd.pid'}", f"LogFile={log / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mysql']}", "StorageUser=slurm", f"StoragePass={self.db_password}",
            "StorageLoc=slurm_acct_db",
        ]) + "\n")
        dbd.chmod(0o600)

    # ------------------------------------------------------------------ tear-down
    def stop(self, timeout: float = 30.0) -> list[str]:
        """Cancel every job, stop the daemons in reverse order (SIGTERM, then SIGKILL), then
        kill and return what is left carrying this cluster's marker (``pid cmdline``)."""
        if "slurmctld" in self.pids and self._alive("slurmctld"):
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env(), capture_output=True, timeout=30)
            self._wait_quietly(lambda: self._run_ok(["squeue", "-h"], "", exact=True), timeout)
        for name in reversed(DAEMONS):
            if name in self.pids:
                self._terminate(name, timeout)
        leftovers = marked_processes(str(self.state))
        for pid, _ in leftovers:
            _kill(pid, signal.SIGKILL)
        self._save_pids()
        return [f"{pid} {cmd}" for pid, cmd in leftovers]

    def _terminate(self, name: str, timeout: float) -> None:
        pid = self.pids[name]
        _kill(pid, signal.SIGTERM)
        child = self._children.get(name)
        try:
            if child is not None:
                child.wait(timeout)
            else:
                self._wait(lambda: not _pid_alive(pid), timeout, f"{name} to exit")
        except (subprocess.TimeoutExpired, ClusterError):
            _kill(pid, signal.SIGKILL)
            if child is not None:
                child.wait(10)
        self.pids.pop(name)

    # ------------------------------------------------------------------ helpers
    def _spawn(self, name: str, argv: list[str], user: str | None = None) -> None:
        log = open(self.state / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the child holds it
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=self.env(), start_new_session=True,
                                 user=user, cwd=self.state)
        log.close()
        self._children[name], self.pids[name] = child, child.pid
        self._save_pids()

    def _save_pids(self) -> None:
        data = {"pids": self.pids, "ports": self.ports}
        (self.state / "pids.json").write_text(json.dumps(data, indent=1))

    def _alive(self, name: str) -> bool:
        child = self._children.get(name)
        return child.poll() is None if child is not None else _pid_alive(self.pids[name])

    def _run(self, argv: list[str], what: str) -> str:
        proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ClusterError(f"{what} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        return proc.stdout

    def _run_ok(self, argv: list[str], expect: str, exact: bool = False) -> bool:
        try:
            proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return False
        out = proc.stdout.strip()
        return proc.returncode == 0 and (out == expect if exact else expect in out)

    def _listening(self, name: str) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.ports[name])) == 0

    def _node_idle(self) -> bool:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True)
        return proc.returncode == 0 and proc.stdout.strip() == "idle"

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        if not self._wait_quietly(ready, timeout):
            died = [n for n in self.pids if not self._alive(n)]
            why = f"{', '.join(died)} exited" if died else f"timed out after {timeout:.0f} s"
            raise ClusterError(f"waiting for {what}: {why}\n{self.log_tail()}")

    def _wait_quietly(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return True
            if any(not self._alive(n) for n in self.pids):
                return False
            time.sleep(0.25)
        return False

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every daemon log, for error messages."""
        parts = []
        logs = [*sorted((self.state / "log").glob("*")), *(self.state / s / f"{n}.log" for s, n in
                (("munge", "munged"), ("mysql", "mariadbd")))]
        for path in (p for p in logs if p.is_file()):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _kill(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def marked_processes(state: str) -> list[tuple[int, str]]:
    """Live processes whose environment or command line names this cluster's state folder:
    its daemons, slurmstepd and every job process (jobs inherit SLURM_CONF)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        needle = state.encode()
        if (needle in environ or needle in cmdline) and _pid_alive(int(entry.name)):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--state", type=Path, help="state folder (up: a new one under /var/tmp by default)")
    args = parser.parse_args(argv)
    if args.action == "up":
        state = args.state or Path(tempfile.mkdtemp(prefix="kforge-slurm-", dir="/var/tmp"))
        cluster = LocalSlurm(state.resolve())
        try:
            cluster.start()
        except ClusterError as err:
            print(f"localslurm: {err}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={cluster.conf}\n# stop with: {sys.argv[0]} down --state {state}")
        return 0
    if args.state is None or not (args.state / "pids.json").is_file():
        print("localslurm: down needs --state DIR of a cluster started with up", file=sys.stderr)
        return 2
    saved = json.loads((args.state / "pids.json").read_text())
    cluster = LocalSlurm(args.state.resolve(), ports=saved["ports"], pids=saved["pids"])
    leftovers = cluster.stop()
    for line in leftovers:
        print(f"localslurm: killed leftover {line}", file=sys.stderr)
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
