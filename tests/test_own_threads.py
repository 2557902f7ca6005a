"""What a transport has each of hpccomm's own threads do first (hpccomm/own_threads.py).

In a process of its own: the setups are process-wide. That the progress thread
runs them over real MPI, and what for (a CUDA graph another thread captures),
is checked by tests/ranks/device_paths.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_each_setup_runs_once_on_each_thread_that_gets_ready_even_one_added_after_it_started():
    script = textwrap.dedent("""
        import threading
        from hpccomm import own_threads

        ran = []
        def first(): ran.append(("first", threading.current_thread().name))
        def second(): ran.append(("second", threading.current_thread().name))
        def failing(): raise RuntimeError("no driver")

        own_threads.add_setup(first)
        own_threads.add_setup(first)  # the same setup again: not added twice
        go_on, added = threading.Event(), threading.Event()

        def serve():
            own_threads.ready()
            own_threads.ready()
            go_on.set()
            added.wait()
            own_threads.ready()  # what was added since, once
            own_threads.ready()

        thread = threading.Thread(target=serve, name="hpccomm-test")
        thread.start()
        go_on.wait()
        own_threads.add_setup(failing)
        own_threads.add_setup(second)
        added.set()
        thread.join()
        assert ran == [("first", "hpccomm-test"), ("second", "hpccomm-test")], ran
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stdout + result.stderr
    # The failing setup is reported once, naming the thread, and the thread goes on to the next setup.
    assert result.stderr.count("no driver") == 1, result.stderr
    assert "thread hpccomm-test" in result.stderr, result.stderr
