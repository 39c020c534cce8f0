"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554: users on a running
broker, as librdkafka's AdminClient and kafka-configs.sh manage them.

Kafka's rules and messages (ScramControlManager, ScramImage): each user may appear once per Alter
request (else DUPLICATE_RESOURCE for that user, nothing applied to it); 4096 <= iterations <= 16384;
the client sends the *salted* password (it ran Hi itself), from which StoredKey and ServerKey are
derived here. Describe with no users lists them all. Both answer per user.

Beyond Kafka: an empty salt or a salted password that is not one hash long is UNACCEPTABLE_CREDENTIAL
(such a credential could never log in); and a user whose last credential is deleted loses its open
connections at once (Kafka keeps them until a reauthentication that is off by default).

Authorization: ``authorize_cluster_operation`` is the single seam (ALTER or DESCRIBE on the Cluster).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.security import scram
from oncelog.security.acl import Operation, ResourceType
from oncelog.security.credentials import validate_username
from oncelog.security.scram import ScramCredential, ScramMechanism
from oncelog.server import authz
from oncelog.storage.errors import DiskFullError
from oncelog.storage.refusals import storage_refused

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

DESCRIBE_DUPLICATE_USER = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_UNKNOWN_USER = "Attempt to describe a user credential that does not exist: "
ALTER_DUPLICATE_USER = "A user credential cannot be altered twice in the same request"
DELETE_UNKNOWN = "Attempt to delete a user credential that does not exist"


def authorize_cluster_operation(broker: Broker, req: Request, operation: str) -> bool:
    """May ``req.session.principal`` perform ``operation`` ("ALTER" or "DESCRIBE") on the Cluster
    resource? Kafka checks ALTER on Cluster for AlterUserScramCredentials and DESCRIBE on Cluster for
    DescribeUserScramCredentials. The single authorization seam of these two APIs: without an
    authorizer anyone who got this far may (with SASL on, an authenticated principal)."""
    return authz.allowed(broker, req, Operation[operation], ResourceType.CLUSTER)


def handle_describe_user_scram_credentials(broker: Broker, req: Request) -> dict[str, Any]:
    if not authorize_cluster_operation(broker, req, "DESCRIBE"):
        return {"error_code": ErrorCode.cluster_authorization_failed, "error_message": None, "results": []}
    users = broker.security.credentials.users()
    requested = [u.name for u in req.body.users] if req.body.users else sorted(users)
    counts = Counter(requested)
    results: list[dict[str, Any]] = []
    for name in dict.fromkeys(requested):  # first-seen order, once each
        if counts[name] > 1:
            results.append({"user": name, "error_code": ErrorCode.duplicate_resource,
                            "error_message": DESCRIBE_DUPLICATE_USER + name, "credential_infos": []})
        elif name not in users:
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": DESCRIBE_UNKNOWN_USER + name, "credential_infos": []})
        else:
            infos = sorted(({"mechanism": scram.MECHANISMS[m].type_id, "iterations": c.iterations}
                            for m, c in users[name].items()), key=lambda i: i["mechanism"])
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None,
                            "credential_infos": infos})
    return {"error_code": ErrorCode.none, "error_message": None, "results": results}


def _mechanism_error(name: str, mechanism_type: int) -> tuple[ErrorCode, str] | None:
    problem = validate_username(name)
    if problem is not None:
        return ErrorCode.unacceptable_credential, problem
    if mechanism_type not in scram.BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def _upsertion_error(u: Any) -> tuple[ErrorCode, str] | None:
    error = _mechanism_error(u.name, u.mechanism)
    if error is not None:
        return error
    mechanism = scram.BY_TYPE[u.mechanism]
    if u.iterations < mechanism.min_iterations:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if u.iterations > mechanism.max_iterations:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    if not u.salt:
        return ErrorCode.unacceptable_credential, "Salt must not be empty"
    if len(u.salted_password) != mechanism.digest_size:
        return (ErrorCode.unacceptable_credential,
                f"The salted password must be {mechanism.digest_size} bytes for {mechanism.name}")
    return None


#: What one user's credential takes in users.json, at most, besides its name (JSON escapes a
#: name's character in at most 6 bytes): mechanism, salt and keys in base64.
CREDENTIAL_BYTES = 1024


def _stored_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def handle_alter_user_scram_credentials(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    if not authorize_cluster_operation(broker, req, "ALTER"):
        names = dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
        return {"results": [{"user": n, "error_code": ErrorCode.cluster_authorization_failed,
                             "error_message": None} for n in names]}
    store = broker.security.credentials
    errors: dict[str, tuple[ErrorCode, str]] = {}
    deletions: dict[str, ScramMechanism] = {}
    upsertions: dict[str, tuple[ScramMechanism, ScramCredential]] = {}
    for d in body.deletions:
        if d.name in errors:
            continue
        if deletions.pop(d.name, None) is not None:
            errors[d.name] = (ErrorCode.duplicate_resource, ALTER_DUPLICATE_USER)
            continue
        error = _mechanism_error(d.name, d.mechanism)
        if error is None and store.get(d.name, scram.BY_TYPE[d.mechanism]) is None:
            error = (ErrorCode.resource_not_found, DELETE_UNKNOWN)
        if error is not None:
            errors[d.name] = error
        else:
            deletions[d.name] = scram.BY_TYPE[d.mechanism]
    for u in body.upsertions:
        if u.name in errors:
            continue
        if deletions.pop(u.name, None) is not None or upsertions.pop(u.name, None) is not None:
            errors[u.name] = (ErrorCode.duplicate_resource, ALTER_DUPLICATE_USER)
            continue
        error = _upsertion_error(u)
        if error is not None:
            errors[u.name] = error
            continue
        mechanism = scram.BY_TYPE[u.mechanism]
        upsertions[u.name] = (mechanism, ScramCredential.from_salted_password(
            mechanism, bytes(u.salt), bytes(u.salted_password), u.iterations))
    if upsertions:
        # users.json is written whole: past the disk space kept, new credentials are refused (a
        # client adding users in a loop would fill the disk); deletions still go through.
        try:
            broker.logs.check_meta_room(_stored_bytes(store.path)
                                        + sum(CREDENTIAL_BYTES + 6 * len(name) for name in upsertions))
        except DiskFullError as exc:
            storage_refused(exc)
            for name in upsertions:
                errors[name] = (ErrorCode.kafka_storage_error, str(exc))
            upsertions = {}
    if deletions or upsertions:
        try:
            store.alter(upsertions=[(n, m, c) for n, (m, c) in upsertions.items()],
                        deletions=list(deletions.items()))
        except OSError as exc:
            log.error("cannot write the user credentials: %s", exc)
            for name in (*deletions, *upsertions):
                errors[name] = (ErrorCode.unknown_server_error, f"The credentials could not be stored: {exc}")
            deletions, upsertions = {}, {}
        for name, mechanism in deletions.items():
            log.info("deleted the %s credential of user %r (by %s)", mechanism.name, name, _who(req))
        for name, (mechanism, _c) in upsertions.items():
            log.info("set the %s credential of user %r (by %s)", mechanism.name, name, _who(req))
        _close_connections_of_deleted_users(broker, req, deletions)
    results = [{"user": n, "error_code": ErrorCode.none, "error_message": None} for n in (*deletions, *upsertions)]
    results += [{"user": n, "error_code": code, "error_message": msg} for n, (code, msg) in errors.items()]
    return {"results": results}


def _who(req: Request) -> str:
    return str(getattr(req.session, "principal", "an in-process caller"))


def _close_connections_of_deleted_users(broker: Broker, req: Request, deleted: dict[str, ScramMechanism]) -> None:
    remaining = broker.security.credentials.users()
    gone = {f"User:{name}" for name in deleted if name not in remaining}
    if not gone:
        return
    for conn in list(broker.connections):
        if conn.principal in gone:
            log.info("closing connection from %s: its user %s was deleted", conn.peer, conn.principal)
            if conn is req.session:
                conn.close_after_response = True  # it still gets the answer to its own deletion
            else:
                conn.close()
