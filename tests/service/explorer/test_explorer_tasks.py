"""The explorer on the tasks beside classifiers (CONTRACT 9.4), in a real browser: a product
manager's view of a question answered (the answer's tokens marked), a segmentation class, a
detector's top box, a multi-label tagger's labels over 0.5 and a regression's predicted value,
each drawn with the numbers the API gives for the request the page sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.service.conftest import Server, serve_in_thread
from tests.service.explorer.test_explorer import Page, api, browser  # noqa: F401  (a fixture)
from tests.task_models import build


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("explorer-tasks")
    server = serve_in_thread(root, toml=build(root))
    yield server
    assert server.app_thread is not None
    server.app_thread.stop()


@pytest.fixture
def page(browser: Any, tasks: Server) -> Iterator[Page]:  # noqa: F811
    p = Page(browser, tasks)
    yield p
    assert p.errors == []
    p.close()


def test_a_question_is_answered_and_its_tokens_marked(page: Page) -> None:
    page.open()
    page.choose("qa", ["saliency"])
    assert page.page.get_by_label("Target", exact=True).get_attribute("placeholder") == "span"
    context = "the acting was great but the plot was dull"
    page.page.get_by_label("Input", exact=True).fill(f"what was good ||| {context}")
    page.explain()
    (sent,) = page.requests("saliency")
    assert sent["inputs"] == [{"question": "what was good", "context": context}]
    assert sent["target"] is None
    want = api(page.server, "qa", sent)
    region = page.page.get_by_role("region", name="saliency", exact=True)
    answer = want["answers"][0]
    assert f"answer “{answer['text']}”" in region.inner_text()
    marked = region.locator(".tokens span.answer").all_inner_texts()
    first, last = answer["tokens"]
    assert marked == want["tokens"][0][first : last + 1]
    np.testing.assert_allclose(page.scores("saliency"), want["attributions"][0], rtol=1e-5)
    assert "raises the answer's score" in region.inner_text()


def test_multi_label_shows_the_labels_over_one_half(page: Page) -> None:
    page.open()
    page.choose("tags", ["integrated_gradients"])
    row = [0.5, -1.0, 2.0, 0.3, -0.2, 1.1]
    page.page.get_by_label("Input", exact=True).fill(f"[{row}]")
    page.page.get_by_label("Target", exact=True).fill("c")
    page.explain()
    (sent,) = page.requests("integrated_gradients")
    want = api(page.server, "tags", sent)
    np.testing.assert_allclose(page.scores("integrated_gradients"), want["attributions"][0],
                               rtol=1e-6)  # fmt: skip
    shown = page.page.locator("#prediction").inner_text()
    import torch

    from tests.task_models import tagger

    with torch.no_grad():
        probs = torch.sigmoid(tagger().double()(torch.tensor([row], dtype=torch.float64)))[0]
    over = [name for name, p in zip("abcd", probs.tolist(), strict=True) if p > 0.5]
    assert (f"Labels over 0.5: {', '.join(over)}" if over else "No label over 0.5") in shown


def test_regression_says_what_raises_the_value(page: Page) -> None:
    page.open()
    page.choose("price", ["integrated_gradients"])
    assert page.page.get_by_label("Target", exact=True).get_attribute("placeholder") == "(none)"
    page.page.get_by_label("Input", exact=True).fill("[[1.0, 0.5, -0.2, 0.3, 2.0]]")
    page.explain()
    (sent,) = page.requests("integrated_gradients")
    assert sent["target"] is None
    want = api(page.server, "price", sent)
    np.testing.assert_allclose(page.scores("integrated_gradients"), want["attributions"][0],
                               rtol=1e-6)  # fmt: skip
    region = page.page.get_by_role("region", name="integrated_gradients", exact=True)
    assert "raises the predicted value" in region.inner_text()
    assert "Predicted value:" in page.page.locator("#prediction").inner_text()


def test_a_segmentation_class_and_a_detectors_top_box(page: Page, tmp_path: Path) -> None:
    page.open()
    page.choose("roads", ["saliency"])
    x = np.random.default_rng(0).random((1, 3, 16, 16)).round(3).tolist()
    page.page.get_by_label("Input", exact=True).fill(str(x))
    page.page.get_by_label("Target", exact=True).fill("road")
    page.explain()
    (sent,) = page.requests("saliency")
    assert sent["target"] == {"class": "road", "region": "predicted"}
    api(page.server, "roads", sent)
    page.choose("cars", ["feature_ablation"])
    x = np.random.default_rng(1).random((1, 3, 32, 32)).round(3).tolist()
    page.page.get_by_label("Input", exact=True).fill(str(x))
    page.page.get_by_label("Target", exact=True).fill("")
    page.explain()
    (sent,) = page.requests("feature_ablation")
    assert sent["target"] is None
    want = api(page.server, "cars", sent)
    region = page.page.get_by_role("region", name="feature_ablation", exact=True)
    box = want["target"][0]
    text = region.inner_text()
    assert "detections" in text and ["person", "bicycle", "car"][box["label"]] in text


def test_an_image_and_its_texts_are_matched(page: Page, tmp_path: Path) -> None:
    from tests.service.explorer.test_explorer import blocks

    png = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
        png
    )
    page.open()
    page.choose("match", ["saliency"])
    page.page.get_by_label("Image", exact=True).set_input_files(str(png))
    page.page.wait_for_selector("body[data-image]")
    page.page.get_by_label("Input", exact=True).fill("a good film\nthe plot")
    page.explain()
    (sent,) = page.requests("saliency")
    assert [x["text"] for x in sent["inputs"]] == ["a good film", "the plot"]
    assert sent["target"] is None
    want = api(page.server, "match", sent)
    tokens = want["tokens"][0]
    image = blocks(np.asarray(want["attributions"]["image"][0]))
    text = want["attributions"]["text"][0][: len(tokens)]
    np.testing.assert_allclose(page.scores("saliency"), [*image, *text], rtol=1e-5, atol=1e-7)
    region = page.page.get_by_role("region", name="saliency", exact=True)
    assert "similarity" in region.inner_text()
    assert "Similarity:" in page.page.locator("#prediction").inner_text()
