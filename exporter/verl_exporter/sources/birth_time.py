"""When a file was created: ``statx``'s birth time, which no user can set (``touch -d`` and
``utime`` set the modification time only). None where the C library, the kernel or the file system
does not say (glibc before 2.28, Linux before 4.11, some network file systems)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BTIME = 0x800


class _Timestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("reserved", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    """``struct statx`` of <linux/stat.h>, up to the four times, and room for the rest."""

    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32), ("attributes", ctypes.c_uint64),
                ("nlink", ctypes.c_uint32), ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("mode", ctypes.c_uint16), ("spare0", ctypes.c_uint16), ("ino", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
                ("atime", _Timestamp), ("btime", _Timestamp), ("ctime", _Timestamp), ("mtime", _Timestamp),
                ("rest", ctypes.c_uint64 * 16)]


def _load() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    function.restype = ctypes.c_int
    return function


_STATX = _load()


def birth_time(path: str) -> float | None:
    """``path``'s birth time in unix seconds (a link's own, not its target's); None where unknown."""
    if _STATX is None:
        return None
    result = _Statx()
    if _STATX(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, ctypes.byref(result)) != 0:
        return None
    if not result.mask & _STATX_BTIME:
        return None
    return result.btime.tv_sec + result.btime.tv_nsec / 1e9
