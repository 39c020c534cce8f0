"""A Spark home for pip-installed PySpark whose Python workers import the installed ``pyspark``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` at the front of every Python worker's
``PYTHONPATH`` (``PythonUtils.sparkPythonPath``). The zip holds sources only, and Python caches no
bytecode for modules imported from a zip, so **every** Python process Spark starts (the worker
daemons, the data source planners, the streaming source and sink runners: about fifteen for one
streaming query) compiles PySpark's modules from source, and every task re-reads the zip's
1,485-entry directory (``importlib.invalidate_caches`` in ``setup_spark_files``). Measured on
this 2-core machine: a four-batch streaming job costs 57 CPU-seconds with the zip, 50 without.

For a pip install the zip is a copy of the installed package (same version, same files), which
does have its bytecode cached. :func:`worker_friendly_spark_home` builds, once per installation, a
directory of symlinks to everything in the real Spark home except ``python/lib/pyspark.zip``; with
``SPARK_HOME`` pointing at it, Spark's launch scripts, jars and configuration are the real ones,
and the workers' path entry for the zip names a file that does not exist, so Python skips it and
imports ``pyspark`` from site-packages.

Invariants:

- used only when the user has not chosen a Spark (``SPARK_HOME`` unset) and the installed package
  is the one the zip holds (``pyspark/version.py`` in the zip equals the installed version);
  otherwise ``None`` and Spark runs as shipped;
- the directory is built beside its final name and renamed into place, so a concurrent builder or
  a crash leaves either no directory or a complete one; a complete one is reused only if each of
  its links still points where it should; a damaged one is renamed aside (never emptied in place)
  and replaced.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path

ZIP_NAME = "pyspark.zip"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oncelog" / "spark-home"


def _zip_version(zip_path: Path) -> str | None:
    try:
        with zipfile.ZipFile(zip_path) as z:
            text = z.read("pyspark/version.py").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    m = re.search(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", text)
    return m.group(1) if m else None


#: Not linked: ``python`` (rebuilt without the zip) and ``work``, where a local cluster's workers
#: write their applications' directories: they go under the shadow home, not into site-packages.
NOT_LINKED = ("python", "work")


def _wanted_links(real: Path) -> dict[str, Path]:
    """Relative path in the shadow home -> target in the real one: every top-level entry but
    :data:`NOT_LINKED`, and every file of ``python/lib`` but the zip."""
    links = {e.name: e for e in real.iterdir() if e.name not in NOT_LINKED}
    lib = real / "python" / "lib"
    if lib.is_dir():
        links.update({f"python/lib/{e.name}": e for e in lib.iterdir() if e.name != ZIP_NAME})
    return links


def _complete(home: Path, links: dict[str, Path]) -> bool:
    try:
        return all(os.readlink(home / rel) == str(target) for rel, target in links.items())
    except OSError:
        return False


def worker_friendly_spark_home(cache_root: Path | None = None) -> Path | None:
    """The shadow Spark home for the installed PySpark, built if missing; ``None`` when it does not
    apply (``SPARK_HOME`` set, PySpark not pip-installed, the zip not matching) or cannot be built."""
    if os.environ.get("SPARK_HOME"):
        return None
    try:
        import pyspark
    except ImportError:
        return None
    real = Path(pyspark.__file__).resolve().parent
    zip_path = real / "python" / "lib" / ZIP_NAME
    if not (real / "jars").is_dir() or not (real / "bin").is_dir() or not zip_path.is_file():
        return None
    if _zip_version(zip_path) != pyspark.__version__:
        return None
    links = _wanted_links(real)
    key = hashlib.sha256(f"{real}\0{pyspark.__version__}".encode()).hexdigest()[:16]
    root = cache_root or _cache_root()
    home = root / f"{pyspark.__version__}-{key}"
    for _attempt in range(3):
        if _complete(home, links):
            return home
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        except OSError:
            return None
        try:
            (tmp / "python" / "lib").mkdir(parents=True)
            for rel, target in links.items():
                os.symlink(target, tmp / rel)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        try:
            os.rename(tmp, home)  # atomic; fails while a (non-empty) home is in place
            continue
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        if _complete(home, links):  # another builder's complete copy won
            return home
        # A damaged home (a link missing or pointing elsewhere): move it aside in one step, never
        # delete it in place, so a concurrent caller sees the old directory or none, then retry.
        aside = root / f".damaged-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(home, aside)
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    return home if _complete(home, links) else None
