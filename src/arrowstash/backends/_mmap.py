"""Private memory maps that hold no file descriptor (Python's mmap keeps one until 3.13)."""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """Unmaps its pages when the last view of them is released."""

    __slots__ = ("address", "size")

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size

    def __del__(self) -> None:
        _libc.munmap(self.address, self.size)


def map_private(fd: int, size: int) -> memoryview:
    """Map ``size`` bytes of ``fd`` copy-on-write; the descriptor may be closed right after.

    The view is writable: writes go to private pages, never to the file, so a loaded array can be
    modified without changing the stored entry or another reader's copy.
    """
    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address is None or address == _MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mmap failed: {os.strerror(errno)}")
    pages = (ctypes.c_ubyte * size).from_address(address)
    pages._owner = _Mapping(address, size)  # type: ignore[attr-defined]
    return memoryview(pages).cast("B")
