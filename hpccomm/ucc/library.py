"""The UCC library handle: ``ucc_init`` once per process, ``ucc_finalize`` last.

UCC is initialised in its single-thread mode and every call into it is made
under :attr:`Library.lock`: hpccomm's progress thread and the caller's thread
both drive collectives, and UCC's memory pools are process-wide, so calls on
different contexts must not overlap either. The lock costs less than UCC's
multi-thread mode, which locks inside every call.
"""

from __future__ import annotations

import threading
from typing import Any

from . import binding
from .errors import check


class Library:
    """An initialised UCC library.

    Use :meth:`instance`; ``ucc_finalize`` runs in :meth:`finalize`, after
    every context on it has been destroyed.
    """

    _instance: Library | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.binding = binding.load()
        ffi, lib = self.binding.ffi, self.binding.lib
        self.lock = threading.Lock()
        #: Contexts created on this library and not destroyed yet.
        self.contexts: set[Any] = set()
        config = ffi.new("ucc_lib_config_h *")
        check(self.binding, lib.ucc_lib_config_read(ffi.NULL, ffi.NULL, config), "ucc_lib_config_read")
        try:
            params = ffi.new("ucc_lib_params_t *")
            params.mask = lib.UCC_LIB_PARAM_FIELD_THREAD_MODE
            params.thread_mode = lib.UCC_THREAD_SINGLE
            handle = ffi.new("ucc_lib_h *")
            # ucc_init is static inline in ucc.h: it passes the header's API version.
            status = lib.ucc_init_version(lib.UCC_API_MAJOR, lib.UCC_API_MINOR, params, config[0], handle)
        finally:
            lib.ucc_lib_config_release(config[0])
        check(self.binding, status, "ucc_init")
        self.handle: Any = handle[0]

    @classmethod
    def instance(cls) -> Library:
        """The process's library, initialised on first use.

        Raises:
            UCCUnavailableError: hpccomm was built without UCC.
            UCCError: ``ucc_init`` failed.
        """
        if cls._instance is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = Library()
        return cls._instance

    def finalize(self) -> bool:
        """``ucc_finalize``, if no context is left; True if it ran.

        A context that could not be destroyed (an operation still in flight on
        it) keeps the library alive until the process ends.
        """
        if self.handle is None:
            return True
        if self.contexts:
            return False
        with self.lock:
            status = self.binding.lib.ucc_finalize(self.handle)
        self.handle = None
        if Library._instance is self:
            Library._instance = None
        check(self.binding, status, "ucc_finalize")
        return True
