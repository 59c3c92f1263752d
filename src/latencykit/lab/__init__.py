"""The latency lab: replay a real heavy-tailed latency profile through litellm, bare and through
latencykit's policies, side by side, and report the tail.

Run it with ``latencykit lab`` or ``python -m latencykit.lab`` (``make demo``). Offline: it starts
the fake provider (:mod:`latencykit.testing`) on 127.0.0.1 and needs no API key.
"""

from .cli import main as main
from .runner import LabConfig as LabConfig
from .runner import LabResult as LabResult
from .runner import RowResult as RowResult
from .runner import run_lab as run_lab

__all__ = ["LabConfig", "LabResult", "RowResult", "main", "run_lab"]
