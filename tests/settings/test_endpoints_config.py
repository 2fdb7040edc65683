"""Named endpoints in config.toml: read, checked before anything runs, and the
top-level settings as the endpoint "default"."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.settings import endpoints
from fleet_tui.settings.config import ConfigError, Settings, load_settings

ZAI = '''
model = "GLM-5.2"
max_workers = 3
budget_per_day = 2.5
[prices."GLM-5.2"]
input = 1.0
output = 3.0

[endpoints.zai]
base_url = "https://api.z.ai/api/anthropic/"
key_env = "ZAI_KEY"
max_workers = 8
max_requests = 2
budget_per_day = 5.0
[endpoints.zai.prices."GLM-5.2"]
input = 1.40
cached_input = 0.26
cache_write = 1.40
output = 4.40

[endpoints.claude]
base_url = "https://api.anthropic.com"
key_keyring = "anthropic"
model = "claude-sonnet-4-5"
'''


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(env={"HOME": str(tmp_path)}, config_file=path)


def test_named_endpoints_and_the_default_one(tmp_path: Path) -> None:
    settings = _load(tmp_path, ZAI)
    names = [e.name for e in settings.endpoints]
    assert names == ["default", "zai", "claude"]
    default = settings.endpoint()
    assert default.max_workers == 3 and default.budget_per_day == 2.5
    assert default.max_requests is None and not default.own_key
    assert default.prices["GLM-5.2"].cached_input == 1.0  # absent: the input price
    zai = settings.endpoint("zai")
    assert zai.base_url == "https://api.z.ai/api/anthropic"  # the trailing / dropped
    assert (zai.key_env, zai.max_workers, zai.max_requests) == ("ZAI_KEY", 8, 2)
    assert zai.model == "GLM-5.2" and zai.own_key
    price = zai.prices["GLM-5.2"]
    assert price.cost(input_tokens=1_000_000, output_tokens=500_000,
                      cache_read_tokens=100_000, cache_write_tokens=0) == pytest.approx(
        1.40 + 2.20 + 0.026)
    claude = settings.endpoint("claude")
    assert claude.model == "claude-sonnet-4-5" and claude.max_workers == 3
    assert claude.key_keyring == "anthropic" and claude.budget_per_day is None
    with pytest.raises(ConfigError, match="unknown endpoint 'nope'; the endpoints are: "
                                          "default, zai, claude"):
        settings.endpoint("nope")
    assert endpoints.from_data(endpoints.to_data(settings.endpoints)) == settings.endpoints


def test_a_config_without_endpoints_is_one_default_endpoint(tmp_path: Path) -> None:
    settings = _load(tmp_path, 'base_url = "http://127.0.0.1:9/x"\n')
    assert [e.base_url for e in settings.endpoints] == ["http://127.0.0.1:9/x"]


@pytest.mark.parametrize(("table", "message"), [
    ('[endpoints.zai]\nmodel = "x"\n', r"\[endpoints.zai\]: base_url is missing"),
    ('[endpoints.zai]\nbase_url = "ftp://x"\n', "is not an http"),
    ('[endpoints.zai]\nbase_url = "http://x"\nmax_requests = 0\n',
     "max_requests: expected a whole number >= 1"),
    ('[endpoints.zai]\nbase_url = "http://x"\nkey_env = "sk-abc def"\n',
     "is not an environment variable's name"),
    ('[endpoints.zai]\nbase_url = "http://x"\nmax_worker = 2\n',
     "unknown setting 'max_worker'"),
    ('[endpoints.default]\nbase_url = "http://x"\n', "are the endpoint 'default'"),
    ('[endpoints."a b"]\nbase_url = "http://x"\n', "an endpoint's name is"),
    ('[endpoints.zai]\nbase_url = "http://x"\n[endpoints.zai.prices.m]\ninput = -1\n'
     'output = 1\n', "input: expected a number >= 0"),
    ('[prices.m]\ninput = 1\n', "output is missing"),
    ('[endpoints.zai]\nbase_url = "http://x"\nbudget_per_day = "lots"\n',
     "budget_per_day: expected a number >= 0"),
    ('budget_per_task = -2\n', "budget_per_task"),
])
def test_a_bad_endpoint_is_refused_with_where_and_what(tmp_path: Path, table: str,
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, table)
