"""``local_session``'s choice of Spark's FileSystem-based checkpoint manager, found by name in the
``spark-sql`` jar of the Spark it starts (no Spark started here; the module's Spark tests check that
a real session carries it)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from oncelog.spark import FS_CHECKPOINT_MANAGERS, fs_checkpoint_manager


def _home_with(tmp_path: Path, *classes: str) -> str:
    jars = tmp_path / "jars"
    jars.mkdir()
    with zipfile.ZipFile(jars / "spark-sql_2.13-9.9.9.jar", "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for cls in classes:
            z.writestr(cls.replace(".", "/") + ".class", b"\xca\xfe\xba\xbe")
    return str(tmp_path)


def test_the_installed_spark_has_the_manager_under_its_current_name() -> None:
    pyspark = pytest.importorskip("pyspark")
    assert fs_checkpoint_manager(os.path.dirname(pyspark.__file__)) == FS_CHECKPOINT_MANAGERS[0]


def test_an_older_spark_gets_the_name_it_has(tmp_path: Path) -> None:
    older = FS_CHECKPOINT_MANAGERS[1]
    assert fs_checkpoint_manager(_home_with(tmp_path, older, "org.apache.spark.sql.Other")) == older


def test_a_spark_without_the_manager_keeps_its_default(tmp_path: Path) -> None:
    assert fs_checkpoint_manager(_home_with(tmp_path, "org.apache.spark.sql.Other")) is None
    assert fs_checkpoint_manager(str(tmp_path / "no-such-home")) is None
