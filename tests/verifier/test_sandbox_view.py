"""What a sandboxed run sees (``sandbox_view.py``): nothing of $HOME, the store, the checkout
around the package or the reference cache; no numerical library on the cpu platform unless the
problem imports it; the same view under bwrap and under root's unshare fallback."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from kforge.verifier.checks import static_check
from kforge.verifier.reasons import Reason
from kforge.verifier.sandbox import Limits, isolation_available, run_sandboxed
from kforge.verifier.sandbox_view import PACKAGE_DIR, build_view, foreign_libraries, site_dirs
from kforge.verifier.verify import reference_cache_dir

REPO = PACKAGE_DIR.parent

PROBE = """import errno, json, os, sys
def seen(p):
    return os.path.lexists(p)
try:
    import numpy
    np = numpy.__file__
except ImportError:
    np = None
print(json.dumps({p: seen(p) for p in sys.argv[1:]} | {"numpy": np}))
"""


def _modes() -> list[str]:
    modes = []
    if isolation_available() == "bwrap":
        modes.append("bwrap")
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("setpriv"):
        modes.append("unshare")
    return modes


def test_the_view_binds_the_package_not_the_checkout_and_hides_numerical_libraries(tmp_path: Path) -> None:
    view = build_view(scratch=tmp_path, hide=foreign_libraries("import torch"), import_dirs=[REPO])
    assert view.visible(PACKAGE_DIR / "store.py")
    assert not view.visible(REPO / "README.md") and not view.visible(REPO / "artifacts")
    assert not view.visible(Path.home() / ".cache") and not view.visible("/etc/shadow")
    assert view.visible("/etc/passwd") and view.visible(tmp_path)
    site = site_dirs()[0]
    assert view.visible(site / "torch")
    if (site / "numpy").exists():
        assert not view.visible(site / "numpy")
    # parents before children: the site folder's tmpfs comes after the prefix that holds it
    dests = [m.dest for m in view.ordered()]
    assert dests.index("/tmp") < dests.index(str(tmp_path))


def test_a_problem_that_imports_numpy_keeps_it() -> None:
    assert "numpy" in foreign_libraries("import torch")
    assert "numpy" not in foreign_libraries("import numpy as np\nimport torch")
    assert "scipy" in foreign_libraries("import numpy as np\nimport torch")


@pytest.mark.parametrize("mode", _modes())
def test_a_sandboxed_run_sees_no_home_no_store_no_reference_cache(mode: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_SANDBOX", mode)
    cache = reference_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "planted.json").write_text("{}")
    store = REPO / "artifacts"
    problem_dir = tmp_path / "problem"
    problem_dir.mkdir()
    (problem_dir / "p.py").write_text("x = 1\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    looked = [str(cache / "planted.json"), str(Path.home() / ".cache"), str(store), str(REPO / "README.md"),
              str(problem_dir / "p.py"), str(PACKAGE_DIR / "store.py"), "/etc/passwd", "/etc/shadow"]
    r = run_sandboxed([sys.executable, "-c", PROBE, *looked], scratch=scratch, stdin=b"",
                      env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(scratch)},
                      limits=Limits(timeout_s=60), ro_paths=[problem_dir], hide=foreign_libraries(""))
    assert r.mode.startswith(mode) and r.returncode == 0, r.stderr
    import json

    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen.pop("numpy") is None
    assert seen == {looked[0]: False, looked[1]: False, looked[2]: False, looked[3]: False, looked[4]: True,
                    looked[5]: True, "/etc/passwd": True, "/etc/shadow": False}, seen


def test_foreign_compute_is_a_static_finding() -> None:
    head = "import torch\nimport torch.nn as nn\n"
    body = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    reasons = {f.reason for f in static_check(head + "import numpy as np\n" + body, head, platform="cpu")}
    assert Reason.FOREIGN_COMPUTE in reasons
    assert Reason.FOREIGN_COMPUTE not in {
        f.reason for f in static_check(head + "import numpy as np\n" + body, head + "import numpy\n", platform="cpu")}
    by_hand = head + "import ctypes\nLIB = ctypes.CDLL('libopenblas.so')\n" + body
    assert Reason.FOREIGN_COMPUTE in {f.reason for f in static_check(by_hand, head, platform="cpu")}
    cpp = head + 'CPP_SOURCE = r"""void* h = dlopen("libtorch_cpu.so", 1); cblas_sgemm(1);"""\n' + body
    found = [f for f in static_check(cpp, head, platform="cpu") if f.reason == Reason.FOREIGN_COMPUTE]
    assert {m for f in found for m in ("dlopen", "cblas_sgemm") if m in f.message} == {"dlopen", "cblas_sgemm"}
