"""`sparkd-engine generate --feed-tokens FILE`: a fixed continuation (the benchmarks' decoded tokens
must not depend on kernel numerics of a random model), its JSON record, and its clear errors."""

import json

import pytest
from engine_cli import run_engine, tiny_model

run = run_engine
VOCAB = 512  # the tiny qwen3moe's


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("feed") / "m.gguf", layers=2, seed=3)


def _write(tmp_path, data, name="feed.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def _generate(model, *extra):
    r = run("generate", str(model), "--tokens", "1 2 3", "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("mode", [["--resident"], ["--budget", "2G"]], ids=["resident", "streamed"])
def test_fed_tokens_are_the_output_and_greedy_picks_agree_with_themselves(model, tmp_path, mode):
    greedy = _generate(model, "-n", "6", *mode)
    assert "feed" not in greedy
    # a greedy run fed its own continuation: every pick agrees
    again = _generate(model, "-n", "6", "--feed-tokens", str(_write(tmp_path, greedy["tokens"])), *mode)
    assert again["tokens"] == greedy["tokens"]
    assert again["feed"] == {"path": str(tmp_path / "feed.json"), "listed": 6, "fed": 6, "agreed": 6,
                             "stopped": "n_and_feed_end"}
    # any other list: exactly those tokens come out, the picks (still made) mostly disagree
    other = [(t * 7 + 11) % VOCAB for t in range(5, 11)]
    fed = _generate(model, "-n", "6", "--feed-tokens", str(_write(tmp_path, other, "other.json")), *mode)
    assert fed["tokens"] == other and fed["feed"]["fed"] == 6 and fed["feed"]["agreed"] < 6


def test_stops_at_n_or_at_the_lists_end_whichever_first(model, tmp_path):
    ids = [5, 9, 40, 77, 300, 2, 8, 100]
    f = _write(tmp_path, ids)
    short = _generate(model, "-n", "3", "--resident", "--feed-tokens", str(f))
    assert short["tokens"] == ids[:3] and short["feed"]["stopped"] == "n" and short["feed"]["listed"] == 8
    long = _generate(model, "-n", "20", "--resident", "--feed-tokens", str(f))
    assert long["tokens"] == ids and long["feed"]["stopped"] == "feed_end" and long["feed"]["fed"] == 8


def test_an_earlier_json_output_can_be_fed_and_text_mode_says_so(model, tmp_path):
    earlier = {"text": "x", "tokens": [3, 4, 5], "prompt_tokens": 3}
    r = run("generate", str(model), "--tokens", "1 2 3", "-n", "8", "--resident", "--feed-tokens",
            str(_write(tmp_path, earlier)))
    assert r.returncode == 0, r.stderr
    assert "fed 3 of 3 listed tokens" in r.stderr and "end of the list" in r.stderr


@pytest.mark.parametrize("content,msg", [
    (None, "could not read --feed-tokens"),
    ("[1, 2,", "could not parse --feed-tokens"),
    ('{"a": 1}', "expected a non-empty JSON list of integer token ids"),
    ("[1, 2.5, 3]", "expected a non-empty JSON list of integer token ids"),
    ('[1, "2"]', "expected a non-empty JSON list of integer token ids"),
    ("[]", "expected a non-empty JSON list of integer token ids"),
    (f"[1, {VOCAB}, -1]", f"could not feed token ids [{VOCAB}, -1]"),
], ids=["missing", "not-json", "not-a-list", "float", "string", "empty", "outside-vocab"])
def test_bad_feed_fails_clearly_before_anything_runs(model, tmp_path, content, msg):
    f = tmp_path / "feed.json"
    if content is not None:
        f.write_text(content)
    r = run("generate", str(model), "--tokens", "1 2 3", "-n", "4", "--json", "--feed-tokens", str(f))
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    # nothing ran: no streaming plan, no output, nothing but the one error line
    assert r.stdout == "" and r.stderr.strip().count("\n") == 0, (r.stdout, r.stderr)
