"""The verify report looked at as a person would: rendered in headless Chromium, every chart decoded
and laid out, each chart a picture rather than a blank, and the page's screenshot not blank."""

from __future__ import annotations

from pathlib import Path

from oncelog.verify.checker import check
from oncelog.verify.report import write_html
from tests.bench.render import assert_rendered
from tests.verify.test_report import history


def test_verify_report_renders_in_chromium_with_every_chart(tmp_path: Path) -> None:
    h = history()
    report = check(h)
    assert not report.ok
    out = tmp_path / "verify-report.html"
    write_html(out, h, report, "oncelog verify: a history with anomalies")
    # timeline, rates, latency over time, latency by percentile, and a close-up per listed anomaly
    rendered = assert_rendered(out, tmp_path, min_charts=5)
    assert len(rendered.images) >= 4 + min(len(report.anomalies), 1)
