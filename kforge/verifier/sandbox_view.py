"""What a sandboxed worker sees of the filesystem: a root built from nothing.

Until 2026-12 the sandbox showed the whole host read-only, and a candidate copied the expected
outputs out of the reference cache under ``~/.cache`` (verified, max error 0). A view names
every path the worker may see; nothing else exists inside::

    /usr /bin /lib /lib64 /sbin    the system (read-only; symlinks where the host has them)
    /etc                           the files programs read at start (loader cache, users,
                                   alternatives, time zone), nothing else: no keys, no configs
    /proc /sys /dev                the run's own procfs; /sys read-only; /dev minimal, or the
                                   whole of it with a GPU
    /tmp /dev/shm                  private, empty tmpfs mounts
    the interpreter                its prefixes and site-packages (read-only); the site folders
                                   entry by entry, less ``hide`` (numerical libraries a candidate
                                   must not call: ``foreign_libraries``)
    kforge                         the package folder alone, not the checkout around it (no
                                   ``artifacts/``: the store)
    ``ro_paths``                   the job's inputs: the problem's folder, the candidate's build
    the scratch                    read-write, the worker's HOME and working directory

``bwrap_args`` renders a view for bubblewrap; ``ro_mounts.py`` (root, no bwrap: the GPU hosts)
builds the same view in a fresh mount namespace and chroots into it. Mounts apply parents
first (by depth), so a folder bound inside another lands on top of it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import os
import shutil
import site
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # kforge/
SYSTEM = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
# /etc entries a worker's programs read: the loader, users and groups (getpwuid), name service
# switch, alternatives (cc, c++ for Triton's launcher), the time zone, the OS release
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
       "host.conf", "localtime", "alternatives", "os-release", "debian_version", "lsb-release", "mime.types")
# Libraries that compute: a candidate on a C++ platform must do its work in its own kernels
# (VERIFY.md: numpy's BLAS did the GEMM beside a trivial kernel and verified). Hidden from the
# candidate's import path on the cpu platform; the problem's own imports stay (``foreign_libraries``).
NUMERICAL = ("numpy", "scipy", "scipy_openblas32", "scipy_openblas64", "numba", "llvmlite", "numexpr",
             "jax", "jaxlib", "cupy", "cupyx", "cupy_backends", "sklearn", "scikit_learn", "tensorflow",
             "pandas", "polars", "pyarrow", "duckdb", "mkl", "tbb", "openblas", "dask", "xarray", "numpyro",
             "opt_einsum", "ml_dtypes")

PROC_HOST_WIDE = ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "scsi", "latency_stats")
WRITABLE_TMPFS = ("/tmp", "/dev/shm")  # the private, empty ones; every other tmpfs holds a view
Kind = Literal["ro", "rw", "dev", "tmpfs", "symlink", "proc", "devices"]


@dataclass(frozen=True)
class Mount:
    kind: Kind  # ro / rw / dev bind, tmpfs, symlink, the run's procfs, a minimal /dev
    dest: str
    source: str = ""  # what is bound; a symlink's target


@dataclass
class View:
    mounts: list[Mount] = field(default_factory=list)
    chdir: str = "/"

    def ordered(self) -> list[Mount]:
        """Parents first; one mount a destination (the last named wins)."""
        last: dict[str, Mount] = {}
        for m in self.mounts:
            last.pop(m.dest, None)
            last[m.dest] = m
        return sorted(last.values(), key=lambda m: m.dest.rstrip("/").count("/"))

    def bwrap_args(self) -> list[str]:
        flag = {"ro": "--ro-bind", "rw": "--bind", "dev": "--dev-bind"}
        args: list[str] = []
        for m in self.ordered():
            if m.kind in flag:
                args += [flag[m.kind], m.source, m.dest]
            elif m.kind == "tmpfs":
                args += ["--tmpfs", m.dest]
            elif m.kind == "symlink":
                args += ["--symlink", m.source, m.dest]
            elif m.kind == "proc":
                args += ["--proc", m.dest]
            elif m.kind == "devices":
                args += ["--dev", m.dest]
        for m in self.ordered():  # bwrap's tmpfs mounts are writable: those that hold a view read-only
            if m.kind == "tmpfs" and m.dest not in WRITABLE_TMPFS:
                args += ["--remount-ro", m.dest]
        return [*args, "--remount-ro", "/", "--chdir", self.chdir]

    def to_json(self) -> str:
        return json.dumps({"chdir": self.chdir, "mounts": [asdict(m) for m in self.ordered()]})

    def visible(self, path: Path | str) -> bool:
        """Whether ``path`` lies inside something this view shows (the tests' question)."""
        p = str(Path(path))
        best: Mount | None = None
        for m in self.ordered():
            if p == m.dest or p.startswith(m.dest.rstrip("/") + "/"):
                best = m
        if best is None:
            return False
        if best.kind in ("tmpfs", "proc", "devices"):
            return p == best.dest
        if best.kind == "symlink":
            return True
        return os.path.lexists(os.path.normpath(os.path.join(best.source, os.path.relpath(p, best.dest))))


def site_dirs() -> list[Path]:
    """Folders this interpreter imports third-party packages from."""
    found = []
    try:
        found += site.getsitepackages()
    except AttributeError:  # an old-style virtualenv
        pass
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return [Path(p) for p in dict.fromkeys(found) if Path(p).is_dir()]


def _is_hidden(entry: str, hide: frozenset[str]) -> bool:
    for name in hide:
        if entry == name or entry.startswith((name + ".", name + "-")):
            return True
    return False


def _site_mounts(folder: Path, hide: frozenset[str]) -> list[Mount]:
    """A site folder: bound whole, or (something to hide) entry by entry less the hidden ones
    (an empty folder on the path would still import, as a namespace package)."""
    if not hide:
        return [Mount("ro", str(folder), str(folder))]
    mounts = [Mount("tmpfs", str(folder))]
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    for entry in entries:
        if not _is_hidden(entry, hide):
            mounts.append(Mount("ro", str(folder / entry), str(folder / entry)))
    return mounts


def build_view(*, scratch: Path, ro_paths: Iterable[Path] = (), gpu: bool = False,
               hide: Iterable[str] = (), import_dirs: Iterable[Path] = ()) -> View:
    """The view of one run (module docstring). ``import_dirs``: the worker's PYTHONPATH; the
    checkout among them is reduced to its ``kforge`` package, any other is a site folder."""
    hidden = frozenset(hide)
    view = View(chdir=str(scratch))
    add = view.mounts.append
    for path in SYSTEM:
        p = Path(path)
        if p.is_symlink():
            add(Mount("symlink", path, os.readlink(p)))
        elif p.is_dir():
            add(Mount("ro", path, path))
    add(Mount("tmpfs", "/etc"))
    for name in ETC:
        if os.path.lexists(f"/etc/{name}"):
            add(Mount("ro", f"/etc/{name}", f"/etc/{name}"))
    add(Mount("proc", "/proc"))
    for part in PROC_HOST_WIDE:  # the host's sysctls and SysRq trigger: read-only, as container runtimes do
        if os.path.lexists(f"/proc/{part}"):
            add(Mount("ro", f"/proc/{part}", f"/proc/{part}"))
    if Path("/sys").is_dir():
        add(Mount("ro", "/sys", "/sys"))
    add(Mount("dev", "/dev", "/dev") if gpu else Mount("devices", "/dev"))
    add(Mount("tmpfs", "/dev/shm"))
    if gpu and Path("/run/nvidia-persistenced").is_dir():
        add(Mount("ro", "/run/nvidia-persistenced", "/run/nvidia-persistenced"))
    add(Mount("tmpfs", "/tmp"))
    sites = site_dirs()
    for p in interpreter_paths():
        if p not in sites:
            add(Mount("ro", str(p), str(p)))
    for folder in sites:
        view.mounts += _site_mounts(folder, hidden)
    for folder in import_dirs:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        if folder.resolve() == PACKAGE_DIR.parent:
            add(Mount("ro", str(PACKAGE_DIR), str(folder / PACKAGE_DIR.name)))
        elif folder not in sites:
            view.mounts += _site_mounts(folder, hidden)
    for folder in _loader_dirs():
        add(Mount("ro", str(folder), str(folder)))
    for p in ro_paths:
        p = Path(p)
        if p.exists():
            add(Mount("ro", str(p), str(p)))
    add(Mount("rw", str(scratch), str(scratch)))
    return view


TOOLS = ("cc", "gcc", "g++", "c++", "ld", "as", "nvcc", "ptxas", "ninja")  # what Triton, inductor and builds run


def _loader_dirs() -> list[Path]:
    """``LD_LIBRARY_PATH``, the CUDA root and the toolchain's prefixes, where they lie outside
    the system folders (a GPU host's gcc under /opt/gcc: Triton builds its launcher with it)."""
    found = [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(key):
            found.append(Path(os.environ[key]))
    for tool in (*TOOLS, *(os.environ[k].split()[0] for k in ("CC", "CXX") if os.environ.get(k))):
        where = shutil.which(tool)
        if where:
            for exe in {Path(where), Path(where).resolve()}:
                found.append(exe.parent.parent if exe.parent.name == "bin" else exe.parent)
    return [p for p in dict.fromkeys(found)
            if p.is_absolute() and p.is_dir() and p != Path("/") and not str(p).startswith(SYSTEM)]


def interpreter_paths() -> list[Path]:
    """Where this Python lives: its prefixes, the folder of its executable (a venv's ``bin``) and
    its site-packages (a virtual environment under /tmp is otherwise hidden by the private /tmp)."""
    found = [Path(sys.prefix), Path(sys.exec_prefix), Path(sys.base_prefix), Path(sys.executable).parent,
             Path(sys.executable).resolve().parent, *site_dirs()]
    return [p for p in dict.fromkeys(found) if p.is_absolute() and p != Path("/") and not str(p).startswith(SYSTEM)]


# --------------------------------------------------------------------------- what to hide


@functools.cache
def _module_dists() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def _dist_modules(dist: str) -> set[str]:
    return {m for m, dists in _module_dists().items() if dist in dists}


def _requirements(dist: str) -> set[str]:
    try:
        reqs = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    out = set()
    for req in reqs:
        if "extra ==" in req:
            continue
        name = req.split(";")[0].strip()
        for sep in "<>=!~[ (":
            name = name.split(sep)[0]
        if name:
            out.add(name)
    return out


def imported_modules(source: str) -> set[str]:
    """Top-level names a module's source imports (``import a.b``, ``from a import b``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def needed_by(source: str) -> set[str]:
    """Every top-level module a problem's imports bring along: its own imports and what their
    distributions require, transitively (a model file importing ``transformers`` needs numpy)."""
    modules = set(imported_modules(source))
    seen_dists: set[str] = set()
    todo = [d for m in modules for d in _module_dists().get(m, [])]
    while todo:
        dist = todo.pop()
        if dist.lower() in seen_dists:
            continue
        seen_dists.add(dist.lower())
        modules |= _dist_modules(dist)
        todo += list(_requirements(dist))
    return modules


def foreign_libraries(problem_source: str) -> list[str]:
    """The numerical libraries a cpu candidate does not see: ``NUMERICAL`` less what the
    problem itself imports (its reference must load in the candidate's process too)."""
    keep = needed_by(problem_source)
    return sorted(set(NUMERICAL) - keep)
