"""A group's scratch for out-of-place reductions (hpccomm/transports/scratch.py), without a GPU.

The scratch's rules, with tests/fake_device.py: a buffer handed out is
never handed out again while the request holds it or before its copy back
has run on the stream; the copy back runs on the side stream after the
collective has ended (the host-gated path, scripted requests from
test_device_gated.py); buffers are reused, grow, and go with the group.
Over real UCC, every dtype and op through it: tests/test_ucc_cuda.py.
"""

from __future__ import annotations

import gc
import weakref

import torch
from fake_device import FakeDevice
from test_device_gated import Gated

from hpccomm.transports.scratch import GRANULE, Scratch


def test_a_buffer_fits_the_target_and_its_step_copies_it_back_on_the_current_stream():
    device = FakeDevice()
    scratch = Scratch(device, torch.device("cpu"))
    target = torch.zeros(2, 3, dtype=torch.float64)
    out, copy_back = scratch.take(target)
    assert out.dtype == target.dtype and out.numel() == target.numel() and out.dim() == 1
    out.copy_(torch.arange(6, dtype=torch.float64))
    device.hold(device.side)
    device.call_on(device.side, copy_back)
    assert target.sum() == 0, "copied before the side stream got there"
    device.release(device.side)
    assert target.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert scratch.nbytes == GRANULE


def test_a_buffer_is_not_handed_out_again_while_held_or_before_its_copy_back_has_run():
    device = FakeDevice()
    scratch = Scratch(device, torch.device("cpu"))
    target = torch.zeros(100)
    out, copy_back = scratch.take(target)
    address = out.data_ptr()
    second, second_back = scratch.take(target)
    assert second.data_ptr() != address, "handed out twice while the first request holds it"
    del second, second_back  # its operation failed: the step (which holds the buffer too) is dropped
    device.hold(device.side)
    device.call_on(device.side, copy_back)  # queued, not yet run
    del out, copy_back
    gc.collect()
    third, third_back = scratch.take(target)
    assert third.data_ptr() != address, "handed out before its copy back ran"
    assert scratch.nbytes == 2 * GRANULE  # the second's buffer, free again, was taken
    device.release(device.side)
    fourth, _ = scratch.take(target)
    assert fourth.data_ptr() == address, "not reused once its copy back had run"
    assert scratch.nbytes == 2 * GRANULE


def test_a_failed_operation_frees_its_buffer_once_nothing_holds_it():
    scratch = Scratch(FakeDevice(), torch.device("cpu"))
    out, copy_back = scratch.take(torch.zeros(10))
    address = out.data_ptr()
    del out, copy_back  # the request ended with an error: the copy back never runs
    again, _ = scratch.take(torch.zeros(10))
    assert again.data_ptr() == address and scratch.nbytes == GRANULE


def test_buffers_grow_by_replacing_a_free_one_and_the_smallest_that_fits_is_taken():
    scratch = Scratch(FakeDevice(), torch.device("cpu"))
    small, small_back = scratch.take(torch.zeros(10, dtype=torch.uint8))
    del small, small_back
    big, big_back = scratch.take(torch.zeros(GRANULE + 1, dtype=torch.uint8))
    assert scratch.nbytes == 2 * GRANULE, "the free, too small buffer was kept beside the larger one"
    del big, big_back
    again, _ = scratch.take(torch.zeros(3, dtype=torch.int32))
    assert again.numel() == 3 and scratch.nbytes == 2 * GRANULE


def test_close_gives_the_memory_back_once_each_copy_back_has_run():
    device = FakeDevice()
    scratch = Scratch(device, torch.device("cpu"))
    done, done_back = scratch.take(torch.zeros(4))
    done_back()
    pending, pending_back = scratch.take(torch.zeros(4))
    device.hold(device.side)
    device.call_on(device.side, pending_back)
    storages = [weakref.ref(buffer.storage) for buffer in scratch._buffers]
    del done, done_back, pending, pending_back
    scratch.close()
    gc.collect()
    assert scratch.nbytes == 0
    alive = [ref() is not None for ref in storages]
    assert alive == [False, True], f"freed a buffer whose copy back had not run, or kept a free one: {alive}"
    device.release(device.side)
    Scratch(device, torch.device("cpu")).close()  # a later close drops what has become free
    gc.collect()
    assert all(ref() is None for ref in storages)


def test_on_the_host_gated_path_the_copy_back_runs_on_the_side_stream_after_the_collective():
    gated = Gated()
    scratch = Scratch(gated.device, torch.device("cpu"))
    target = torch.full((3,), 1.0)
    out, copy_back = scratch.take(target)
    pending, request = gated.call("all_reduce", after=[copy_back], keep=(target, out))
    assert request.posted
    out.fill_(6.0)  # what UCC writes into the scratch
    gated.device.hold(gated.device.side)
    request.done = True
    assert not pending.test() and target.tolist() == [1.0, 1.0, 1.0], "copied back before the side stream ran"
    gated.device.release(gated.device.side)
    assert pending.test() and target.tolist() == [6.0, 6.0, 6.0]
    pending.finish()
    assert gated.device.trace.count(("call", "side")) == 1
    del out, copy_back, pending, request
    gc.collect()
    reused, _ = scratch.take(target)
    assert scratch.nbytes == GRANULE and reused.numel() == 3


def test_back_to_back_blocking_reductions_share_one_buffer_however_late_the_device_runs():
    # On an H100, three blocking 8 MiB all-reduces held two buffers: each copy back, queued on the
    # caller's stream, had not run when the next call took a buffer. The next post is gated on that
    # same stream, after the copy back: the buffer is free at once. Here the device runs nothing
    # until told (late), as a GPU that lags the host.
    gated = Gated(late=True)
    device = gated.device
    scratch = Scratch(device, torch.device("cpu"))
    target = torch.full((100,), 1.0)
    addresses = set()
    for call in range(3):
        out, copy_back = scratch.take(target, device.current_stream())
        addresses.add(out.data_ptr())
        pending, request = gated.call(f"all_reduce {call}", after=[copy_back], keep=(target, out))
        del out, copy_back
        device.run()  # the gate completes
        assert not pending.test_inline() and request.posted
        request.done = True
        assert pending.test_inline()  # the copy back queued on the caller's stream, not run
        pending.finish()
        del pending, request
    assert len(addresses) == 1 and scratch.nbytes == GRANULE, (len(addresses), scratch.nbytes)
    # An operation gated on another stream must wait for the copy back's event.
    other, _ = scratch.take(target, device.side_stream())
    assert other.data_ptr() not in addresses, "reused before its copy back ran on another stream"
    device.run()
    del other
    again, _ = scratch.take(target, device.side_stream())
    assert again.data_ptr() in addresses, "not reused once the copies back had run"


def test_an_operation_in_flight_beside_a_late_copy_back_gets_a_buffer_of_its_own():
    # Async: the copy back goes on the side stream; the next call (gated on the caller's) must
    # not take the buffer before that copy back has run.
    gated = Gated(late=True)
    device = gated.device
    scratch = Scratch(device, torch.device("cpu"))
    target = torch.zeros(10)
    out, copy_back = scratch.take(target, device.current_stream())
    first = out.data_ptr()
    pending, request = gated.call("all_reduce", after=[copy_back], keep=(target, out))
    del out, copy_back
    device.run()
    assert not pending.test() and request.posted
    request.done = True
    assert not pending.test()  # the local steps are queued on the side stream, not run
    second, _ = scratch.take(target, device.current_stream())
    assert second.data_ptr() != first, "handed out while its copy back on the side stream had not run"
    device.run()
    assert pending.test()



def test_a_buffer_too_small_goes_back_to_the_allocator_only_once_its_copy_back_cannot_be_overtaken():
    # torch's allocator hands a freed buffer's memory at once to the stream current when it was made (here the
    # caller's): one whose copy back still waits on another stream must not be freed to make room for a larger
    # one, though that stream's order makes it free for an operation gated there.
    device = FakeDevice(late=True)
    scratch = Scratch(device, torch.device("cpu"))
    out, copy_back = scratch.take(torch.zeros(10), device.current_stream())  # 1 MiB, made on the caller's stream
    device.call_on(device.side, copy_back)  # queued on the side stream, not run
    storage = weakref.ref(scratch._buffers[0].storage)
    del out, copy_back
    big, _ = scratch.take(torch.zeros(GRANULE), device.side)  # 4 MiB, gated on the side stream, after the copy back
    gc.collect()
    assert storage() is not None, "freed to the caller's stream before its copy back on the side stream ran"
    assert scratch.nbytes == 5 * GRANULE, scratch.nbytes
    device.run()  # the copy back has run: the small one may go now
    bigger, _ = scratch.take(torch.zeros(2 * GRANULE), device.side)  # 8 MiB
    gc.collect()
    assert storage() is None and scratch.nbytes == 12 * GRANULE, scratch.nbytes
    # One whose copy back went on the stream it was made on may go at once: the allocator orders its reuse after it.
    made_here, back = scratch.take(torch.zeros(3 * GRANULE), device.current_stream())  # 12 MiB
    device.call_on(device.current_stream(), back)  # not run
    del made_here, back
    scratch.take(torch.zeros(4 * GRANULE), device.current_stream())  # 16 MiB, in its place
    assert scratch.nbytes == 28 * GRANULE, scratch.nbytes
    del big, bigger
