"""The GPU acceptance command's half that runs here (tests/gpu/acceptance.sh prepare), and its code compiling.

The GPU machine cannot download anything: ``prepare`` must assemble, on this
machine, the wheels ``run`` installs there, and the UCC source ``run`` builds
there (the shared autogen'd tarball, where found) with a libucx-cu13 wheel,
within what the device tool carries. The GPU-only files must at least compile
here, where nothing runs them.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "gpu" / "acceptance.sh"
#: Where prepare finds a UCC source tarball when given none (as .ci/run does).
UCC_TARBALLS = [REPO.parent / "shared" / "ucc" / "ucc-1.8.0-autogen.tar.gz",
                Path("/work/shared/ucc/ucc-1.8.0-autogen.tar.gz")]


def test_prepare_assembles_the_bundle_the_gpu_machine_installs_from(tmp_path):
    bundle = tmp_path / "bundle"
    proc = subprocess.run(["bash", str(SCRIPT), "prepare", str(bundle)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(path.name for path in (bundle / "wheels").iterdir())
    assert any(name.startswith("cffi-") and "-cp312-" in name and "x86_64" in name for name in wheels), wheels
    assert any(name.startswith("pytest-") for name in wheels), wheels
    if os.environ.get("HPCCOMM_UCC_SOURCE") or any(path.is_file() for path in UCC_TARBALLS):
        assert (bundle / "ucc-source.tar.gz").is_file(), proc.stdout
        assert any((bundle / "ucx").glob("libucx_cu13-*.whl")), proc.stdout
    size = sum(path.stat().st_size for path in bundle.rglob("*") if path.is_file())
    assert size < 60e6, f"the bundle takes {size / 1e6:.1f} MB: the device tool carries 64 MiB at most"


def test_the_gpu_only_code_compiles_and_the_script_parses():
    for path in [*(REPO / "tests" / "gpu").rglob("*.py"), REPO / "benchmarks" / "cuda_allreduce.py",
                 REPO / "benchmarks" / "cuda_staging_floor.py", REPO / "hpccomm" / "transports" / "device_ops.py"]:
        py_compile.compile(str(path), doraise=True)
    for script in (SCRIPT, REPO / "tests" / "build_ucc.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
