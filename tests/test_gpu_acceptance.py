"""The GPU acceptance command's half that runs here (tests/gpu/acceptance.sh prepare), and its code compiling.

The GPU machine cannot download anything: ``prepare`` must assemble, on this
machine, the wheels ``run`` installs there. The GPU-only files must at least
compile here, where nothing runs them.
"""

from __future__ import annotations

import py_compile
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "gpu" / "acceptance.sh"


def test_prepare_assembles_the_bundle_the_gpu_machine_installs_from(tmp_path):
    bundle = tmp_path / "bundle"
    proc = subprocess.run(["bash", str(SCRIPT), "prepare", str(bundle)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(path.name for path in (bundle / "wheels").iterdir())
    assert any(name.startswith("cffi-") and "-cp312-" in name and "x86_64" in name for name in wheels), wheels
    assert any(name.startswith("pytest-") for name in wheels), wheels


def test_the_gpu_only_code_compiles_and_the_script_parses():
    for path in [*(REPO / "tests" / "gpu").rglob("*.py"), REPO / "benchmarks" / "cuda_allreduce.py",
                 REPO / "benchmarks" / "cuda_staging_floor.py", REPO / "hpccomm" / "transports" / "device_ops.py"]:
        py_compile.compile(str(path), doraise=True)
    for script in (SCRIPT, REPO / "tests" / "build_ucc.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
