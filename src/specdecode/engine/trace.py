"""A per-step trace of the engine (`serve --trace-steps N`, GET /stats/steps): where a step's time went.

Each scheduler iteration that ran a forward leaves one StepRecord: when it began (Unix time, so that a
client on the same machine can line it up with its own clock), its forward's seconds, the rest of it
(admission, drafting, verification, accounting, handing events to the API) and its rows. The last N
records are kept (a ring: memory is bounded whatever the uptime); the API thread reads a copy.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepRecord:
    t: float  # Unix time the iteration began (time.time())
    step_s: float  # the whole iteration: admission, prefill chunks and decode rows, delivery
    forward_s: float  # the batched target forward(s) in it
    decode_rows: int  # requests that decoded (verified drafts) in it
    prompt_rows: int  # prompts that advanced in it (a chunk each)
    prompt_tokens: int  # prompt tokens those chunks put in the KV cache

    @property
    def python_s(self) -> float:
        """Everything but the forward: scheduling, drafting, sampling, verification, delivery."""
        return max(0.0, self.step_s - self.forward_s)

    def to_json(self) -> dict:
        return {**asdict(self), "python_s": self.python_s}


class StepTrace:
    """The last `size` StepRecords (engine thread writes, any thread reads)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a step trace keeps at least 1 step, got {size}")
        self.size = size
        self._records: deque[StepRecord] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.total = 0  # steps recorded since start (those beyond `size` have left the ring)

    def add(self, record: StepRecord) -> None:
        with self._lock:
            self._records.append(record)
            self.total += 1

    def records(self) -> list[StepRecord]:
        with self._lock:
            return list(self._records)

    def to_json(self) -> dict:
        with self._lock:
            records, total = list(self._records), self.total
        return {"size": self.size, "total": total, "steps": [r.to_json() for r in records]}
