"""Authentication and authorization, sans IO: SASL (PLAIN, SCRAM-SHA-256/512) state machines, SCRAM
credentials and their store, the listener's TLS context, and ACLs with the authorizer. The server
wires them to connections and handlers; see ``docs/design/security.md``."""
