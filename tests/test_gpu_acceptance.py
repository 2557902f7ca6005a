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


def _targets():
    import importlib.util

    spec = importlib.util.spec_from_file_location("targets", REPO / "tests" / "gpu" / "targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_allreduce", REPO / "benchmarks" / "cuda_allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_run_every_target_says_not_measured(tmp_path):
    out = _targets().table(tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| target")]
    assert len(rows) == 6, out
    assert all(line.endswith("| not measured |") for line in rows), out
    assert "PASS" not in out and "SHORT" not in out


def test_the_targets_come_from_the_runs_own_numbers(tmp_path):
    import json

    mib = 1 << 20
    sizes = [4, mib, 2 * mib, 4 * mib, 16 * mib, 64 * mib]
    # Invented timings (us) that make each verdict go one known way: staged wins up to 2 MiB, UCC after.
    staged = [300, 389, 645, 1157, 4225, 19734]
    ucc = [600, 700, 700, 710, 720, 900]
    jobs = {
        "staged": {"torch": "t", "ranks": 2, "gpu": "g", "staged_max_bytes": 0,
                   "rows": [{"bytes": b, "hpccomm": s, "gloo": 40 * u} for b, s, u in zip(sizes, staged, ucc)]},
        "ucc": {"torch": "t", "ranks": 2, "gpu": "g", "staged_max_bytes": 0,
                "rows": [{"bytes": b, "hpccomm": u} for b, u in zip(sizes, ucc)]},
        "auto": {"torch": "t", "ranks": 2, "gpu": "g", "staged_max_bytes": 2 * mib,
                 "rows": [{"bytes": b, "hpccomm": min(s, u) * (1.2 if b == 4 else 1.0)}
                          for b, s, u in zip(sizes, staged, ucc)]},
    }
    summary = _bench().summarise(jobs, {"ucc-triggered": "exit 1: no execution engine"})
    assert summary["threshold"] == 2 * mib, summary["threshold"]
    assert [r["best"] for r in summary["rows"]] == ["staged", "staged", "staged", "ucc", "ucc", "ucc"]
    (tmp_path / "compare.json").write_text(json.dumps(summary))
    perftest = ["Collective:             Allreduce", "       Count        Size                Time, us",
                "                                 avg         min         max"]
    perftest += [f"{b // 4:>12}{b:>12}{t:>12.2f}{t:>12.2f}{t:>12.2f}" for b, t in ((16 * mib, 707.0), (64 * mib, 700.0))]
    (tmp_path / "perftest-oop.txt").write_text("\n".join(perftest))
    floor = {"ranks": 1, "bytes": 4, "cases": ["staged, set_stream, join", "hpccomm all_reduce"],
             "per_rank": [[33.0, 45.0]]}
    (tmp_path / "floor-1.json").write_text(json.dumps(floor))
    out = _targets().table(tmp_path)
    verdicts = [line.rsplit("|", 2)[-2].strip() for line in out.splitlines() if line.startswith("| ") and "target" not in line]
    # 16 MiB: 707/720 >= 0.9; 64 MiB: 700/900 < 0.9; Gloo 36000/900 = 40x; auto 1.2x at 4 B; 45/33 = 1.36;
    # no tests/gpu logs: triggered not measured.
    assert verdicts == ["PASS", "SHORT", "PASS", "SHORT", "PASS", "not measured"], out
    assert "HPCCOMM_CUDA_STAGED_MAX_BYTES=2097152" in out
