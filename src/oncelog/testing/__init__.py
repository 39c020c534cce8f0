"""Helpers for tests and tools that need a real broker process on a free loopback port."""
