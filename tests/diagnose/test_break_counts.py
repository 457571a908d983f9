"""Issue 34, items 1 and 4: one count of graph breaks on every surface, and a skipped frame said first.

Every surface is read from one real doctor run per model: the terminal summary, the HTML page (its card and its
heading), the JSON, the recommendation's advice and the checklist.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from fullgraph.diagnose import doctor as doc
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.summary import format_summary
from tests.diagnose.surfaces import counts as _counts
from tests.diagnose.surfaces import html_sections as _sections
from tests.diagnose.surfaces import html_text as _text
from tests.diagnose.targets import breaks

BREAKS_ITEM = "Graph breaks analysed and removed"


@pytest.fixture(scope="module")
def three_hits():
    model, args = breaks.three_hits()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(*args)
    return doc.doctor(model, args, modes=["eager", "default"], reps=3, profile=False), explained


@pytest.fixture(scope="module")
def skipped():
    model, args = breaks.skipped()
    return doc.doctor(model, args, modes=["eager", "default"], reps=3, profile=False)


def test_one_break_site_hit_three_times_is_one_count_on_every_surface(three_hits):
    r, explained = three_hits
    assert (explained.graph_break_count, explained.graph_count) == (3, 4)  # the reference
    assert r.graph_break_count == 3 and len(r.breaks) == 1 and r.breaks[0].count == 3

    text = format_summary(r, width=200)
    assert re.search(r"^graph breaks: 3 at 1 place \(4 graphs captured", text, re.M), text

    page = render_html(r)
    card = _text(re.search(r'<div class="stats">(.*?)</div>\s*</div>', page, re.S)[1])
    assert "3 graph breaks at 1 place" in card, card
    heading = _text(re.search(r"<h2>(.*?)</h2>", _sections(page)["graph-breaks"], re.S)[1])
    assert heading == "Graph breaks (3 at 1 place)"
    assert _counts(_text(page)) == {3}

    d = json.loads(r.to_json())
    assert (d["graph_break_count"], d["graph_break_places"]) == (3, 1)
    assert [g["count"] for g in d["graph_breaks"]] == [3]

    # The tiny model runs eagerly faster than in 4 graphs split by prints: the advice names the count.
    assert r.recommendation.config == "eager fp32", r.configs
    assert "remove its 3 graph breaks at 1 place first" in r.recommendation.code
    evidence = next(c.evidence for c in r.checklist if c.item == BREAKS_ITEM)
    assert evidence.startswith("3 graph breaks at 1 place (4 graphs captured)")
    for surface in (text, r.recommendation.code, evidence):
        assert _counts(surface) == {3}, surface


def test_a_skipped_frame_is_said_first_with_the_fix_for_its_own_line(skipped):
    r = skipped
    source = Path(breaks.__file__).read_text().splitlines()
    line = next(i for i, s in enumerate(source, 1) if "if y.mean() > 0:" in s)
    [frame] = r.skipped_frames
    assert (frame.file, frame.line, frame.function) == (breaks.__file__, line, "forward")
    assert "inside a loop" in frame.skipped and "torch.where" in frame.fix and "print" not in frame.fix
    assert r.breaks == [] and r.graph_break_count == 0  # never folded into the count

    text = format_summary(r, width=200)
    headline = text.index("ran eagerly: forward was not compiled: a graph break inside a loop")
    assert headline < text.index("graph breaks: 0")
    page = _text(render_html(r))
    assert page.index("ran eagerly forward was not compiled") < page.index("graph breaks")
    assert json.loads(r.to_json())["graph_breaks"][0]["skipped"] == frame.skipped
    item = next(c for c in r.checklist if c.item == BREAKS_ITEM)
    assert item.status == "fail" and "forward ran eagerly" in item.evidence
