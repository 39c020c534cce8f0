"""The real broker with one fault armed, for crash tests: ``python tests/faults/fault_broker.py FAULT
<oncelog broker args>``. Fault injection lives here, in the tests, not in the broker's code.

Faults:
- ``after_prepare``: exit(17) right after a transaction's PrepareCommit/PrepareAbort record was
  appended, before any COMMIT/ABORT marker is written (the two-phase commit's window).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

EXIT_CODE = 17


def arm(fault: str) -> None:
    from oncelog.server.coordination import Coordination

    if fault == "after_prepare":
        def crash(self: Any, markers: Any, **_options: Any) -> None:
            print(f"fault after_prepare: exiting before the markers of {markers.transactional_id!r}",
                  file=sys.stderr, flush=True)
            os._exit(EXIT_CODE)

        Coordination._write_markers = crash  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown fault {fault!r}")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    fault, args = sys.argv[1], sys.argv[2:]
    arm(fault)
    from oncelog.cli import main as oncelog_main

    sys.argv = ["oncelog", "broker", *args]
    oncelog_main()


if __name__ == "__main__":
    main()
