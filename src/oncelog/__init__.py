"""oncelog: Kafka's exactly-once machinery in Python."""

__version__ = "0.1.0"
