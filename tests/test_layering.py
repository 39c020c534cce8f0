"""The architecture's import rules, checked on the source (ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "oncelog"

# package -> the oncelog packages it may import (besides itself and the leaf module oncelog.clock)
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "storage": {"protocol"},
    "coordinator": {"protocol", "storage"},
    "security": {"protocol", "storage"},
    "server": {"protocol", "storage", "coordinator", "security"},
    "spark": set(),
    "verify": set(),
}
LEAF = {"clock", "charts", "cli_args"}  # modules that import nothing of ours (checked below): any layer may use them


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "oncelog" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_layers_import_only_what_they_may() -> None:
    violations = []
    for package, allowed in ALLOWED.items():
        for path in (SRC / package).rglob("*.py"):
            bad = _imports(path) - allowed - LEAF - {package}
            if bad:
                violations.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_leaf_modules_import_nothing_of_ours() -> None:
    for leaf in LEAF:
        assert _imports(SRC / f"{leaf}.py") == set(), leaf


def test_only_server_awaits() -> None:
    offenders = []
    for package in ("protocol", "storage", "coordinator"):
        for path in (SRC / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            if any(isinstance(n, (ast.Await, ast.AsyncFunctionDef)) for n in ast.walk(tree)):
                offenders.append(str(path.relative_to(SRC)))
    assert not offenders, f"async code outside oncelog.server: {offenders}"


def test_checker_detects_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from oncelog.server.broker import Broker\nimport oncelog.storage.log_manager\n")
    assert _imports(bad) == {"server", "storage"}
