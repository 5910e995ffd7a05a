"""``encode``: Arrow record batches and tables -> one Avro binary datum per row."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

import arrowstash.avro._python.encoder as _encode
from arrowstash import config
from arrowstash.avro.encode_nodes import K_RECORD, Node, PlanError
from arrowstash.avro.encode_plan import Plan, compile_plan, same_layout
from arrowstash.avro.schema import Schema, SchemaLike, parse_schema
from arrowstash.avro.threads import thread_count
from arrowstash.avro.writer_decoder import warn_pure_python
from arrowstash.errors import AvroEncodeError

__all__ = ["encode"]

# Below this many rows per thread, starting a thread costs more than it saves.
_MIN_ROWS_PER_THREAD = 4096


def encode(data: Any, schema: SchemaLike, *, threads: int | None = None) -> Any:
    """Encode every row of ``data`` as one Avro binary datum (no framing, no header).

    ``data`` is a ``pa.RecordBatch`` or ``pa.Table`` (every chunk, one result). A record schema
    takes its fields from the columns of the same name (extra columns are ignored); any other
    schema encodes the single column. Columns may hold the types of the Arrow mapping or
    compatible ones (other integer widths, large or view strings, other time units, plain or
    dictionary strings for enums...: see ``arrowstash.avro.encode_plan``).

    Returns a ``pa.BinaryArray`` whose data buffer is the datums back to back, so they can be
    framed or written to an Object Container File without copying (a ``pa.LargeBinaryArray``
    when they exceed 2 GiB). The native encoder releases the GIL and splits the rows across
    ``threads`` (None: the cores this process may use); the output does not depend on it.
    Without the compiled extension (or with ``ARROWSTASH_AVRO_NATIVE=0``) a pure-Python encoder
    gives the same bytes and errors, on one thread.

    A value that does not fit raises AvroEncodeError naming the row and the column path (an int
    out of range, a null in a non-nullable field, a symbol not in the enum, a fixed of the
    wrong size, a decimal too wide for its fixed, ...).
    """
    parsed = parse_schema(schema)
    batches = [b for b in _batches(data) if b.num_rows]
    try:
        plan = _plan_for(parsed, batches[0].schema if batches else data.schema)
    except PlanError as exc:
        raise AvroEncodeError(f"column {exc.path!r}: {exc.message}") from None
    row = sum(b.num_rows for b in batches)
    native = _native()
    if plan.passthrough is not None and native is not None:
        # the batches as they are: no struct array to build, no type to check (the plan did)
        arrays = [b.select(plan.passthrough) if plan.passthrough else b for b in batches]
    else:
        arrays = _normalized(plan, batches)
    if native is None:
        return _encode_python(plan.root, arrays)
    n_threads = _thread_count(threads, row)
    capsules = [a.__arrow_c_array__()[1] for a in arrays]
    data, offsets, large, _, error = native.encode(
        _native_plan(plan), capsules, n_threads, _scratch_guess(arrays, row)
    )
    if error is not None:
        raise _describe_native_error(plan, _normalized(plan, batches), error)
    # the native encoder's own memory, read in place (it takes the memory back once released)
    kind = pa.large_binary() if large else pa.binary()
    return pa.Array.from_buffers(kind, row, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# Above this many bytes of input buffers, the scratch guess takes the exact size of the rows
# (a small batch may be a slice of a large table, whose whole buffers its arrays hold).
_EXACT_GUESS_ABOVE = 64 << 20


def _scratch_guess(arrays: Sequence[Any], rows: int) -> int:
    """Bytes of scratch for the output: the input's size and 8 a row (the native encoder grows
    a scratch that fills up). The size is the buffers' total, which pyarrow sums in C: ``nbytes``,
    which trims slices, took 1.9 us a column (0.38 ms of a 0.59 ms encode of 100 rows of 200
    fields), so it is asked only when the total is large enough to be a slice's whole table."""
    size = sum(a.get_total_buffer_size() for a in arrays)
    if size > _EXACT_GUESS_ABOVE:
        size = sum(a.nbytes for a in arrays)
    return int(size) + 8 * rows + 4096


_cencode: Any
try:  # the compiled encoder; absent where the package was installed without a compiler
    _cencode = importlib.import_module("arrowstash.avro._native._cencode")
except ImportError:  # pragma: no cover - depends on the build
    _cencode = None


@functools.lru_cache(maxsize=64)
def _compiled(schema: Schema, input_schema: Any) -> Plan:
    """Plans are compiled once per (schema, input Arrow schema): small batches stay cheap."""
    return compile_plan(schema.root, input_schema)


@functools.lru_cache(maxsize=64)
def _native_plan(plan: Plan) -> Any:
    """The plan as the C encoder holds it, parsed once per plan rather than in every call."""
    return _cencode.Plan(plan.native)


_last: tuple[Schema, Plan] | None = None


def _plan_for(schema: Schema, input_schema: Any) -> Plan:
    """The last call's plan when the schemas are the same ones (or equal), else _compiled's:
    hashing an Arrow schema for the cache walks every field's type in Python."""
    global _last
    last = _last
    if last is not None and last[0] is schema and (
        last[1].input_schema is input_schema or last[1].input_schema.equals(input_schema)
    ):
        return last[1]
    plan = _compiled(schema, input_schema)
    _last = (schema, plan)
    return plan


def _normalized(plan: Plan, batches: Sequence[Any]) -> list[Any]:
    """Every batch's columns normalised (see _normalize), rows numbered across batches."""
    arrays, row = [], 0
    for batch in batches:
        arrays.append(_normalize(plan, batch, row))
        row += batch.num_rows
    return arrays


def _native() -> Any:
    """The native encoder, or None when it is not built or ``ARROWSTASH_AVRO_NATIVE=0``."""
    if _cencode is None or not config.avro_native():
        warn_pure_python()
        return None
    return _cencode


def _thread_count(threads: int | None, rows: int) -> int:
    return max(1, min(thread_count(threads), rows // _MIN_ROWS_PER_THREAD))


def _batches(data: Any) -> list[Any]:
    if isinstance(data, pa.RecordBatch):
        data.validate()
        return [data]
    if isinstance(data, pa.Table):
        data.validate()
        batches: list[Any] = data.to_batches()
        return batches
    raise TypeError(f"encode takes a pyarrow.RecordBatch or pyarrow.Table, got {type(data)!r}")


def _normalize(plan: Plan, batch: Any, first_row: int) -> Any:
    """The batch's columns in the layouts the plan reads: one struct array, or the one column."""
    columns = []
    for name, norm in plan.normalize_columns:
        default = plan.defaults.get(name)
        column = batch.column(name) if default is None else default(batch.num_rows)
        try:
            columns.append(norm(column))
        except PlanError as exc:
            row = _first_bad_row(norm, column)
            message = _message_at(norm, column, row) or exc.message
            where = f"row {first_row + row}, column {exc.path!r}"
            raise AvroEncodeError(f"{where}: {message}") from None
    if plan.root.kind != K_RECORD:
        _check_layout(plan, columns[0].type)
        return columns[0]
    if plan.fields is not None:
        # the fields of the last struct type that passed the check: Arrow refuses columns of
        # other types, and looking the type up in plan.checked (hashing it) took 6 us a call
        try:
            return pa.StructArray.from_arrays(columns, fields=plan.fields)
        except pa.ArrowInvalid:
            pass  # a column of another type than last time: that type is checked below
    names = [name for name, _ in plan.normalize_columns]
    fields = [pa.field(n, c.type) for n, c in zip(names, columns, strict=True)]
    top = pa.StructArray.from_arrays(columns, fields=fields)
    _check_layout(plan, top.type)
    plan.fields = fields
    return top


def _check_layout(plan: Plan, normalised: Any) -> None:
    """The C encoder trusts the layout: each normalised type is checked once against it."""
    if normalised not in plan.checked:
        if not same_layout(normalised, plan.arrow_type):
            raise AssertionError(f"normalised {normalised} lacks the layout {plan.arrow_type}")
        plan.checked.add(normalised)


def _first_bad_row(norm: Any, column: Any) -> int:
    """Bisect the first row whose normalisation fails (every row is normalised on its own)."""
    lo, hi = 0, len(column)  # rows [0, lo) normalise; rows [0, hi) do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            norm(column.slice(0, mid))
        except PlanError:
            hi = mid
        else:
            lo = mid
    return lo


def _message_at(norm: Any, column: Any, row: int) -> str | None:
    try:
        norm(column.slice(row, 1))
    except PlanError as exc:
        return exc.message
    return None


def _encode_python(root: Node, arrays: Sequence[Any]) -> Any:
    try:
        data, offsets = _encode.encode_rows(root, arrays)
    except _encode.Fault as fault:
        raise _error(fault.row, fault) from None
    large = len(data) > 2**31 - 1
    kind = pa.large_binary() if large else pa.binary()
    offs = pa.array(offsets, pa.int64() if large else pa.int32())
    return pa.Array.from_buffers(
        kind, len(offsets) - 1, [None, offs.buffers()[1], pa.py_buffer(data)]
    )


def _error(row: int, fault: _encode.Fault) -> AvroEncodeError:
    return AvroEncodeError(f"row {row}, column {fault.node.path!r}: {fault.message}")


def _describe_native_error(plan: Plan, arrays: Sequence[Any], error: tuple[int, ...]) -> Exception:
    """Word the native encoder's (row, node, code, value) by re-encoding that row in Python."""
    row, node_id, code, value = error
    start = 0
    for arr in arrays:
        if row < start + len(arr):
            try:
                _encode.encode_rows(plan.root, [arr.slice(row - start, 1)])
            except _encode.Fault as fault:
                return _error(row, fault)
            break
        start += len(arr)
    node = plan.nodes()[node_id] if 0 <= node_id < len(plan.nodes()) else None
    path = node.path if node else "?"
    return AvroEncodeError(f"row {row}, column {path!r}: value does not fit (code {code}, {value})")
