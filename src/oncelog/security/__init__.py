"""Authentication, sans IO: SASL (PLAIN, SCRAM-SHA-256/512) state machines, SCRAM credentials and their
store, and the TLS context of the listener. The server wires them to connections
(``oncelog.server.connection``, ``oncelog.server.handlers.sasl``); see ``docs/design/security.md``."""
