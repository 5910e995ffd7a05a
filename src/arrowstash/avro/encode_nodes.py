"""The parts of an encode plan (see ``encode_plan``): node kinds, nodes, the error of an input
that does not fit, and the small normalisers every compiler uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowstash.avro.types import AvroType, describe

# Node kinds: keep in step with the enum in _encode.c.
(
    K_NULL, K_BOOL, K_INT32, K_INT64, K_INT64_AS_INT, K_FLOAT, K_DOUBLE, K_BINARY,
    K_LARGE_BINARY, K_FIXED, K_ENUM, K_ENUM_STRING, K_RECORD, K_ARRAY, K_MAP, K_UNION,
    K_DECIMAL_BYTES, K_DECIMAL_FIXED, K_UUID_STRING, K_DURATION, K_RAW,
) = range(21)  # fmt: skip
# K_RAW: a binary value written as it is (a recursive record's value kept as its own encoding).

Normalize = Callable[[Any], Any]


class PlanError(Exception):
    """An input type the schema cannot take, or a value that cannot be brought to its layout.

    ``path`` is the column path; encoder.py adds the row and raises AvroEncodeError.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


@dataclass(eq=False)
class Node:
    """One plan node: what to write for one Avro type read from one normalised Arrow array."""

    kind: int
    path: str
    avro: AvroType
    arrow: Any  # the normalised Arrow type this node reads
    kids: list[Node] = field(default_factory=list)
    null_branch: int = -1  # union index written for a null; -1: a null is an error
    value_branch: int = -1  # union index written before a value; -1: none
    p1: int = 0  # fixed size, symbol count, decimal fixed size, sparse-union flag
    p2: int = 0  # decimal byte width (16 or 32)
    symbols: tuple[str, ...] = ()
    id: int = -1

    def as_tuple(self) -> tuple[Any, ...]:
        """The plan as _cencode reads it."""
        syms = tuple(s.encode() for s in self.symbols) if self.kind == K_ENUM_STRING else ()
        return (
            self.kind, self.id, self.null_branch, self.value_branch, self.p1, self.p2,
            tuple(k.as_tuple() for k in self.kids), syms,
        )  # fmt: skip

    def walk(self) -> list[Node]:
        out = [self]
        for kid in self.kids:
            out.extend(kid.walk())
        return out



def same(arr: Any) -> Any:
    return arr



def cast_to(to: Any) -> Normalize:
    def norm(arr: Any) -> Any:
        return arr.cast(to)

    return norm


def unfit(path: str, t: AvroType, at: Any) -> PlanError:
    return PlanError(path, f"Arrow type {at} cannot be encoded as Avro {describe(t)}")



def is_uuid(at: Any) -> bool:
    return isinstance(at, pa.BaseExtensionType) and at.extension_name == "arrow.uuid"


def is_text(at: Any) -> bool:
    return bool(
        pa.types.is_string(at) or pa.types.is_large_string(at) or pa.types.is_string_view(at)
    )
