"""Tensors past MPI's 32-bit element count are split into several MPI calls (2 GiB per rank)."""

from launch import assert_all_ranks_ok, run_ranks


def test_all_reduce_and_broadcast_past_2_pow_31_elements():
    run = run_ranks(2, "large_count.py", limit_s=300)
    assert_all_ranks_ok(run, 2)
