"""What a rank started by hpccomm-run sees: its interpreter, PATH, MPI settings and world.

Imports hpccomm first: a rank running another interpreter (the system's
``python3``) fails right here with ``ModuleNotFoundError``. Then starts MPI
through hpccomm, which dies in ``MPI_Init`` when a setting names something
the library lacks (Open MPI 4 has no ``sm`` BTL).
"""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import os
import sys

import hpccomm
from rankcheck import say

ident = hpccomm.identity()
say(
    f"LAUNCHED rank={ident.rank} size={ident.world_size} prefix={sys.prefix} "
    f"path0={os.environ.get('PATH', '').split(os.pathsep)[0]} "
    f"btl={os.environ.get('OMPI_MCA_btl', '<unset>')}"
)
