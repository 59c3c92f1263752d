"""Latency distributions for the fake provider."""

from __future__ import annotations

import math
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from collections.abc import Iterable

_KINDS = ("fixed", "uniform", "lognormal", "samples")


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class Latency:
    """A distribution of delays in seconds, sampled once per use.

    Build one with a constructor classmethod: :meth:`fixed`, :meth:`uniform`,
    :meth:`lognormal` or :meth:`samples`. Wherever a :class:`Behavior` accepts a
    ``Latency``, a plain ``float`` means ``Latency.fixed(float)``.

    Sampling draws from the ``random.Random`` it is given (the provider's seeded RNG),
    so runs with the same seed and the same request order are reproducible.
    """

    kind: str
    """One of ``"fixed"``, ``"uniform"``, ``"lognormal"``, ``"samples"``."""
    params: tuple[float, ...]
    """The distribution's parameters, as given to the constructor."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")

    @classmethod
    def fixed(cls, seconds: float) -> Latency:
        """Always ``seconds`` (>= 0)."""
        return cls("fixed", (_check_seconds("seconds", seconds),))

    @classmethod
    def uniform(cls, lo: float, hi: float) -> Latency:
        """Uniform between ``lo`` and ``hi`` seconds (``0 <= lo <= hi``)."""
        lo = _check_seconds("lo", lo)
        hi = _check_seconds("hi", hi)
        if hi < lo:
            raise ValueError(f"hi must be >= lo, got lo={lo!r}, hi={hi!r}")
        return cls("uniform", (lo, hi))

    @classmethod
    def lognormal(cls, median: float, sigma: float) -> Latency:
        """Log-normal with the given ``median`` (> 0 s) and log-space ``sigma`` (>= 0).

        ``sigma`` around 0.5-1.0 gives the heavy right tail typical of LLM time to
        first token.
        """
        median = _check_seconds("median", median)
        if median <= 0:
            raise ValueError(f"median must be > 0, got {median!r}")
        sigma = _check_seconds("sigma", sigma)
        return cls("lognormal", (median, sigma))

    @classmethod
    def samples(cls, values: Iterable[float]) -> Latency:
        """A uniform choice among the given sample values (seconds, each >= 0, at least one)."""
        checked = tuple(_check_seconds("values[]", v) for v in values)
        if not checked:
            raise ValueError("values must contain at least one sample")
        return cls("samples", checked)

    def sample(self, rng: random.Random) -> float:
        """Draw one delay in seconds using ``rng``."""
        p = self.params
        if self.kind == "fixed":
            return p[0]
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        if self.kind == "lognormal":
            return rng.lognormvariate(math.log(p[0]), p[1])
        return rng.choice(p)

    def __repr__(self) -> str:
        if self.kind == "samples":
            return f"Latency.samples(<{len(self.params)} values>)"
        return f"Latency.{self.kind}({', '.join(repr(x) for x in self.params)})"


def sample_seconds(value: Latency | float, rng: random.Random) -> float:
    """Sample a ``Latency`` or return a plain number as seconds."""
    if isinstance(value, Latency):
        return value.sample(rng)
    return float(value)
