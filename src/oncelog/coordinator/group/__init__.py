"""The classic consumer-group coordinator and offset storage (sans-IO)."""
