"""The shadow Spark home (``oncelog.spark.spark_home``): every entry of the real home but the
source zip, built once and atomically, never used when the user chose a Spark or the zip is not
the installed package. That a real session's Python workers import the installed PySpark is
checked in ``test_spark_pipeline.py``, on that module's session."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from oncelog.spark import spark_home  # noqa: E402
from oncelog.spark.spark_home import ZIP_NAME, worker_friendly_spark_home  # noqa: E402

REAL = Path(pyspark.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _no_user_spark_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)


def test_the_home_links_everything_but_the_zip(tmp_path: Path) -> None:
    home = worker_friendly_spark_home(tmp_path)
    assert home is not None and home.parent == tmp_path
    real_top = {e.name for e in REAL.iterdir()} - {"python", "work"}
    assert {e.name for e in home.iterdir()} == real_top | {"python"}
    for name in real_top:
        assert os.readlink(home / name) == str(REAL / name)
    assert (home / "python").is_dir() and not (home / "python").is_symlink()
    real_lib = {e.name for e in (REAL / "python" / "lib").iterdir()}
    assert ZIP_NAME in real_lib
    assert {e.name for e in (home / "python" / "lib").iterdir()} == real_lib - {ZIP_NAME}
    assert not (home / "python" / "lib" / ZIP_NAME).exists()
    # what Spark's launch scripts need resolves through the links
    assert (home / "bin" / "spark-submit").is_file() and any((home / "jars").iterdir())


def test_a_second_call_reuses_the_home_and_a_damaged_one_is_rebuilt(tmp_path: Path) -> None:
    home = worker_friendly_spark_home(tmp_path)
    assert home is not None
    marker = home / "python" / "marker"
    marker.write_text("same directory")
    assert worker_friendly_spark_home(tmp_path) == home and marker.exists()
    (home / "jars").unlink()  # damaged: a link missing
    assert worker_friendly_spark_home(tmp_path) == home
    assert os.readlink(home / "jars") == str(REAL / "jars") and not marker.exists()
    assert [p.name for p in tmp_path.iterdir()] == [home.name], "no build directory left behind"


def test_concurrent_builders_end_with_one_complete_home(tmp_path: Path) -> None:
    got: list[Path | None] = []
    threads = [threading.Thread(target=lambda: got.append(worker_friendly_spark_home(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0] is not None
    assert [p.name for p in tmp_path.iterdir()] == [got[0].name]


def test_not_used_when_the_user_set_spark_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HOME", str(REAL))
    assert worker_friendly_spark_home(tmp_path) is None
    assert not any(tmp_path.iterdir())


def test_not_used_when_the_zip_is_another_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspark, "__version__", "0.0.1")
    assert worker_friendly_spark_home(tmp_path) is None
    assert not any(tmp_path.iterdir())


def test_not_used_when_the_cache_cannot_be_written(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert worker_friendly_spark_home(blocked / "cache") is None


def test_the_zip_version_is_read_from_the_zip() -> None:
    assert spark_home._zip_version(REAL / "python" / "lib" / ZIP_NAME) == pyspark.__version__
