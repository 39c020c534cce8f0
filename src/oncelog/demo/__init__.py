"""oncelog.demo: the payments pipeline under injected faults (`oncelog demo`), and its harness."""
