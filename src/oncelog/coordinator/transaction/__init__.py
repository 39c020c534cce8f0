"""The transaction coordinator: state machine, log records, and request handlers (sans-IO)."""
