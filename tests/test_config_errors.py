"""Config that means what it says: bad values, inline keys, misspelt variables and unreadable
files are clear errors naming the file, the field and the line; to_config() never writes a
secret and keeps every key's variable."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import latencykit as lk
from latencykit.config import LLMConfig
from latencykit.policies.breaker import reset_breakers


def _error(path: Path, text: str | bytes) -> ValueError:
    """The error ``LLM.from_config`` raises for a file holding ``text``."""
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ValueError, match=re.escape(str(path))) as info:
        lk.LLM.from_config(path)
    # A clear error: no raw UnicodeDecodeError, JSONDecodeError, yaml or TypeError.
    assert type(info.value) in (ValueError, pydantic.ValidationError), repr(info.value)
    assert str(path) in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ("model: m\ndeadline: true\n", "deadline", 2),  # was read as 1 s
        ("model: m\ndeadline: 1:30\n", "deadline", 2),  # was read as 90 s (base 60)
        ("model: m\nretry:\n  max_attempts: 1_000\n", "retry.max_attempts", 3),
        ("model: m\ntimeout: yes\n", "timeout", 2),
        ("model: m\nhedge:\n  delay: off\n", "hedge.delay", 3),
        ("model: m\nbudget_aware: 1\n", "budget_aware", 2),
        ("model: m\nretry: {max_attempts: 2.0}\n", "retry.max_attempts", 2),
        ("model: m\ndeadline: .nan\n", "deadline", 2),
        ("model: m\ndeadline: '5'\n", "deadline", 2),
        ("model: m\ncache:\n  ttl: 2024-05-13\n", "cache.ttl", 3),
    ],
)
def test_a_number_field_takes_a_number(tmp_path: Path, text: str, field: str, line: int) -> None:
    error = _error(tmp_path / "llm.yaml", text)
    assert isinstance(error, pydantic.ValidationError)
    assert field in str(error) and f"line {line}" in str(error)


def test_a_json_file_too(tmp_path: Path) -> None:
    error = _error(tmp_path / "llm.json", '{"model": "m",\n "deadline": true}')
    assert "deadline" in str(error) and "line 2" in str(error)


def test_yaml_1_2_numbers_and_booleans_still_read(tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "model: m\ndeadline: 010\ntimeout: 1e2\nbudget_aware: true\nmax_output_tokens: 64\n"
        "retry: {max_attempts: 0x4, on: [timeout]}\nfailover: [2024-05-13]\n"
    )
    llm = lk.LLM.from_config(path)
    assert (llm.deadline, llm.timeout) == (10.0, 100.0)  # YAML 1.1: 8 and the string "1e2"
    assert llm._arguments["retry"].max_attempts == 4
    assert [t.key for t in llm.targets] == ["m", "2024-05-13"]  # a string, not a date


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("model: m\napi_key: sk-inline-1\n", "api_key"),
        ("model: m\nfailover:\n  - {model: x, api_key: sk-inline-1}\n", "failover.0"),
        ("model: m\ndegrade: {overrides: {api_key: sk-inline-1}}\n", "degrade.overrides"),
    ],
)
def test_an_inline_api_key_is_refused(tmp_path: Path, text: str, field: str) -> None:
    error = _error(tmp_path / "llm.yaml", text)
    assert isinstance(error, pydantic.ValidationError)
    assert field in str(error) and "api_key_env" in str(error)


def test_a_misspelt_environment_variable_is_named_with_its_close_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text("model: m\nhedge: {delay: 0.5}\n")
    monkeypatch.setenv("LATENCYKIT_GC_FREEZE", "0")  # latencykit's own: not an option
    monkeypatch.setenv("LATENCYKIT_HEDGE__MAX_EXTRA_LOD", "0.1")
    with pytest.raises(pydantic.ValidationError) as info:
        lk.LLM.from_config(path, env_prefix="LATENCYKIT_")
    assert "LATENCYKIT_HEDGE__MAX_EXTRA_LOD" in str(info.value)
    assert "did you mean LATENCYKIT_HEDGE__MAX_EXTRA_LOAD?" in str(info.value)
    assert str(path) in str(info.value)
    monkeypatch.delenv("LATENCYKIT_HEDGE__MAX_EXTRA_LOD")
    monkeypatch.setenv("LATENCYKIT_DEADLINE", "true")
    with pytest.raises(pydantic.ValidationError, match="environment variable LATENCYKIT_DEADLINE"):
        lk.LLM.from_config(path, env_prefix="LATENCYKIT_")
    monkeypatch.setenv("LATENCYKIT_DEADLINE", "4")
    assert lk.LLM.from_config(path, env_prefix="LATENCYKIT_").deadline == 4


def test_two_variables_setting_one_field_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATENCYKIT_HEDGE", "0.5")
    monkeypatch.setenv("LATENCYKIT_HEDGE__DELAY", "0.5")
    with pytest.raises(ValueError, match="LATENCYKIT_HEDGE and LATENCYKIT_HEDGE__DELAY"):
        LLMConfig.from_env(base={"model": "m"})
    monkeypatch.delenv("LATENCYKIT_HEDGE")
    monkeypatch.setenv("LATENCYKIT_hedge", "0.5")  # read after HEDGE__DELAY ("H" < "h")
    with pytest.raises(ValueError, match="LATENCYKIT_HEDGE__DELAY and LATENCYKIT_hedge"):
        LLMConfig.from_env(base={"model": "m"})


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("tabs.yaml", "model: m\nhedge:\n\tdelay: 0.5\n", 3),
        ("latin1.yaml", b"model: m\n# caf\xe9\ndeadline: 3\n", 2),
        ("syntax.yaml", "model: m\nhedge: {delay: 0.5\n", 3),
        ("twice.yaml", "model: m\ndeadline: 3\ndeadline: 4\n", 3),
        ("nul.yaml", "model: m\ndeadline: 3\x00\n", 2),
        ("explicit.yaml", "model: m\ndeadline: !!int 1_000\n", 2),
        ("syntax.json", '{"model": "m",\n "deadline": 3,}', 2),
    ],
)
def test_an_unreadable_file_names_itself_and_the_line(
    tmp_path: Path, name: str, text: str | bytes, line: int
) -> None:
    error = _error(tmp_path / name, text)
    assert type(error) is ValueError
    assert f"line {line}" in str(error)
    assert "<unicode string>" not in str(error)


def test_a_constructors_error_names_the_file(tmp_path: Path) -> None:
    error = _error(tmp_path / "llm.yaml", "model: m\nretry: {max_attempts: 0}\n")
    assert "max_attempts" in str(error)


# --- the fuzz: every bad config is a clear error naming the field and the file ------------

BASE: dict[str, Any] = {
    "model": "openai/big",
    "deadline": 10,
    "retry": {"max_attempts": 2},
    "hedge": {"delay": 0.5},
    "breaker": {"minimum_calls": 5},
    "cache": {"ttl": 60},
    "failover": [{"model": "openai/far", "name": "far"}],
}
NUMBERS = [
    "deadline",
    "timeout",
    "hedge.delay",
    "hedge.max_extra_load",
    "retry.initial",
    "retry.max_attempts",
    "breaker.minimum_calls",
    "breaker.open_duration",
    "cache.ttl",
    "max_output_tokens",
    "failover.0.timeout",
    "failover.0.context_window",
]
NOT_NUMBERS = [
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "1:30",
    "1_000",
    "'5'",
    ".nan",
    ".inf",
    "-.inf",
    "2024-05-13",
    "[1]",
    "{a: 1}",
    "abc",
    "0b101",
    "''",
]
BOOLEANS = ["budget_aware", "retry.honor_retry_after", "cache.cache_degraded"]
NOT_BOOLEANS = ["1", "0", "yes", "no", "on", "off", "'true'", "1.0", "[true]", "abc"]
CHOICES = ["on_truncated", "transport", "hedge.target", "failover.0.transport"]
NOT_CHOICES = ["sometimes", "1", "true", "[raise]", "{a: 1}"]
# Right type, refused by the constructor.
OUT_OF_RANGE = [
    ("deadline", "-1"),
    ("deadline", "0"),
    ("timeout", "-5"),
    ("retry.max_attempts", "0"),
    ("hedge.max_extra_load", "-0.5"),
    ("breaker.failure_rate", "150"),
    ("failover.0.context_window", "0"),
]


def _set(data: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """``data`` with ``field`` (a dotted path, list items by index) set to ``value``."""
    copy: dict[str, Any] = json.loads(json.dumps(data))
    node = copy
    *parents, last = field.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return copy


def _yaml_text(data: dict[str, Any], raw: dict[str, str]) -> str:
    """``data`` as YAML (flow style, JSON is YAML), with placeholder strings replaced by raw YAML
    scalars (``"@0"`` becomes ``1:30``)."""
    text = json.dumps(data)
    for placeholder, scalar in raw.items():
        text = text.replace(json.dumps(placeholder), scalar)
    return text


@st.composite
def bad_configs(draw: st.DrawFn) -> tuple[str, str, str]:
    """(YAML text, the field it gets wrong, what its error must hold)."""
    kind = draw(st.sampled_from(["number", "boolean", "choice", "range", "unknown", "key"]))
    if kind == "number":
        field, scalar = draw(st.sampled_from(NUMBERS)), draw(st.sampled_from(NOT_NUMBERS))
    elif kind == "boolean":
        field, scalar = draw(st.sampled_from(BOOLEANS)), draw(st.sampled_from(NOT_BOOLEANS))
    elif kind == "choice":
        field, scalar = draw(st.sampled_from(CHOICES)), draw(st.sampled_from(NOT_CHOICES))
    elif kind == "range":
        field, scalar = draw(st.sampled_from(OUT_OF_RANGE))
        # The constructor names the option, not always with the config's dotted path.
        return _yaml_text(_set(BASE, field, "@0"), {"@0": scalar}), field, field.split(".")[-1]
    elif kind == "unknown":
        parent = draw(st.sampled_from(["", "retry.", "hedge.", "breaker.", "failover.0."]))
        name = draw(st.from_regex(r"[a-z][a-z_]{0,14}", fullmatch=True))
        field = parent + name + "_x"  # no option ends in _x
        return _yaml_text(_set(BASE, field, 1), {}), field, field
    else:
        field = draw(st.sampled_from(["api_key", "failover.0.api_key"]))
        return _yaml_text(_set(BASE, field, "sk-inline"), {}), field, "api_key_env"
    return _yaml_text(_set(BASE, field, "@0"), {"@0": scalar}), field, field


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=bad_configs())
def test_bad_configs_fail_clearly_naming_the_field_and_the_file(
    tmp_path: Path, case: tuple[str, str, str]
) -> None:
    text, _field, expected = case
    reset_breakers()
    error = _error(tmp_path / "llm.yaml", text)
    assert expected in str(error), (text, str(error))
    if isinstance(error, pydantic.ValidationError):
        assert "line 1" in str(error)


def test_bad_bytes_anywhere_fail_clearly(tmp_path: Path) -> None:
    """Each byte that breaks the file (a tab, a NUL, a byte that is not UTF-8, a stray
    bracket) put at each place of a good config: a ValueError naming the file and the line."""
    good = "model: openai/big\ndeadline: 10\nhedge:\n  delay: 0.5\nretry: {max_attempts: 2}\n"
    count = 0
    for position in range(0, len(good), 3):
        for bad in (b"\t", b"\x00", b"\xff", b"{", b": :"):
            raw = good.encode()[:position] + bad + good.encode()[position:]
            path = tmp_path / "llm.yaml"
            path.write_bytes(raw)
            error: ValueError | None = None
            try:
                lk.LLM.from_config(path)
            except ValueError as exc:
                error = exc
            reset_breakers()
            if error is not None:
                assert type(error) in (ValueError, pydantic.ValidationError), repr(error)
                assert str(path) in str(error) and "line" in str(error), str(error)
                count += 1
    assert count >= 100  # most of these break the file; those that do not are valid YAML


# --- to_config: never a secret, every key's variable ---------------------------------------


def test_a_round_trip_keeps_every_keys_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LK_MAIN_KEY", "sk-main-secret")
    monkeypatch.setenv("LK_FAR_KEY", "sk-far-secret")
    config = {
        "model": "openai/big",
        "api_key_env": "LK_MAIN_KEY",
        "failover": [
            {"model": "openai/far", "name": "far", "api_key_env": "LK_FAR_KEY"},
            "openai/backup",
        ],
    }
    llm = lk.LLM.from_config(config)
    assert [t.api_key for t in llm.targets] == ["sk-main-secret", "sk-far-secret", None]
    back = llm.to_config()
    assert back["failover"][0]["api_key_env"] == "LK_FAR_KEY"
    assert "secret" not in json.dumps(back)
    reset_breakers()
    rebuilt = lk.LLM.from_config(back)
    assert [t.api_key for t in rebuilt.targets] == ["sk-main-secret", "sk-far-secret", None]
    assert rebuilt.to_config() == back


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"degrade": lk.Degrade(overrides={"api_key": "sk-code-secret"})}, "degrade"),
        ({"api_base": "https://user:pw-secret@llm.example/v1"}, "LLM.api_base"),
        (
            {"failover": [{"model": "openai/far", "api_base": "https://u:pw-secret@far/v1"}]},
            "LLM.failover[0].api_base",
        ),
        (
            {"degrade": lk.Degrade(overrides={"api_base": "https://u:pw-secret@small/v1"})},
            "LLM.degrade.overrides.api_base",
        ),
        ({"api_key": "sk-code-secret"}, "LLM.api_key"),
        ({"failover": [lk.Target("openai/far", api_key="sk-code-secret")]}, "failover[0]"),
    ],
)
def test_to_config_never_writes_a_secret(arguments: dict[str, Any], field: str) -> None:
    llm = lk.LLM("openai/big", **arguments)
    with pytest.raises(ValueError, match="secret") as info:
        llm.to_config()
    assert field in str(info.value)
    assert "pw-secret" not in str(info.value) and "sk-code" not in str(info.value)
