"""ACLs and the authorizer, sans-IO: Kafka's model (AclAuthorizer / StandardAuthorizer) and codes.

A binding says: ``principal`` from ``host`` is ALLOWed or DENYed ``operation`` on resources of
``resource_type`` whose name equals ``resource_name`` (LITERAL; the literal ``*`` matches every
name) or starts with it (PREFIXED). Decisions:

- a super user is allowed everything;
- a matching DENY for the operation (or ALL) wins over any ALLOW;
- a matching ALLOW for the operation (or ALL) allows; DESCRIBE is also granted by READ, WRITE,
  DELETE and ALTER, and DESCRIBE_CONFIGS by ALTER_CONFIGS (Kafka's implied operations);
- otherwise denied, unless no binding at all matches the resource and
  ``allow_everyone_if_no_acl_found`` is set.

Principals are ``<type>:<name>`` strings, compared whole; a request's principal is ``User:<name>``, so
only ``User:`` bindings can apply (``User:*`` matches any). Hosts are addresses (``*`` any).
The bindings persist in ``<data_dir>/__meta/acls.json``, replaced atomically on each change.

Invariant: ``bindings`` holds no duplicates and no binding with a wildcard type (ANY/MATCH/UNKNOWN);
a binding takes effect for the next request after ``create`` returns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path

from oncelog.storage import fileio


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# The operations each resource type supports (Kafka's AclEntry.supportedOperations): KIP-430's
# authorized operations report these. An ACL may name any other operation, as in Kafka; it is stored
# and grants only what ``authorize`` derives from it (at most DESCRIBE or DESCRIBE_CONFIGS, implied).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
                         Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DELETE, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE),
    ResourceType.TRANSACTIONAL_ID: (Operation.WRITE, Operation.DESCRIBE),
    ResourceType.DELEGATION_TOKEN: (Operation.DESCRIBE,),
    ResourceType.USER: (Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS),
}

_IMPLIED_BY: dict[Operation, tuple[Operation, ...]] = {
    Operation.DESCRIBE: (Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}


class InvalidAclError(ValueError):
    """A binding that cannot be stored (wildcard type, unknown operation, a principal that does not
    parse)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def validate(self) -> None:
        """Kafka's checks of a new ACL (AclControlManager.validateNewAcl, AclApis.handleCreateAcls),
        and its principal must parse as ``<type>:<name>`` (SecurityUtils.parseKafkaPrincipal; Kafka's
        authorizer fails on one that does not). Any concrete operation is accepted on any concrete
        resource type, as Kafka does."""
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise InvalidAclError("an ACL needs a concrete resource type")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError("an ACL's pattern type must be LITERAL or PREFIXED")
        if self.operation in (Operation.ANY, Operation.UNKNOWN):
            raise InvalidAclError("an ACL needs a concrete operation")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAclError("an ACL's permission must be ALLOW or DENY")
        if ":" not in self.principal:
            raise InvalidAclError(f"principal {self.principal!r} must look like <type>:<name>, e.g. User:alice")
        if not self.resource_name:
            raise InvalidAclError("an ACL needs a resource name")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidAclError(f"the cluster resource is named {CLUSTER_NAME!r}")

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        return name.startswith(self.resource_name)

    def applies_to(self, principal: str, host: str) -> bool:
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls/DeleteAcls filter: None (or ANY) matches everything in that field; pattern
    MATCH matches the bindings that would apply to the named resource (literal, wildcard, prefixes)."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and b.resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.MATCH:
            if self.resource_name is not None and not b.matches_resource(b.resource_type, self.resource_name):
                return False
        else:
            if self.pattern_type is not PatternType.ANY and b.pattern_type is not self.pattern_type:
                return False
            if self.resource_name is not None and b.resource_name != self.resource_name:
                return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation is not Operation.ANY and b.operation is not self.operation:
            return False
        return self.permission is Permission.ANY or b.permission is self.permission


class Authorizer:
    def __init__(self, path: Path | None, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.path = path
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self.bindings: list[AclBinding] = []
        self.generation = 0  # bumped by every change of the bindings (answers cached on them check it)
        if path is not None:
            raw = fileio.read_file(path)
            if raw is not None:
                self.bindings = [_from_json(d) for d in json.loads(raw)["acls"]]

    # --- decisions ------------------------------------------------------------------------------------
    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        matching = [b for b in self.bindings
                    if b.matches_resource(resource_type, name) and b.applies_to(principal, host)]
        if any(b.permission is Permission.DENY and b.operation in (operation, Operation.ALL) for b in matching):
            return False
        allowed_by = _IMPLIED_BY.get(operation, (operation,))
        if any(b.permission is Permission.ALLOW and (b.operation is Operation.ALL or b.operation in allowed_by)
               for b in matching):
            return True
        if self.allow_everyone_if_no_acl_found:
            return not any(b.matches_resource(resource_type, name) for b in self.bindings)
        return False

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """True if ``principal`` may do ``operation`` on at least one resource of the type: Kafka's
        ``Authorizer.authorizeByResourceType`` (KIP-679), step for step. First ``authorize`` on the
        hard-coded name ``hardcode`` (so super users, and allow.everyone.if.no.acl.found when no
        binding matches that name, are allowed whatever DENYs exist); then, over the bindings for
        the principal (or ``User:*``) and host whose operation is ``operation`` or ALL (no implied
        operations): a LITERAL ``*`` DENY denies; a LITERAL ``*`` ALLOW allows; an ALLOW on a
        literal name allows unless the same literal or a PREFIXED DENY on a prefix of it exists, and
        an ALLOW on a prefix allows unless a PREFIXED DENY on a prefix of that prefix exists."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        deny: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allow: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        has_wildcard_allow = False
        for b in self.bindings:
            if b.resource_type is not resource_type or not b.applies_to(principal, host) or \
                    b.operation not in (operation, Operation.ALL):
                continue
            if b.permission is Permission.DENY:
                if b.pattern_type is PatternType.LITERAL and b.resource_name == WILDCARD:
                    return False
                deny[b.pattern_type].add(b.resource_name)
            elif b.pattern_type is PatternType.LITERAL and b.resource_name == WILDCARD:
                has_wildcard_allow = True
            else:
                allow[b.pattern_type].add(b.resource_name)
        if has_wildcard_allow:
            return True
        for pattern_type, names in allow.items():
            for name in names:
                if pattern_type is PatternType.LITERAL and name in deny[PatternType.LITERAL]:
                    continue
                if not any(name[:i] in deny[PatternType.PREFIXED] for i in range(1, len(name) + 1)):
                    return True
        return False

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """KIP-430's bit field: bit ``op`` is set for each supported operation that is allowed."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << op
        return bits

    # --- changes --------------------------------------------------------------------------------------
    def create(self, bindings: list[AclBinding]) -> list[str | None]:
        """Add bindings (idempotent); per binding None or the reason it was refused."""
        errors: list[str | None] = []
        added = False
        for b in bindings:
            try:
                b.validate()
            except InvalidAclError as exc:
                errors.append(str(exc))
                continue
            errors.append(None)
            if b not in self.bindings:
                self.bindings.append(b)
                added = True
        if added:
            self.generation += 1
            self._save()
        return errors

    def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches; per filter the bindings it removed."""
        removed: list[list[AclBinding]] = []
        gone: set[AclBinding] = set()
        for f in filters:
            hit = [b for b in self.bindings if f.matches(b)]
            removed.append(hit)
            gone.update(hit)
        if gone:
            self.bindings = [b for b in self.bindings if b not in gone]
            self.generation += 1
            self._save()
        return removed

    def describe(self, f: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings if f.matches(b)]

    def _save(self) -> None:
        if self.path is None:
            return
        doc = {"version": 1, "acls": [_to_json(b) for b in self.bindings]}
        fileio.fs.write_atomic(self.path, json.dumps(doc, indent=1).encode())


def _to_json(b: AclBinding) -> dict[str, object]:
    d = asdict(b)
    for k in ("resource_type", "pattern_type", "operation", "permission"):
        d[k] = getattr(b, k).name
    return d


def _from_json(d: dict[str, str]) -> AclBinding:
    return AclBinding(ResourceType[d["resource_type"]], d["resource_name"], PatternType[d["pattern_type"]],
                      d["principal"], d["host"], Operation[d["operation"]], Permission[d["permission"]])
