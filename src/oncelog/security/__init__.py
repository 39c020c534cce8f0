"""Authentication and authorization: SASL credentials, ACLs."""
