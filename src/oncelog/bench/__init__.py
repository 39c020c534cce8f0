"""`oncelog bench`: throughput measured side by side in one run (ratios, never absolute gates)."""
