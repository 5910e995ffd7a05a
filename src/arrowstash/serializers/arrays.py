"""NumPy arrays, and plain containers of them, as raw aligned sections: no pickle, no copies.

The container and its scalars are MessagePack (the standard serializer's types); each array is a
reference to a section holding its bytes, with dtype, shape and memory order beside it. Loading
executes no code, so this is safe on any backend; from a memory map, arrays view the map.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from arrowstash.entry.format import Encoded
from arrowstash.errors import CorruptEntryError, SerializationError
from arrowstash.serializers.standard import pack_checked, packer, unpack_checked, unpacker

_ARRAY = 64  # extension type code of an array reference; part of the stored format
_MAX_DEPTH = 32


def _plain_dtype(dtype: Any) -> bool:
    """Numeric, bool, datetime64, timedelta64 and fixed-width string dtypes."""
    return dtype.fields is None and dtype.kind in "biufcmMSU"


def is_array_tree(value: Any, depth: int = 0) -> bool:
    """An array of a plain dtype, or lists, tuples and str-keyed dicts nesting at least one such
    array among plain scalars and strings: what "auto" sends here."""
    return _tree(value, depth) is True


def _tree(value: Any, depth: int) -> bool | None:
    """True: holds an array and only allowed leaves; None: allowed leaves, no array; False: no."""
    cls = type(value)
    if cls.__name__ == "ndarray" and cls.__module__ == "numpy":
        return _plain_dtype(value.dtype)
    if depth > _MAX_DEPTH:
        return False
    if cls is list or cls is tuple:
        items: Any = value
    elif cls is dict:
        if not all(type(k) is str for k in value):
            return False
        items = value.values()
    else:
        return None if cls in (int, float, bool, str, bytes, type(None), complex) else False
    found: bool | None = None
    for item in items:
        kind = _tree(item, depth + 1)
        if kind is False:
            return False
        found = found or kind
    return found


def _section(array: Any) -> tuple[str, Any]:
    """The array's memory order and a flat byte view of it (one copy only if non-contiguous)."""
    import numpy as np

    if array.flags.c_contiguous:
        order, data = "C", array
    elif array.flags.f_contiguous:
        order, data = "F", array.T
    else:
        order, data = "C", np.ascontiguousarray(array)
    return order, data.reshape(-1).view(np.uint8)


class ArraySerializer:
    """NumPy arrays of plain dtypes (and containers of them), written straight from their memory.

    A loaded array views the stored buffer: writable, and private to this result, when that is a
    File backend's copy-on-write map or read-in copy; read-only where the buffer is (e.g. bytes
    from a wire backend).
    """

    name = "arrays"
    executes_code = False
    #: Results view their sections: callers may write to them.
    mutable_results = True

    def for_backend(self, remote: bool) -> ArraySerializer:
        return self

    def encode(self, value: Any) -> Encoded:
        sections: list[Any] = [b""]

        def array_ref(obj: Any) -> msgpack.ExtType | None:
            cls = type(obj)
            if cls.__name__ != "ndarray" or cls.__module__ != "numpy":
                return None
            if not _plain_dtype(obj.dtype):
                raise SerializationError(
                    f"arrays of dtype {obj.dtype} need serializer='buffers' (pickle)"
                )
            order, data = _section(obj)
            sections.append(data)
            ref = [len(sections) - 1, obj.dtype.str, list(obj.shape), order]
            return msgpack.ExtType(_ARRAY, msgpack.packb(ref))

        sections[0] = pack_checked(packer(array_ref), value)
        return Encoded(self.name, None, sections)

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        import numpy as np

        def array(code: int, data: bytes) -> Any:
            if code != _ARRAY:
                raise SerializationError(f"unknown MessagePack extension type {code}")
            index, dtype_str, shape, order = msgpack.unpackb(data)
            dtype = np.dtype(dtype_str)
            count = 1
            for n in shape:
                count *= n
            if not 0 < index < len(sections) or sections[index].nbytes != count * dtype.itemsize:
                raise CorruptEntryError(f"array section {index} does not match its shape")
            flat = np.frombuffer(sections[index], dtype=dtype, count=count)
            if order == "F":
                return flat.reshape(shape[::-1]).T
            return flat.reshape(shape)

        return unpack_checked(unpacker(array), sections[0])
