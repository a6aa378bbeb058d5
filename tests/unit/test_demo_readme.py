"""README's demo figures are the demo's own (issue 48 §1): the verdicts README quotes for each
mode agree with what the demo printed (tests/data/demo/MODE.txt: the end of a `specdeck demo
--headless [--quick]` run): the same pairs, verdicts and prompts, each quoted difference inside
the printed interval. tests/cli/test_demo.py runs the quick demo and checks README and the
stored quick output against what it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.demo import disagreements, quoted, verdicts

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
STORED = ROOT / "tests" / "data" / "demo"


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_readme_quotes_what_the_demo_printed(mode):
    said = quoted(README.read_text(encoding="utf-8"), mode)
    printed = (STORED / f"{mode}.txt").read_text(encoding="utf-8")
    assert disagreements(said, printed) == []
    pairs = [(v["a"], v["b"]) for v in verdicts(said)]
    assert ("v5", "v4") in pairs, pairs  # the decision is quoted, in both modes
    prompts = {v["prompts"] for v in verdicts(said)}
    assert prompts == {8 if mode == "quick" else 16}


def test_verdicts_are_parsed_in_every_form():
    text = """Verdicts (paired over prompts, 95 %):
- v5 is worse than v4 (-0.39, 95 % CI -0.47..-0.32, 8 prompts, p = 0.008)
- v5 vs v4: no detectable difference (+0.81, 95 % CI -0.55..+2.21, 8 prompts, p = 0.211): about 36
- v5 ddtree-16 is better than baseline ddtree-16 (+0.0031, 95 % CI +0.0012..+0.08, 16 prompts, p = 0.02)
- not a verdict
"""
    got = verdicts(text)
    assert [(v["a"], v["b"], v["verdict"], v["delta"], v["ci"], v["prompts"]) for v in got] == [
        ("v5", "v4", "worse", -0.39, (-0.47, -0.32), 8),
        ("v5", "v4", "none", 0.81, (-0.55, 2.21), 8),
        ("v5 ddtree-16", "baseline ddtree-16", "better", 0.0031, (0.0012, 0.08), 16)]


def test_a_quote_that_disagrees_is_named():
    printed = "- v5 is worse than v4 (-0.39, 95 % CI -0.47..-0.32, 8 prompts, p = 0.008)\n"
    assert disagreements(printed, printed) == []
    assert disagreements("- v5 is worse than v4 (-0.45, 95 % CI -0.5..-0.4, 8 prompts, p = 0.01)",
                         printed) == []  # another run's digits, inside the printed interval
    assert disagreements("- v5 is worse than v4 (-0.55, 95 % CI -0.6..-0.5, 8 prompts, p = 0.01)",
                         printed) == ["v5 vs v4: quoted -0.55, outside the printed 95 % CI -0.47..-0.32"]
    assert disagreements("- v5 is better than v4 (+4.09, 95 % CI +2.57..+5.54, 8 prompts, p = 0.008)",
                         printed) == ["v5 vs v4: quoted better over 8 prompts, printed worse over 8"]
    assert disagreements("- v5 is better than baseline (+4.09, 95 % CI +2.57..+5.54, 8 prompts, "
                         "p = 0.008)", printed) == ["v5 vs baseline: quoted, not printed"]
    assert disagreements("the demo shows v5 winning", printed) == ["no verdict quoted"]
    assert quoted("x <!-- demo quick -->\n- a\n<!-- /demo --> y", "quick") == "\n- a\n"
    assert quoted("nothing here", "full") == ""
