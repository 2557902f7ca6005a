"""Waits forever in a function of its own name, as a hung rank does (tests/test_launch.py: a run past its limit).

No torch and no MPI: it only has to start, print READY and wait. SIGUSR1 prints
every thread's stack, as in every rankcheck script.
"""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import faulthandler
import os
import signal
import time

faulthandler.register(signal.SIGUSR1, all_threads=True)


def waiting_forever() -> None:
    while True:
        time.sleep(1)


print(f"READY pid={os.getpid()}", flush=True)
waiting_forever()
