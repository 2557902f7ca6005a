"""Fault-tolerant mode: the survivors of a rank's death go on (``HPCCOMM_FT=1``, ``hpccomm-run --ft``).

By default a rank's death ends the job within seconds (:mod:`hpccomm.failure`).
In fault-tolerant mode hpccomm runs on MPI's User-Level Failure Mitigation
(ULFM: revoke, shrink, agree; Open MPI 5 started with ``--with-ft ulfm``).
One idea a module:

* :mod:`.transport`: each group's transports report an MPI error from a dead
  rank as the group's :class:`PeerFailure` (:mod:`.errors`), on every survivor;
* :mod:`.agreement`: the survivors agree which ranks died (revoke, then one
  shrink), having first said where each stopped (:mod:`.stop_points`) and
  evened out an operation completed on some of them only
  (:mod:`.kept_results`); ``dist.shrink_group`` builds their group;
* :mod:`.processes`: a node's ranks' processes, watched while an operation
  waits in shared memory, and ended once agreed failed;
* :mod:`.spares`: processes held back at launch (``--spares``) that take dead
  ranks' places, the group back at its size (:func:`repair`);
* :mod:`.state`: the training state a replacement receives from a survivor
  (:class:`TrainingState`);
* :mod:`.availability`: refusing a job whose MPI cannot go on after a death.

After a failure MPI is not finalised at exit
(:func:`hpccomm.world.skip_finalize`), and :mod:`hpccomm.torch_gaps` makes
torch register a shrunk group as the custom backend it is.
"""

from __future__ import annotations

from .agreement import Recovery
from .availability import check_available
from .errors import FailureSeen, PeerFailure, failed_ranks
from .spares import is_replacement, repair
from .state import TrainingState
from .transport import FaultTolerantTransport, protect

__all__ = [
    "FailureSeen",
    "FaultTolerantTransport",
    "PeerFailure",
    "Recovery",
    "TrainingState",
    "check_available",
    "failed_ranks",
    "is_replacement",
    "protect",
    "repair",
]
