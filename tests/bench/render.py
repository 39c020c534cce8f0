"""Look at a report as a person would: render it in headless Chromium (Debian's package), and check
that every chart was decoded by the browser, that each chart's PNG is a picture (not a blank or
one-colour image), and that the screenshot of the page is not blank.

Used by the bench and verify report tests. A missing Chromium fails the test with a message saying
how to install it (`make setup` does, as root), never skips it.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

_PROBE = """<script>
window.addEventListener('load', function () {
  var images = Array.prototype.map.call(document.images, function (i) {
    var r = i.getBoundingClientRect();
    return [i.complete, i.naturalWidth, i.naturalHeight, Math.round(r.width), Math.round(r.height)];
  });
  document.body.setAttribute('data-images', JSON.stringify(images));
});
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is not installed: the report rendering tests need Debian's chromium package "
                    "(`make setup` installs it when run as root; otherwise `apt-get install chromium`)")
    return path


def _run(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180)


@dataclass
class Rendered:
    images: list[list[int]]  # per <img>: complete, natural width, natural height, shown width, shown height
    screenshot: Path


def render(report: Path, out_dir: Path) -> Rendered:
    """Load ``report`` in Chromium twice: once with a probe script that records what the browser
    made of every <img> (DOM dump), once for a 1400 x 3000 screenshot."""
    probe = out_dir / f"{report.stem}-probe.html"
    text = report.read_text()
    probe.write_text(text.replace("</body>", _PROBE + "</body>"))
    shot = out_dir / f"{report.stem}-screenshot.png"
    with tempfile.TemporaryDirectory(prefix="oncelog-chromium-") as profile:
        dom = _run(["--virtual-time-budget=10000", "--dump-dom", probe.resolve().as_uri()], Path(profile))
        assert dom.returncode == 0, dom.stderr[-2000:]
        m = re.search(r'data-images="([^"]*)"', dom.stdout)
        assert m, f"Chromium did not run the page's load event: {dom.stdout[:500]!r} {dom.stderr[-1000:]}"
        images = json.loads(m.group(1).replace("&quot;", '"'))
        r = _run(["--screenshot=" + str(shot), "--window-size=1400,3000", "--hide-scrollbars",
                  report.resolve().as_uri()], Path(profile))
        assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    return Rendered(images, shot)


def embedded_pngs(report: Path) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', report.read_text())]


def assert_picture(png: bytes, what: str) -> None:
    """A chart, not a blank: a real size, many colours, and pixel values that vary."""
    from PIL import Image, ImageStat

    try:
        image = Image.open(io.BytesIO(png)).convert("RGB")
    except OSError as exc:
        raise AssertionError(f"{what}: not a PNG Pillow can decode ({exc})") from exc
    w, h = image.size
    assert w >= 300 and h >= 150, f"{what}: {w}x{h} px is too small to be a chart"
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 8, f"{what}: only {len(colours or [])} colours"
    spread = ImageStat.Stat(image).stddev
    assert max(spread) > 10, f"{what}: pixel values hardly vary ({spread}): a blank image"
    small = image.resize((w // 4, h // 4))
    non_white = sum(1 for v in small.convert("L").tobytes() if v < 235)
    assert non_white > small.width * small.height * 0.02, f"{what}: almost all white ({non_white} drawn pixels)"


def assert_rendered(report: Path, out_dir: Path, *, min_charts: int) -> Rendered:
    """Every chart embedded in ``report`` is a picture, Chromium decoded and laid out each one, and
    the screenshot shows a page with content and colour."""
    from PIL import Image

    pngs = embedded_pngs(report)
    assert len(pngs) >= min_charts, f"{report}: {len(pngs)} charts, expected at least {min_charts}"
    for i, png in enumerate(pngs):
        assert_picture(png, f"{report.name} chart {i}")
    rendered = render(report, out_dir)
    assert len(rendered.images) == len(pngs), rendered.images
    for i, (complete, nw, nh, shown_w, shown_h) in enumerate(rendered.images):
        assert complete and nw >= 300 and nh >= 150, f"chart {i} not decoded by Chromium: {rendered.images[i]}"
        assert shown_w > 100 and shown_h > 50, f"chart {i} laid out at {shown_w}x{shown_h} px"
    shot = Image.open(rendered.screenshot).convert("RGB")
    assert shot.size == (1400, 3000), shot.size
    small = shot.resize((350, 750))
    total = small.width * small.height
    drawn = sum(1 for v in small.convert("L").tobytes() if v < 235)
    coloured = sum(1 for v in small.convert("HSV").getchannel("S").tobytes() if v > 60)
    assert drawn > total * 0.05, f"screenshot almost blank: {drawn} of {total} pixels drawn"
    assert coloured > total * 0.005, f"screenshot has no colour (charts missing?): {coloured} of {total} pixels"
    return rendered
