"""``python -m latencykit.lab``: run the latency lab."""

from .cli import main

raise SystemExit(main())
