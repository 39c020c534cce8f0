"""The report checks can fail: a blank chart, a one-colour chart and a page whose image Chromium
cannot decode are each caught."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from oncelog import charts
from tests.bench.render import assert_picture, assert_rendered, render


def png(color: str, size: tuple[int, int] = (640, 380)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_a_real_chart_passes() -> None:
    chart = charts.line_chart("t", [charts.Series("a", [1, 2, 3], [1, 4, 2])], xlabel="x", ylabel="y")
    assert_picture(chart.png, "line chart")


@pytest.mark.parametrize("image", [png("white"), png("#336699"), png("white", (120, 80))])
def test_blank_tiny_or_flat_images_fail(image: bytes) -> None:
    with pytest.raises(AssertionError):
        assert_picture(image, "blank")


def test_a_page_with_an_undecodable_chart_fails(tmp_path: Path) -> None:
    good = charts.line_chart("t", [charts.Series("a", [1, 2, 3], [1, 4, 2])], xlabel="x", ylabel="y")
    broken = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really a png" * 50).decode()
    page = tmp_path / "p.html"
    page.write_text(charts.page("t", good.img("good") + f'<img src="data:image/png;base64,{broken}" alt="x">'))
    with pytest.raises(AssertionError, match="not a PNG"):
        assert_rendered(page, tmp_path, min_charts=2)
    decoded = [natural_width > 0 for _complete, natural_width, *_ in render(page, tmp_path).images]
    assert decoded == [True, False]  # what Chromium made of each <img>
