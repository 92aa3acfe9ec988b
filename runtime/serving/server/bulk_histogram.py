"""A Prometheus histogram fed a batch of observations at once: the inter-token latency takes one
per streamed token, and prometheus_client's ``observe`` (a lock and a value object per bucket
touched) costs several µs each on the thread that reads the engine's messages. Here a batch is one
lock and a bisect per value; the exposition is a histogram's (``_bucket``, ``_count``, ``_sum``)."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class BulkHistogram:
    def __init__(self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = (),
                 label_values: Sequence[str] = ()) -> None:
        self.name, self.doc, self.labels, self.label_values = name, doc, list(labels), list(label_values)
        self._bounds = [*sorted(buckets), math.inf]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Iterable[float]) -> None:
        bounds, counts = self._bounds, self._counts
        with self._lock:
            for v in values:
                counts[bisect.bisect_left(bounds, v)] += 1  # the first bound >= v: Prometheus' "le"
                self._sum += v

    def collect(self):
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip(self._bounds, counts):
            cumulative += n
            buckets.append((floatToGoString(bound), cumulative))
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        family.add_metric(self.label_values, buckets, total)
        yield family
