"""rules.py: a well-formed table, every rule documented in docs/rules.md with examples the lint agrees with, and
every rule planted in at least one case file."""

import re
from pathlib import Path

import pytest

from fullgraph.diagnose.lint import lint_source
from fullgraph.diagnose.rules import BY_ID, RULES

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "rules.md").read_text()
CASES = Path(__file__).parent / "lint_cases"


def doc_sections() -> dict[str, tuple[str, str]]:
    """rule id -> (name in the heading, the section's text), from the `## FG001 name` headings."""
    parts = re.split(r"^## (FG\d{3}) (\S+)\n", DOC, flags=re.MULTILINE)
    return {rule: (name, text) for rule, name, text in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)}


def example(section: str, label: str) -> str:
    m = re.search(rf"^{label}:\n\n```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert m, f"no {label} example"
    return m.group(1)


def test_ids_are_numbered_in_order_and_names_are_unique_kebab_case():
    assert [r.id for r in RULES] == [f"FG{i:03d}" for i in range(1, len(RULES) + 1)]
    assert len({r.name for r in RULES}) == len(RULES)
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", r.name) for r in RULES)
    assert {r.id: r for r in RULES} == BY_ID


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_message_quotes_the_code_once_and_fix_is_given(rule):
    assert rule.message.count("{what}") == 1
    assert "CODE" in rule.message.format(what="CODE")
    assert rule.fix and "{" not in rule.fix


def test_doc_has_a_section_for_exactly_the_rules_in_the_table():
    assert {rule: name for rule, (name, _) in doc_sections().items()} == {r.id: r.name for r in RULES}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_doc_section_says_what_why_fix_and_which_seed_errata(rule):
    _, text = doc_sections()[rule.id]
    for heading in ("**Catches**", "**Why.**", "**Fix.**"):
        assert heading in text, f"{rule.id} lacks {heading}"
    assert re.search(r"seed", text, re.IGNORECASE), f"{rule.id} does not say how the seeds bear on it"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_doc_examples_bad_is_reported_and_good_is_clean(rule):
    _, text = doc_sections()[rule.id]
    bad = lint_source(example(text, "Bad"), path=f"docs/rules.md:{rule.id}:bad")
    assert {f.rule for f in bad} == {rule.id}
    assert lint_source(example(text, "Good"), path=f"docs/rules.md:{rule.id}:good") == []


def test_every_rule_is_planted_in_a_case_file():
    text = "\n".join(p.read_text() for p in CASES.glob("*_bad.py"))
    planted = {rule.strip() for m in re.findall(r"#\s*expect:\s*(.+)$", text, re.MULTILINE) for rule in m.split(",")}
    assert planted >= set(BY_ID), f"no planted case for {sorted(set(BY_ID) - planted)}"
