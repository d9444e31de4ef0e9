"""Real browser (issue 13 §1, §2): state that survives a reload and quick editing, on tiny-cnn.

Rank, then on the Precision page: click a bar of the sensitivity chart and set it to FP16 in one
click; reload on every page (the project id in the URL brings back the model, the draft and the
run label); undo / redo; box-select bars with the chart toolbar, tick table rows; Reset asks
first; a second browser (a shared link) sees the same draft. Uses the server and browser fixtures
of test_e2e_browser.py; run it alone (it starts its own dashboard)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.project import open_project
from test_e2e_browser import CHROMIUM, _goto, _idle, _new_page, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="apt-get install -y chromium")
MODEL = "sample:tiny-cnn"


def _metrics(page) -> dict[str, str]:
    return page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('[data-testid="stMetric"]'))
        .map(m => [m.querySelector('[data-testid="stMetricLabel"]').innerText.trim(),
                   m.querySelector('[data-testid="stMetricValue"]').innerText.trim()]))""")


def _counts(page) -> dict[str, int]:
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stMetric\"]').length >= 4")
    _idle(page)
    m = _metrics(page)
    return {k: int(m[k]) for k in ("FP32", "FP16", "INT8")}


def _selected(page) -> int:
    text = page.get_by_text(re.compile(r"layers shown · \d+ selected")).first.inner_text()
    return int(re.search(r"(\d+) selected", text)[1])


def _chart(page):
    chart = page.get_by_test_id("stPlotlyChart").filter(has_text="select bars to edit them").first
    chart.evaluate("e => e.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(600)
    return chart


def _bars(chart) -> list[dict]:
    """The bars' boxes and their layer names (top bar first)."""
    rows = chart.evaluate("""e => { const gd = e.querySelector('.js-plotly-plot');
        return Array.from(e.querySelectorAll('g.trace.bars')).flatMap((tr, t) =>
            Array.from(tr.querySelectorAll('g.point')).map(g => {
                const r = g.querySelector('path').getBoundingClientRect();
                return {x: r.x, y: r.y, width: r.width, height: r.height,
                        name: gd._fullData[t].customdata[g.__data__.i][0]}; })); }""")
    return sorted(rows, key=lambda r: r["y"])


def _button(page, name: str):
    return page.get_by_role("button", name=name, exact=True)


def _policy(ws, pid: str):
    """The draft saved in the workspace under the project id (what a reload reads)."""
    from core.store.drafts import draft_key, load_draft
    from core.quant.policy import policy_from_dict

    p = open_project(MODEL, ws=ws)
    d = load_draft(ws, pid, draft_key(p.model.sha256, p.calib_data.sha256))
    return policy_from_dict(d.policy, p.model, p.layers) if d else p.default_policy()


def test_reload_undo_and_chart_and_table_selection(server, browser, tmp_path):  # noqa: F811
    url, ws = server
    p = open_project(MODEL, ws=ws)
    default = p.default_policy().precision_counts()
    page = _new_page(browser, url, f"/Sensitivity?model={MODEL}")
    page.get_by_role("button", name="Run the ranking").click()
    page.get_by_text("Stored ranking of").wait_for(timeout=180_000)
    _idle(page)
    _goto(page, "Precision")
    pid = re.search(r"project=([a-z0-9]+)", page.url)[1]
    assert "model=sample%3Atiny-cnn" in page.url or "model=sample:tiny-cnn" in page.url
    assert _counts(page) == {k.upper(): v for k, v in default.items()}

    chart = _chart(page)  # one click on the top bar (the most sensitive layer) selects it
    top = _bars(chart)[0]
    page.mouse.click(top["x"] + min(40, top["width"] / 2), top["y"] + top["height"] / 2)
    _idle(page)
    assert _selected(page) == 1
    _button(page, "→ FP16").click()
    _idle(page)
    assert _counts(page)["FP16"] == default["fp16"] + 1
    assert _policy(ws, pid).layers[top["name"]] == "fp16"  # autosaved
    box = page.get_by_label("Run label")
    box.fill("state e2e")
    box.press("Enter")
    _idle(page)

    for label, title in (("Model", "Model"), ("Sensitivity", "Sensitivity"),
                         ("Build and results", "Build and results"), ("Export", "Export")):
        _goto(page, label, title)
        assert f"project={pid}" in page.url, (label, page.url)
        page.reload()
        page.get_by_role("heading", name=title, exact=True).wait_for()
        _idle(page)
        sidebar = page.get_by_test_id("stSidebar")
        assert sidebar.get_by_text(MODEL, exact=True).count() >= 1, label  # not MiniLM, the default
        assert f"project={pid}" in page.url
    _goto(page, "Precision")
    assert _counts(page)["FP16"] == default["fp16"] + 1 and page.get_by_label("Run label").input_value() == "state e2e"

    _button(page, "Undo").click()
    _idle(page)
    assert _counts(page) == {k.upper(): v for k, v in default.items()}
    page.reload()
    page.get_by_role("heading", name="Precision", exact=True).wait_for()
    _idle(page)
    assert _counts(page)["FP16"] == default["fp16"]  # the undo was saved
    _button(page, "Redo").click()
    _idle(page)
    assert _counts(page)["FP16"] == default["fp16"] + 1

    chart = _chart(page)  # box select: the toolbar's Box Select, then a drag over the two top bars
    chart.hover()
    chart.locator("button.modebar-btn[data-title='Box Select']").click()
    bars = _bars(chart)[:2]
    drag = chart.locator("rect.nsewdrag").first.bounding_box()
    x0, y0 = drag["x"] + 2, bars[0]["y"] + 1
    x1, y1 = max(b["x"] + b["width"] for b in bars) + 5, bars[1]["y"] + bars[1]["height"] - 1
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move(x1, y1, steps=10)
    page.mouse.up()
    _idle(page)
    assert _selected(page) == 2
    _button(page, "→ FP32").click()
    _idle(page)
    pol = _policy(ws, pid)
    assert [pol.layers[b["name"]] for b in bars] == ["fp32", "fp32"]

    table = page.get_by_test_id("stDataFrame").first  # tick two rows: row selection in the table
    table.evaluate("e => e.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(500)
    page.get_by_test_id("stBaseButton-secondary").filter(has_text="Clear selection").click()  # (not the table's own)
    _idle(page)
    t = table.bounding_box()
    assert t["height"] >= 38 + 35 * len(p.layers) - 2  # every row of tiny-cnn visible (20 rows shown at most)
    for row in (0, 2):
        page.mouse.click(t["x"] + 17, t["y"] + 35 + 35 * row + 17)
        _idle(page)
    assert _selected(page) == 2
    _button(page, "→ FP16").click()
    _idle(page)
    names = [l.name for l in p.layers]
    pol = _policy(ws, pid)
    assert pol.layers[names[0]] == pol.layers[names[2]] == "fp16"
    _shot(page, tmp_path, "11-precision-selection")

    other = _new_page(browser, url, f"/Precision?project={pid}")  # a shared link: another browser
    other.get_by_role("heading", name="Precision", exact=True).wait_for()
    _idle(other)
    assert _counts(other) == {k.upper(): v for k, v in pol.precision_counts().items()}
    other.context.close()

    _button(page, "Reset to defaults").click()
    _idle(page)
    assert page.get_by_text("Reset every layer to the defaults?").count() == 1
    _button(page, "Cancel").click()
    _idle(page)
    assert _policy(ws, pid).sha256 == pol.sha256  # nothing reset
    _button(page, "Reset to defaults").click()
    _idle(page)
    _button(page, "Yes, reset").click()
    _idle(page)
    assert _counts(page) == {k.upper(): v for k, v in default.items()}
    assert _policy(ws, pid).sha256 == p.default_policy().sha256
    page.context.close()
