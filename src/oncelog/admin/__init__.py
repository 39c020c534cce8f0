"""Command-line administration of a running broker over the Kafka protocol (any Kafka broker)."""
