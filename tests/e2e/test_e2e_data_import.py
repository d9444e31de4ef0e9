"""Real browser (issue 22 §2): the Model page's images form previews the first images as the model sees them —
``<img>`` elements that the browser has decoded (nonzero natural width), at the input's 32×32."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fixtures.browser import CHROMIUM, idle, new_page

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="apt-get install -y chromium")

PREVIEW_IMAGES = """() => Array.from(document.querySelectorAll('[data-testid="stImage"] img'))
    .map(i => ({complete: i.complete, w: i.naturalWidth, h: i.naturalHeight}))"""


def test_the_preview_shows_the_images(server, browser, tmp_path):
    url, _, _ = server
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (40 + 10 * i, 60, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    page = new_page(browser, url, "/Model?model=sample:tiny-cnn")
    page.get_by_text("Layer inventory").wait_for(timeout=300_000)
    idle(page)
    page.get_by_text("Calibration and evaluation data (.npz, optional)").click()
    page.get_by_label("Folder or .zip of images on the server").fill(str(folder))
    page.get_by_role("button", name="Preview", exact=True).click()
    page.wait_for_function(f"() => ({PREVIEW_IMAGES})().filter(i => i.complete && i.w > 0).length === 3",
                           timeout=60_000)
    idle(page)
    shown = page.evaluate(PREVIEW_IMAGES)
    assert [(i["w"], i["h"]) for i in shown] == [(32, 32)] * 3  # the input's H×W, as the model sees them
    assert page.get_by_text("The first 3 images as the model sees them").is_visible()
    page.context.close()
