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


def test_a_long_title_is_not_cut_at_the_right_edge() -> None:
    """A title longer than the figure is set smaller: the title band's last columns stay background,
    as a person would see a whole title (before, "... records round robin" lost its end)."""
    from PIL import Image

    title = "p99 acknowledgement latency at scale, records round robin, much longer than fits (ms, log scale)"
    chart = charts.bar_chart(title, ["a", "b"], {"x": [1.0, 2.0]}, ylabel="ms")
    image = Image.open(io.BytesIO(chart.png)).convert("L")
    band = [image.getpixel((x, y)) for x in range(image.width - 6, image.width) for y in range(0, 30)]
    assert min(band) > 200, "the title runs into the right edge"
    whole = [image.getpixel((x, y)) for x in range(80, image.width - 6) for y in range(0, 30)]
    assert min(whole) < 100  # and there is a title
