"""benchmarks/cuda_call_stages.py, without a GPU: its stage stamps on the host-gated path, and both timings.

The stamps wrap the host-gated path's post and the end of its requests; here
they are read from operations through that path with scripted requests on the
simulated device (as tests/test_device_gated.py makes them), so a renamed
hook fails here rather than on a GPU. The whole benchmark runs at 2 ranks on
CPU tensors (``--device cpu``), where no path has those stages.
"""

from __future__ import annotations

import json

import pytest
from launch import run_ranks
from scripts import REPO, load_script
from test_device_gated import Gated

BENCHMARK = REPO / "benchmarks" / "cuda_call_stages.py"
stages = load_script(BENCHMARK)


def test_each_call_is_stamped_where_the_host_gated_path_posts_and_its_request_ends():
    gated = Gated(late=True)  # the caller's stream reaches the gate only when the device runs
    with stages.StageStamps() as stamps:
        for call in range(3):
            stamps.call()
            pending, request = gated.call(f"all_reduce {call}")
            assert "posted" not in stamps.calls[-1], "posted before the caller's stream reached the gate"
            gated.device.run()
            assert not pending.test_inline() and "posted" in stamps.calls[-1]
            request.done = True
            assert pending.test_inline()
            pending.finish()
            stamps.returned()
        since = stamps.stages_ms()  # what a failure of tests/gpu/ranks/cuda_ops.py names
        assert 0 < since["posted"] < since["ended"] <= since["returned"] <= stamps.ms_since_call(), since
    for call in stamps.calls:
        assert call["called"] < call["posted"] < call["ended"] <= call["returned"], call
    spans = stages.stage_us(stamps.calls)
    assert all(spans[stage] > 0 for stage in stages.STAGES), spans
    # Outside the context the path is as it was: nothing stamps.
    stamps.calls.append({"called": 0.0})
    pending, request = gated.call("after")
    gated.device.run()
    request.done = True
    assert pending.test_inline()
    assert stamps.calls[-1] == {"called": 0.0}


def test_a_path_without_the_gate_has_no_gate_ucc_or_after_stages():
    calls = [{"called": 1.0, "returned": 1.5}, {"called": 2.0, "ended": 2.2, "returned": 2.5}, {"called": 3.0,
                                                                                              "returned": 3.1}]
    spans = stages.stage_us(calls)
    assert spans["gate"] is None and spans["ucc"] is None and spans["after"] is None, spans
    assert spans["between"] == pytest.approx(0.5e6), spans  # the median of 0.5 s and 0.5 s


@pytest.mark.one_environment
def test_the_benchmark_times_both_ways_and_checks_the_values_on_cpu_tensors(tmp_path):
    out = tmp_path / "stages.json"
    run = run_ranks(2, str(BENCHMARK), "--device", "cpu", "--sizes", "4,65536", "--iters", "3", "--json", str(out),
                    limit_s=120)
    assert run.returncode == 0 and not run.timed_out, run.output
    result = json.loads(out.read_text())
    assert result["world"] == 2 and [row["bytes"] for row in result["rows"]] == [4, 65536], result
    for row in result["rows"]:
        assert row["right"] and row["alone_us"] > 0 and row["back_to_back_us"] > 0, row
        assert row["stages_us"]["gate"] is None and row["stages_us"]["between"] > 0, row  # no host gate on CPU
    assert "| 65536 |" in run.output and "| right |" in run.output, run.output
