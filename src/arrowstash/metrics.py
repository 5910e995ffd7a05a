"""Prometheus metrics of every cached function: ``arrowstash.metrics.enable()``.

Counters are not kept twice: a scrape reads the counters each function keeps anyway for
``cache_info()``, so they cost the calls nothing. What enabling adds is the latency histograms of
backend hits, misses and stores, recorded by a ``Meter`` that ``enable`` attaches to every
cached function as its observer (and ``disable`` detaches): without metrics each hook site of
the pipeline costs one attribute test. The fast L1 hit is not touched even then: bucketing a
latency costs about as much as the hit itself, so hits get their total time and count (a
summary) instead.

Labels are the function's ``namespace``, ``function`` (module and qualified name) and
``backend`` (its class name), plus ``layer``, ``kind`` or ``state`` where said: all bounded by
the code, never by the data (no keys, no arguments).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from arrowstash.caching import observers
from arrowstash.caching.logs import backend_name

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from arrowstash.backends.base import Breakered
    from arrowstash.caching.pipeline import Core

__all__ = ["BUCKETS", "disable", "enable", "enabled"]

#: Upper bounds (seconds) of the latency histograms: 10 µs (a File-backend hit of a small value)
#: to a minute (a slow computation).
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
           0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: What the backend's circuit breaker reports, as the values of the ``state`` label.
BREAKER_STATES = ("closed", "open", "half-open")

_lock = threading.Lock()
_exported: tuple[Any, Any] | None = None  # (registry, collector) while enabled


class Histogram:
    """Bucket counts of one latency (not cumulative; the collector sums them)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds


class Meter:
    """The histograms of one function: its observer (see arrowstash.caching.observers)."""

    __slots__ = ("hits", "misses", "stores")

    def __init__(self) -> None:
        self.hits = Histogram()
        self.misses = Histogram()
        self.stores = Histogram()

    def backend_hit(self, seconds: float) -> None:
        self.hits.observe(seconds)

    def miss(self, seconds: float) -> None:
        self.misses.observe(seconds)

    def stored(self, seconds: float) -> None:
        self.stores.observe(seconds)


def enabled() -> bool:
    return _exported is not None


def enable(registry: CollectorRegistry | None = None) -> None:
    """Export the metrics of every cached function, present and future, to ``registry``
    (default: ``prometheus_client.REGISTRY``). Histograms count calls from now on; counters
    count since each function was decorated. Enabling again moves the export to ``registry``."""
    global _exported
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            "arrowstash.metrics needs prometheus_client: pip install 'arrowstash[prometheus]'"
        ) from exc
    registry = prometheus_client.REGISTRY if registry is None else registry
    with _lock:
        if _exported is not None:
            _exported[0].unregister(_exported[1])
        collector = _Collector()
        registry.register(collector)
        _exported = (registry, collector)
    observers.observe(Meter)


def disable() -> None:
    """Stop exporting and detach the meters."""
    global _exported
    with _lock:
        if _exported is None:
            return
        _exported[0].unregister(_exported[1])
        _exported = None
    observers.observe(None)


class _Collector:
    """Builds the metric families from the live functions at each scrape."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            SummaryMetricFamily,
        )

        base = ["namespace", "function", "backend"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return CounterMetricFamily(f"arrowstash_{name}", doc, labels=[*base, *extra])

        def histogram(name: str, doc: str) -> Any:
            return HistogramMetricFamily(f"arrowstash_{name}_duration_seconds", doc, labels=base)

        hits = counter("hits", "Calls answered from the cache, by layer (l1, backend).",
                       ("layer",))
        misses = counter("misses", "Calls that ran the function.")
        stores = counter("stores", "Results stored (in the backend, or in L1 without one).")
        errors = counter("errors", "Failures the cache absorbed, by kind (see caching.logs).",
                         ("kind",))
        read = counter("read_bytes", "Bytes of entries read from the backend on hits.")
        written = counter("written_bytes", "Bytes of entries written to the backend.")
        refreshes = counter("refreshes", "Background refreshes run (stale_ttl, refresh_ahead).")
        hit_time = SummaryMetricFamily(
            "arrowstash_hit_duration_seconds", "Time of hits of every layer.", labels=base)
        backend_hit = histogram("backend_hit", "Time of hits served by the backend.")
        miss = histogram("miss", "Time of misses, the function's run included.")
        store = histogram("store", "Time to serialize and store a result.")
        l1_entries = GaugeMetricFamily("arrowstash_l1_entries", "Entries in L1.", labels=base)
        breaker = GaugeMetricFamily(
            "arrowstash_breaker_state", "1 for the state the backend's circuit breaker is in.",
            labels=[*base, "state"])
        for core in cast("list[Core]", observers.live()):
            labels = [core.namespace, core.name, backend_name(core.backend)]
            info = core.info()
            stats = core.stats
            hits.add_metric([*labels, "l1"], info.l1_hits)
            hits.add_metric([*labels, "backend"], info.hits - info.l1_hits)
            misses.add_metric(labels, info.misses)
            stores.add_metric(labels, stats.stores)
            for kind, count in sorted(stats.error_kinds.items()):
                errors.add_metric([*labels, kind], count)
            read.add_metric(labels, stats.bytes_read)
            written.add_metric(labels, info.bytes_stored)
            refreshes.add_metric(labels, stats.refreshes)
            hit_time.add_metric(labels, info.hits, info.mean_hit_latency * info.hits)
            l1_entries.add_metric(labels, info.l1_entries)
            meter = core.observer
            if isinstance(meter, Meter):
                for family, hist in ((backend_hit, meter.hits), (miss, meter.misses),
                                     (store, meter.stores)):
                    family.add_metric(labels, _cumulative(hist), hist.total)
            if core.backend is not None and core.backend.capabilities.breaker:
                state = cast("Breakered", core.backend).breaker.state
                for name in BREAKER_STATES:
                    breaker.add_metric([*labels, name], float(state == name))
        yield from (hits, misses, stores, errors, read, written, refreshes, hit_time,
                    backend_hit, miss, store, l1_entries, breaker)


def _cumulative(hist: Histogram) -> list[tuple[str, float]]:
    counts = list(hist.counts)  # one snapshot: calls may add to it meanwhile
    buckets, running = [], 0
    for bound, count in zip([*map(str, BUCKETS), "+Inf"], counts, strict=True):
        running += count
        buckets.append((bound, float(running)))
    return buckets

