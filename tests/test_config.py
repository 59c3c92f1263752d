"""Configuration as data: LLM.from_config / to_config, YAML, JSON, environment variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

import latencykit as lk
from latencykit import config
from latencykit.config import LLMConfig
from latencykit.policies.breaker import reset_breakers

FULL: dict[str, Any] = {
    "model": "openai/big",
    "deadline": 12.5,
    "timeout": 30.0,
    "api_base": "http://127.0.0.1:9/v1",
    "api_key_env": "LK_TEST_KEY",
    "degrade": {"model": "openai/small", "after": 2.0, "max_tokens": 64},
    "hedge": {"delay": {"q": 0.9, "min_samples": 10}, "max_extra_load": 0.05},
    "failover": [
        "openai/backup",
        {"model": "openai/far", "name": "far", "api_base": "http://127.0.0.1:9/v1"},
    ],
    "failover_on": ["rate_limited", "server_error"],
    "retry": {"max_attempts": 2, "initial": 0.1, "on": ["timeout"]},
    "breaker": {"minimum_calls": 5, "open_duration": 10.0},
    "stream_guard": {"first_token": 3.0, "stall": 5.0},
    "limiter": {"concurrency": 8, "tenant_quota": {"requests_per_second": 2.0}},
    "cache": {"ttl": 60.0},
    "router": {"rules": [{"to": "openai/backup", "task": "classify"}], "default": "openai/big"},
    "max_output_tokens": 512,
    "on_truncated": "accept",
}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LK_TEST_KEY", "sk-from-env-123")


def test_a_full_config_builds_an_llm_and_comes_back_unchanged() -> None:
    llm = lk.LLM.from_config(FULL)
    assert llm.deadline == 12.5 and llm.timeout == 30.0
    assert [t.key for t in llm.targets] == ["openai/big", "openai/backup", "far"]
    assert llm.targets[0].api_key == "sk-from-env-123"
    assert llm.hedge is not None and llm.hedge.budget.ratio == 0.05
    assert llm.max_output_tokens == 512
    back = llm.to_config()
    assert back == json.loads(json.dumps(back))  # plain data
    assert LLMConfig.model_validate(back) == LLMConfig.model_validate(FULL)
    assert "sk-from-env-123" not in json.dumps(back)  # the key itself never comes back
    assert back["api_key_env"] == "LK_TEST_KEY"


def test_an_llm_built_in_code_has_the_same_config() -> None:
    llm = lk.LLM(
        "openai/big",
        deadline=5,
        retry=lk.Retry(max_attempts=4),
        hedge=lk.hedge(0.5),
        stream_guard=lk.StreamGuard(stall=2.0),
        breaker={"minimum_calls": 7},
    )
    back = llm.to_config()
    assert back == {
        "model": "openai/big",
        "deadline": 5,
        "retry": {"max_attempts": 4},
        "hedge": {"delay": 0.5},
        "stream_guard": {"stall": 2.0},
        "breaker": {"minimum_calls": 7},
    }
    reset_breakers()
    rebuilt = lk.LLM.from_config(back)
    assert rebuilt.to_config() == back


def test_yaml_and_json_files(tmp_path: Path) -> None:
    yaml_file = tmp_path / "llm.yaml"
    yaml_file.write_text(
        "model: openai/big\ndeadline: 8\nhedge:\n  delay: {q: 0.95}\nfailover: [openai/backup]\n"
    )
    llm = lk.LLM.from_config(yaml_file)
    assert llm.deadline == 8 and [t.key for t in llm.targets][1:] == ["openai/backup"]
    json_file = tmp_path / "llm.json"
    json_file.write_text(json.dumps(llm.to_config()))
    reset_breakers()
    assert lk.LLM.from_config(str(json_file)).to_config() == llm.to_config()
    with pytest.raises(ValueError, match=r"\.yaml, \.yml or \.json"):
        lk.LLM.from_config(tmp_path / "llm.toml")


def test_environment_variables_override_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text("model: openai/big\nhedge: {delay: 0.5, max_extra_load: 0.1}\n")
    monkeypatch.setenv("LATENCYKIT_DEADLINE", "4")
    monkeypatch.setenv("LATENCYKIT_HEDGE__MAX_EXTRA_LOAD", "0.02")
    monkeypatch.setenv("LATENCYKIT_FAILOVER", "[openai/a, openai/b]")
    llm = lk.LLM.from_config(path, env_prefix="LATENCYKIT_")
    assert llm.deadline == 4
    assert llm.hedge is not None and llm.hedge.budget.ratio == 0.02
    assert [t.key for t in llm.targets][1:] == ["openai/a", "openai/b"]
    only_env = LLMConfig.from_env(base={"model": "openai/base", "hedge": {"delay": 1.0}})
    assert only_env.model == "openai/base" and only_env.deadline == 4


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"model": "m", "hedge": {"delay": 1.0, "max_extra_lod": 0.1}}, "hedge.max_extra_lod"),
        ({"model": "m", "retry": {"max_attempts": "many"}}, "retry.max_attempts"),
        ({"model": "m", "deadlin": 3}, "deadlin"),
        ({"model": "m", "failover": [{"model": "x", "api_bse": "y"}]}, "failover.0"),
        ({"model": "m", "retry": {"on": ["not_a_kind"]}}, "retry.on.0"),
    ],
)
def test_bad_keys_and_types_name_the_fields_path(data: dict[str, Any], path: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        lk.LLM.from_config(data)
    assert path in str(info.value)


def test_the_constructors_checks_still_apply() -> None:
    with pytest.raises(ValueError, match=r"max_attempts"):
        lk.LLM.from_config({"model": "m", "hedge": {"delay": 1.0, "max_attempts": 0}})
    with pytest.raises(ValueError, match="LK_MISSING"):
        lk.LLM.from_config({"model": "m", "api_key_env": "LK_MISSING"})


def test_defaults_and_descriptions_come_from_the_constructors() -> None:
    fields = config.BreakerConfig.model_fields
    assert fields["minimum_calls"].default == 20
    assert "window must hold" in (fields["minimum_calls"].description or "")
    assert config.RetryConfig.model_fields["max_attempts"].default == 3
    schema = LLMConfig.model_json_schema()
    assert schema["additionalProperties"] is False
    assert "hedge" in schema["properties"]


def test_code_has_no_config_form() -> None:
    llm = lk.LLM("openai/big", retry=lk.Retry(on=lambda exc: True))
    with pytest.raises(ValueError, match=r"retry\.on is code"):
        llm.to_config()
    custom = lk.LLM("openai/big", breaker=lambda key: lk.Breaker(key))
    with pytest.raises(ValueError, match=r"LLM\.breaker is code"):
        custom.to_config()


def test_kinds_filter_matches_by_error_kind() -> None:
    built = lk.LLM.from_config({"model": "m", "retry": {"on": ["rate_limited"]}})
    retry = built._arguments["retry"]
    assert isinstance(retry.on, config.KindFilter)
    assert retry.on(lk.RateLimited("slow down", target="t", status_code=429))
    assert not retry.on(lk.BadRequest("no", target="t", status_code=400))


def test_the_published_json_schema_is_current() -> None:
    published = Path(__file__).parent.parent / "docs" / "latencykit-config.schema.json"
    current = json.dumps(LLMConfig.model_json_schema(), indent=2, sort_keys=True) + "\n"
    assert published.read_text() == current, (
        "docs/latencykit-config.schema.json is stale: regenerate it with "
        "python -m latencykit.config > docs/latencykit-config.schema.json"
    )


def test_a_shared_store_in_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LK_REDIS_URL", "redis://:pw-secret@127.0.0.1:6390/0")
    llm = lk.LLM.from_config(
        {"model": "openai/big", "shared": {"url_env": "LK_REDIS_URL", "interval": 0.5}}
    )
    assert isinstance(llm.shared, lk.RedisStore) and llm.shared.interval == 0.5
    back = llm.to_config()
    assert back["shared"] == {"url_env": "LK_REDIS_URL", "interval": 0.5}
    assert "pw-secret" not in json.dumps(back)
    in_code = lk.LLM("openai/big", shared=lk.RedisStore("redis://127.0.0.1:6390/0"))
    assert in_code.to_config()["shared"] == {"url": "redis://127.0.0.1:6390/0"}
    secret = lk.LLM("openai/big", shared=lk.RedisStore("redis://:pw@127.0.0.1:6390/0"))
    with pytest.raises(ValueError, match="url_env"):
        secret.to_config()


def test_a_variable_a_config_names_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LK_UNSET", raising=False)
    for data, where in (
        ({"api_key_env": "LK_UNSET"}, "LLM: api_key_env"),
        ({"failover": [{"model": "openai/b", "api_key_env": "LK_UNSET"}]}, "api_key_env"),
        ({"shared": {"url_env": "LK_UNSET"}}, "store: url_env"),
    ):
        with pytest.raises(ValueError, match=f"{where} names 'LK_UNSET', which is not set"):
            lk.LLM.from_config({"model": "openai/big", **data})
    with pytest.raises(ValueError, match="store needs url or url_env"):
        lk.LLM.from_config({"model": "openai/big", "shared": {}})


def test_a_policy_alone_from_a_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "retry.yaml"
    path.write_text("max_attempts: 5\non: [rate_limited]\n")
    monkeypatch.setenv("RETRY_INITIAL", "0.25")
    retry = config.load(path, env_prefix="RETRY_", model=config.RetryConfig).build()
    assert isinstance(retry, lk.Retry)
    assert (retry.max_attempts, retry.initial) == (5, 0.25)
    guard = config.load({"stall": 2.0}, model=config.StreamGuardConfig).build()
    assert guard.stall == 2.0
    with pytest.raises(pydantic.ValidationError, match="stal"):
        config.load({"stal": 2.0}, model=config.StreamGuardConfig)
