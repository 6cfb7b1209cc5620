import json

import pytest

from specdecode.decoding.config import Route, SpecConfig, load_config
from specdecode.decoding.control import CostModel
from specdecode.drafters import parse
from specdecode.errors import UserError


def test_round_trip(tmp_path):
    cfg = SpecConfig(
        default=Route(parse("ngram"), 5, True),
        routing={"code": Route(parse("ngram:2-3"), 8, False), "creative": Route(parse("none"), 1, False)},
        costs={parse("ngram"): CostModel(0.01, {1: 1.05, 2: 1.1}, 0.04)},
    )
    path = tmp_path / "c.json"
    cfg.save(path)
    back = load_config(path)
    assert back.route("code") == Route(parse("ngram:2-3"), 8, False)
    assert back.route("qa") == Route(parse("ngram"), 5, True)  # unrouted tasks take the default
    ngram = parse("ngram:2-4")  # the file's `ngram:2-4` and `ngram` are one spec
    assert back.costs[ngram].r(2) == 1.1 and back.costs[ngram].step_s == 0.04


BAD = [
    ("not json", "not valid JSON"),
    ('{"routing": {}}', '"version": 1'),
    ('{"version": 1, "routing": {"poetry": {"drafter": "ngram"}}}', "unknown task label(s) poetry"),
    ('{"version": 1, "routing": {"code": {"drafter": "oracle"}}}', "unknown drafter 'oracle'"),
    ('{"version": 1, "routing": {"code": {"drafter": "ngram", "k": 0}}}', "routing.code.k"),
    ('{"version": 1, "default": {"k": "four"}}', "default.k"),
    ('{"version": 1, "default": {"adaptive": "yes"}}', "default.adaptive"),
    ('{"version": 1, "default": {"drafter": "ngram", "kk": 3}}', "unknown field(s) kk"),
    ('{"version": 1, "candidates": "ngram"}', "'candidates' must be a list"),
    ('{"version": 1, "costs": {"ngram": {"verify_ratio": {}}}}', "malformed 'costs'"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_configs_rejected(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)


def test_missing_config_file():
    with pytest.raises(UserError, match="config file not found"):
        load_config("/no/such/config.json")


def test_cli_rejects_bad_config_before_loading(tmp_path, capsys):
    from specdecode.cli import main

    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": 1, "routing": {"code": {"k": 1000}}}))
    assert main(["generate", "hi", "--config", str(path), "--target", "/no/such/model"]) == 2
    assert "routing.code.k" in capsys.readouterr().err
