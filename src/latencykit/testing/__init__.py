"""A fake LLM provider on a real local socket, for tests, demos and CI.

It speaks OpenAI's chat completions and Responses (``fake.base_url``), Anthropic's Messages
(``fake.anthropic_base_url``) and Gemini's ``generateContent`` (``fake.gemini_base_url``),
with the same scripted behaviours and faults in each, and optionally rate limits per API
key (:class:`ProviderQuota`) told in each format's headers.

>>> from latencykit.testing import FakeProvider, Behavior, Fault
>>> with FakeProvider() as fake:                      # doctest: +SKIP
...     fake.script("slow", Behavior(ttft=5.0))
...     fake.script("flaky", [Behavior(fault=Fault.HTTP_503), Behavior()])
...     # litellm.acompletion(model="openai/slow", api_base=fake.base_url, api_key="x", ...)

Importing this package is cheap: the asyncio server is imported when a provider starts.
:class:`RedisServer` runs a throwaway ``redis-server`` on 127.0.0.1 (standard library only).
See ``docs/testing.md``.
"""

from ._behavior import Behavior as Behavior
from ._behavior import Fault as Fault
from ._latency import Latency as Latency
from ._profiles import LlmperfProfile as LlmperfProfile
from ._quota import ProviderQuota as ProviderQuota
from ._quota import QuotaUsage as QuotaUsage
from ._records import RecordedAttempt as RecordedAttempt
from ._redis import RedisServer as RedisServer
from ._request import RequestInfo as RequestInfo
from ._script import Script as Script
from ._server import FakeProvider as FakeProvider
from ._server import Predicate as Predicate

__all__ = [
    "Behavior",
    "FakeProvider",
    "Fault",
    "Latency",
    "LlmperfProfile",
    "Predicate",
    "ProviderQuota",
    "QuotaUsage",
    "RecordedAttempt",
    "RedisServer",
    "RequestInfo",
    "Script",
]
