"""Real latency profiles: :class:`LlmperfProfile`, sampled from the packaged llmperf data."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ._behavior import Behavior, Fault

TYPE_CHECKING = False
if TYPE_CHECKING:
    import random

    from ._request import RequestInfo

_DATA_FILE = "llmperf_per_request.csv"
_lock = threading.Lock()
_cache: dict[str, tuple[_Row, ...]] | None = None


@dataclass(frozen=True)
class _Row:
    ttft: float
    e2e: float
    output_tokens: int
    error: str  # "" for success, else "code:message"

    @property
    def decode_itl(self) -> float:
        """Seconds per output token after the first byte: (e2e - ttft) / output_tokens."""
        return max(self.e2e - self.ttft, 0.0) / max(self.output_tokens, 1)


def _load_all() -> dict[str, tuple[_Row, ...]]:
    """Parse the packaged CSV once; rows grouped by ``"provider/model_size"`` in file order."""
    global _cache
    with _lock:
        if _cache is None:
            import csv
            import io
            from importlib.resources import files

            text = (
                files("latencykit.testing").joinpath("data").joinpath(_DATA_FILE).read_text("utf-8")
            )
            runs: dict[str, list[_Row]] = {}
            for rec in csv.DictReader(io.StringIO(text)):
                run = f"{rec['provider']}/{rec['model_size']}"
                runs.setdefault(run, []).append(
                    _Row(
                        ttft=float(rec["ttft_s"]),
                        e2e=float(rec["e2e_s"]),
                        output_tokens=int(rec["output_tokens"]),
                        error=rec["error"].strip(),
                    )
                )
            _cache = {run: tuple(rows) for run, rows in sorted(runs.items())}
        return _cache


@dataclass(frozen=True)
class LlmperfProfile:
    """Latencies replayed from real hosted-LLM requests (llmperf leaderboard, Dec 2023).

    The packaged data holds ~150 requests for each of 19 runs (``"provider/size"``, see
    :meth:`runs`). A profile is a script callable: ``fake.script("m", profile)`` makes each
    request draw one recorded request (row) with the provider's seeded RNG and answer with
    that row's time to first token, per-token delay and token count, scaled by ``scale``.

    Build it with :meth:`load`.
    """

    run: str
    """The ``"provider/size"`` run sampled, e.g. ``"together/13b"``."""
    scale: float
    """Factor applied to all times (``0.05`` replays a 10 s tail as 0.5 s)."""
    include_errors: bool
    """Whether error rows are replayed (429 rows as ``HTTP_429``, others as ``HTTP_500``)."""
    max_output_tokens: int | None
    """Cap on tokens per answer; ``None`` keeps the recorded counts."""
    _rows: tuple[_Row, ...] = field(repr=False)

    @classmethod
    def load(
        cls,
        run: str = "together/13b",
        scale: float = 0.05,
        include_errors: bool = False,
        max_output_tokens: int | None = None,
    ) -> LlmperfProfile:
        """Load a run of the packaged data.

        Args:
            run: ``"provider/size"``; default ``"together/13b"`` (TTFT p50 0.55 s, p99 53 s).
            scale: Time factor (> 0); default ``0.05`` so tests stay fast.
            include_errors: Replay failed requests too; default ``False`` (successes only).
            max_output_tokens: Cap tokens per answer (the per-token delay grows so the
                end-to-end time is kept); default ``None``.

        Raises:
            ValueError: unknown ``run`` (the message lists the available runs), a run with
                no usable rows, or an invalid argument.
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"scale must be a number > 0, got {scale!r}")
        if max_output_tokens is not None and (
            isinstance(max_output_tokens, bool)
            or not isinstance(max_output_tokens, int)
            or max_output_tokens < 1
        ):
            raise ValueError(f"max_output_tokens must be an int >= 1, got {max_output_tokens!r}")
        runs = _load_all()
        if run not in runs:
            raise ValueError(f"unknown llmperf run {run!r}; available runs: {', '.join(runs)}")
        rows = tuple(r for r in runs[run] if include_errors or not r.error)
        if not rows:
            raise ValueError(f"llmperf run {run!r} has no successful requests")
        return cls(run, float(scale), include_errors, max_output_tokens, rows)

    @staticmethod
    def runs() -> list[str]:
        """Names of the available runs, ``"provider/size"``, sorted."""
        return list(_load_all())

    def __len__(self) -> int:
        """Number of rows sampled from."""
        return len(self._rows)

    @property
    def ttfts(self) -> tuple[float, ...]:
        """Scaled time to first token (s) of every successful row, in file order."""
        return tuple(r.ttft * self.scale for r in self._rows if not r.error)

    @property
    def e2es(self) -> tuple[float, ...]:
        """Scaled end-to-end time (s) of every successful row, in file order."""
        return tuple(r.e2e * self.scale for r in self._rows if not r.error)

    def behavior_for(self, row_index: int) -> Behavior:
        """The Behavior replaying row ``row_index`` of this profile."""
        row = self._rows[row_index]
        if row.error:
            fault = Fault.HTTP_429 if row.error.split(":", 1)[0] == "429" else Fault.HTTP_500
            return Behavior(ttft=row.e2e * self.scale, fault=fault)
        tokens = row.output_tokens
        itl = row.decode_itl * self.scale
        if self.max_output_tokens is not None and tokens > self.max_output_tokens:
            itl = itl * tokens / self.max_output_tokens
            tokens = self.max_output_tokens
        return Behavior(ttft=row.ttft * self.scale, itl=itl, output_tokens=tokens)

    def sample(self, rng: random.Random) -> Behavior:
        """Draw one row with ``rng`` and return its Behavior."""
        return self.behavior_for(rng.randrange(len(self._rows)))

    def __call__(self, request: RequestInfo) -> Behavior:
        """Script entry point: sample with the provider's seeded RNG (``request.rng``)."""
        return self.sample(request.rng)
