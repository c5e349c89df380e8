"""Answers cached by (endpoint, body digest, bundle, calibration), so retries and identical
TrainingJobs cost a dictionary lookup instead of an estimate.

Only deterministic answers are kept: results (200), malformed or invalid requests (400, 422)
and estimates that ran out their whole deadline in a worker (504): a model that took too long
once takes too long again, and the operator's retries must not occupy a worker each time. A new
bundle or calibration changes the key, so nothing stale is served.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

CACHEABLE_STATUSES = frozenset({200, 400, 422, 504})


@dataclass(frozen=True)
class EncodedReply:
    """An answer ready to send: status and JSON bytes."""
    status: int
    body: bytes


def request_key(endpoint: str, body: bytes, bundle: str, calibration_generation: int) -> str:
    """Digest of everything an answer depends on."""
    digest = hashlib.sha256(body).hexdigest()
    return f"{endpoint}|{digest}|{bundle}|{calibration_generation}"


@dataclass
class ReplyCache:
    """Least-recently-used answers, bounded by count and by the size of their bodies."""
    max_entries: int
    max_bytes: int
    _entries: OrderedDict[str, EncodedReply] = field(default_factory=OrderedDict)
    _bytes: int = 0

    def get(self, key: str) -> EncodedReply | None:
        """The cached answer, now most recently used; None when absent."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: str, reply: EncodedReply) -> None:
        """Keep `reply` (if cacheable and small enough), evicting the oldest beyond the caps."""
        if reply.status not in CACHEABLE_STATUSES or len(reply.body) > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old.body)
        self._entries[key] = reply
        self._bytes += len(reply.body)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted.body)

    def __len__(self) -> int:
        return len(self._entries)
