"""Reading the providers' rate-limit headers (latencykit.ratelimit): real header sets of each
form, litellm's copies of them, lies and clock skew; and the room they give, on a clock the
tests drive (pure: no I/O, no event loop)."""

from __future__ import annotations

import datetime
import email.utils
import time

import httpx
import pytest

from latencykit import ratelimit
from latencykit.ratelimit import RateLimits, Room, read_limits

# As OpenAI sends them (values from its docs' example).
OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}


def _in(seconds: float) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return when.isoformat().replace("+00:00", "Z")


def test_openai_headers() -> None:
    assert read_limits(OPENAI) == RateLimits(60, 59, 1.0, 150000, 149984, 360.0)


def test_go_durations_and_any_casing() -> None:
    headers = httpx.Headers(
        {"X-RateLimit-Remaining-Tokens": "5", "X-RateLimit-Reset-Tokens": "120ms"}
    )
    assert read_limits(headers) == RateLimits(tokens_remaining=5, tokens_reset=0.12)


def test_anthropic_headers_take_the_tightest_token_family() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": _in(1.2),
        "anthropic-ratelimit-tokens-limit": "90000",
        "anthropic-ratelimit-tokens-remaining": "80000",
        "anthropic-ratelimit-tokens-reset": _in(7),
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "30000",
        "anthropic-ratelimit-input-tokens-reset": _in(15),
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": _in(0),
    }
    found = read_limits(headers)
    assert found is not None
    assert (found.requests_limit, found.requests_remaining) == (50, 49)
    assert found.requests_reset == pytest.approx(1.2, abs=0.5)
    assert (found.tokens_limit, found.tokens_remaining) == (8000, 8000)


def test_azure_remaining_and_retry_after_ms() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-remaining-tokens": "900",
        "retry-after-ms": "1500",
        "retry-after": "2",
    }
    assert read_limits(headers) == RateLimits(
        requests_remaining=3, tokens_remaining=900, retry_after=1.5
    )


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert read_limits({"retry-after": "10"}) == RateLimits(retry_after=10.0)
    date = email.utils.formatdate(datetime.datetime.now().timestamp() + 30, usegmt=True)
    found = read_limits({"Retry-After": date})
    assert found is not None and found.retry_after == pytest.approx(30, abs=2)


def test_litellm_copies_read_as_the_providers_own() -> None:
    # litellm's ModelResponse keeps every header as llm_provider-..., some also unprefixed.
    copied = {f"llm_provider-{k}": v for k, v in OPENAI.items()}
    copied["x-ratelimit-remaining-requests"] = "59"
    assert read_limits(copied) == read_limits(OPENAI)


def test_no_limit_headers_and_garbage() -> None:
    assert read_limits({"content-type": "application/json"}) is None
    assert read_limits({"x-ratelimit-remaining-requests": "lots"}) is None
    assert read_limits({"x-ratelimit-remaining-tokens": "-1", "retry-after": "soon"}) is None


def test_the_key_is_only_ever_hashed() -> None:
    key = "sk-secret-0123456789"
    assert key not in ratelimit.key_hash(key)
    assert ratelimit.key_hash(key) != ratelimit.key_hash("sk-rotated-0123456789")


# --- the room ---------------------------------------------------------------------------------


INTERACTIVE, DEFAULT, BATCH = range(3)  # lane ranks


def wait_of(room: Room, tokens: float, now: float, rank: int = INTERACTIVE) -> tuple[float, str]:
    """What ``room.take`` says, the room taken given back."""
    wait, limit, fleet = room.take(tokens, now, rank)
    if wait <= 0:
        room.release(tokens, fleet)
    return wait, limit


def test_nothing_is_paced_before_the_first_answer() -> None:
    room = Room()
    assert wait_of(room, 10**9, now=0.0) == (0.0, "requests")
    assert room.left(0.0) == (None, None)


def test_room_refills_until_the_reset() -> None:
    room = Room()
    changed = room.read(RateLimits(60, 0, 1.0, 600, 600, 0.0), now=100.0)
    assert changed == [("requests", 60, None), ("tokens", 600, None)]
    # 60 requests missing, full again in 1 s: one request every 1/60 s.
    wait, limit = wait_of(room, 10, now=100.0)
    assert limit == "requests" and wait == pytest.approx(1 / 60)
    assert wait_of(room, 10, now=101.0) == (0.0, "requests")
    assert room.read(RateLimits(60, 10, 1.0, 600, 600, 0.0), now=101.0) == []


def test_a_reset_in_a_skewed_clocks_future_keeps_a_per_minute_pace() -> None:
    room = Room()
    # 0 of 6 requests left, "reset" in an hour (a skewed clock): still one every 10 s.
    room.read(RateLimits(requests_limit=6, requests_remaining=0, requests_reset=3600.0), now=0.0)
    assert wait_of(room, 0, now=0.0)[0] == pytest.approx(10.0)


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["ahead", "behind"])
def test_reset_times_count_from_the_providers_clock(skew: float) -> None:
    # The provider's clock is an hour ahead of ours (or behind): its Date says so, and its
    # reset time is read as 30 s from its now, not an hour and 30 s from ours (nor 0 s: a
    # reset in our past would refill the room at once).
    stamp = datetime.datetime.fromtimestamp(time.time() + skew, datetime.timezone.utc)
    headers = {
        "date": email.utils.format_datetime(stamp, usegmt=True),
        "anthropic-ratelimit-requests-reset": (stamp + datetime.timedelta(seconds=30))
        .isoformat()
        .replace("+00:00", "Z"),
        "anthropic-ratelimit-requests-remaining": "0",
    }
    limits = read_limits(headers)
    assert limits is not None and limits.requests_reset == pytest.approx(30, abs=1.01)


def test_calls_in_flight_count_against_the_room() -> None:
    room = Room()
    room.read(RateLimits(tokens_limit=600, tokens_remaining=100, tokens_reset=50.0), now=0.0)
    assert room.take(60, 0.0, INTERACTIVE) == (0.0, "requests", False)
    wait, limit = wait_of(room, 60, now=0.0)
    assert limit == "tokens" and wait == pytest.approx(20 / 10)  # 20 short, 10 tokens/s
    room.release(60, fleet=False)
    assert wait_of(room, 60, now=0.0)[0] == 0.0


def test_lower_lanes_leave_a_reserve_to_the_higher_ones() -> None:
    room = Room()
    room.read(RateLimits(requests_limit=100, requests_remaining=15, requests_reset=51.0), now=0.0)
    assert wait_of(room, 0, now=0.0, rank=INTERACTIVE)[0] == 0.0
    assert wait_of(room, 0, now=0.0, rank=DEFAULT)[0] == 0.0
    # Batch keeps 20 of 100: 6 short, at 100 per minute.
    assert wait_of(room, 0, now=0.0, rank=BATCH)[0] == pytest.approx(6 * 0.6)
    assert ratelimit.RESERVES == (0.0, 0.0, 0.2)


def test_alone_while_the_fleet_is_away_a_worker_spends_its_share() -> None:
    room = Room()
    room.read(RateLimits(requests_limit=60, requests_remaining=4, requests_reset=56.0), now=0.0)
    room.share = 1 / 4  # four workers were seen: one request of the four is this one's
    assert room.take(0, 0.0, INTERACTIVE)[0] == 0.0
    wait, _ = wait_of(room, 0, now=0.0)
    assert wait == pytest.approx(4.0)  # its share refills at 15 a minute


def test_the_line_serves_the_highest_lane_first_then_in_arrival_order() -> None:
    room = Room()
    woken: list[str] = []
    first_batch = room.join(BATCH, lambda: woken.append("batch 1"))
    second_batch = room.join(BATCH, lambda: woken.append("batch 2"))
    assert not room.first_in_line(BATCH) and room.first_in_line(DEFAULT)
    interactive = room.join(INTERACTIVE, lambda: woken.append("interactive"))
    assert room.first(interactive)
    room.leave(interactive)
    assert room.first(first_batch) and woken == ["batch 1"]
    room.head_wait = 12.0  # what the first in line was told
    room.leave(second_batch)  # gone before its turn: the first stays first
    assert room.head_wait == 12.0
    room.leave(first_batch)
    assert room.first_in_line(BATCH) and room.head_wait == 0.0  # not told to the next


def test_unused_tokens_are_given_back() -> None:
    room = Room()
    room.read(RateLimits(tokens_limit=600, tokens_remaining=100, tokens_reset=50.0), now=0.0)
    room.refund(50, now=0.0, fleet=False)
    assert room.left(0.0) == (None, 150.0)


def test_a_retry_after_pauses_every_request() -> None:
    room = Room()
    room.read(RateLimits(retry_after=3.0), now=10.0)
    assert wait_of(room, 0, now=11.0) == (2.0, "requests")


def test_a_limit_learned_without_its_value_is_the_most_room_seen() -> None:
    room = Room()
    assert room.read(RateLimits(requests_remaining=3), now=0.0) == [("requests", 3, None)]
    assert room.read(RateLimits(requests_remaining=5), now=1.0) == [("requests", 5, 3)]
    assert room.read(RateLimits(requests_remaining=1), now=2.0) == []
