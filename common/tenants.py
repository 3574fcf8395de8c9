"""Tenants' settings: weight, tokens per minute and most requests queued, per tenant of a queue,
kept in Redis (``Keys.tenants``: a hash, one JSON object per tenant) so that every worker and
gateway reads the same, and ``genq tenants set`` changes them at run time with no restart.

A tenant's webhook secret is kept apart (``Keys.webhook_secrets``, outside ``genq:*``): only
gateways sign deliveries, so only their ACL user reads it. Setting or clearing a webhook needs
that user; any other change does not touch the secret.

A tenant with no entry has the defaults (``TenantSettings()``): weight 1, no limits. The
settings are read by ``genq tenants list``, ``genq stats`` and the queue's scheduling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from genq.common import webhooks
from genq.common.errors import ConfigError
from genq.common.keys import Keys
from genq.common.models import tenant_problem
from genq.common.wire import as_text

MAX_WEIGHT = 1_000_000.0
"""The largest weight a tenant may have (the smallest is anything above 0)."""


@dataclass(frozen=True, kw_only=True)
class TenantSettings:
    """One tenant's settings (the defaults: weight 1, no limits)."""

    weight: float = 1.0
    """Its share of the fleet against other backlogged tenants of the same priority: a tenant
    of weight 3 is served three times the tokens of one of weight 1."""
    tokens_per_minute: int = 0
    """Most tokens served to it in any 60 s (0: no limit). Requests over it wait; they do not
    fail."""
    max_queued: int = 0
    """Most of its requests waiting at once (0: no limit); beyond it its submits raise
    QueueFull (HTTP 429)."""
    webhook_url: str = ""
    """Where its webhook events go too ("": only the gateway's own endpoint)."""
    webhook_secret: str = field(default="", repr=False)
    """The ``whsec_...`` secret its events are signed with (never printed: ``public``, and left
    out of ``repr``, so a log line or a traceback showing the settings shows no secret)."""
    max_files: int = 0
    """Most uploaded files it keeps at a gateway at once (0: the gateway's
    ``--tenant-max-files``)."""
    max_stored_bytes: int = 0
    """Most bytes of uploaded files it keeps at once (0: the gateway's
    ``--tenant-max-stored-bytes``)."""
    max_batches: int = 0
    """Most batches it keeps at once (0: the gateway's ``--tenant-max-batches``)."""
    max_responses: int = 0
    """Most stored responses it keeps at once (0: the gateway's ``--tenant-max-responses``)."""
    max_priority: str = ""
    """The highest priority its requests may have (``high``, ``normal`` or ``low``; "": any).
    A request above it is refused at submission (the SUBMIT script: every producer, HTTP or
    not), never lowered."""
    share_prefixes: bool = False
    """Whether its prompts' prefix keys meet those of other tenants that share: requests of
    sharing tenants with one system prompt are placed together (a cache hit can then tell a
    sharing tenant, by timing, that another sent that prefix). Off: keys are per tenant."""

    def __post_init__(self) -> None:
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            raise ConfigError(f"weight must be a number above 0, got {w!r}")
        if not 0 < w <= MAX_WEIGHT:
            raise ConfigError(f"weight must be above 0 and at most {MAX_WEIGHT:g}, got {w!r}")
        for name in (
            "tokens_per_minute",
            "max_queued",
            "max_files",
            "max_stored_bytes",
            "max_batches",
            "max_responses",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{name} must be a whole number >= 0 (0: no limit), got {value!r}"
                )
        if self.max_priority not in ("", "high", "normal", "low"):
            raise ConfigError(
                f"max_priority must be high, normal or low ('' or any: no limit), got "
                f"{self.max_priority!r}"
            )
        if not isinstance(self.share_prefixes, bool):
            raise ConfigError(f"share_prefixes must be true or false, got {self.share_prefixes!r}")
        if self.webhook_url:
            webhooks.check_url(self.webhook_url)
        if self.webhook_secret:
            webhooks.secret_key(self.webhook_secret)

    def webhook(self, name: str, secret: str) -> webhooks.Endpoint | None:
        """The tenant's webhook endpoint, signed with ``secret`` (its entry in
        ``Keys.webhook_secrets``; else one an older genq stored with the settings); None: it
        has none, or no secret to sign with."""
        secret = secret or self.webhook_secret
        if not self.webhook_url or not secret:
            return None
        return webhooks.Endpoint(f"tenant:{name}", self.webhook_url, secret)

    def public(self) -> dict[str, Any]:
        """The settings as shown by ``genq tenants``: the webhook secret only as set or not (a
        webhook is never set without one)."""
        shown = asdict(self)
        shown["webhook_secret"] = "(set)" if self.webhook_url or self.webhook_secret else ""
        return shown

    def to_json(self) -> str:
        """The stored form: everything but the webhook secret (kept apart)."""
        doc = asdict(self)
        del doc["webhook_secret"]
        return orjson.dumps(doc).decode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> TenantSettings:
        """The stored form back; fields it does not know are left out (a newer genq's)."""
        doc: Any = orjson.loads(raw)
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def check_name(name: str) -> str:
    """``name`` if it is a valid tenant name, else ConfigError saying why."""
    problem = tenant_problem(name)
    if problem is not None:
        raise ConfigError(problem)
    return name


def read_all(r: Any, keys: Keys) -> dict[str, TenantSettings]:
    """Every tenant with settings of its own, by name (one HGETALL). An entry that cannot be
    read (written by hand) is left out: the tenant has the defaults."""
    return parse_all(r.hgetall(keys.tenants) or {})


def parse_all(stored: dict[Any, Any]) -> dict[str, TenantSettings]:
    """``read_all``'s answer from the tenants hash as stored (name -> JSON)."""
    out: dict[str, TenantSettings] = {}
    for name, raw in stored.items():
        try:
            out[as_text(name)] = TenantSettings.from_json(raw)
        except (ConfigError, orjson.JSONDecodeError, TypeError, AttributeError):
            continue
    return out


def update(r: Any, keys: Keys, name: str, **changes: Any) -> TenantSettings:
    """Set some of a tenant's settings (the others keep their values, or the defaults) and
    return them all. Raises ConfigError for a bad name or value, writing nothing. The webhook
    secret goes to ``Keys.webhook_secrets`` (read or written only when the webhook changes, or
    to move one stored with the settings by an older genq); clearing the URL clears it."""
    check_name(name)
    raw = r.hget(keys.tenants, name)
    current = asdict(TenantSettings.from_json(raw)) if raw else {}
    given = {k: v for k, v in changes.items() if v is not None}
    merged = {**current, **given}
    secret = given.get("webhook_secret") or current.get("webhook_secret") or ""
    hook_changed = "webhook_url" in given or "webhook_secret" in given or bool(secret)
    if hook_changed:
        if not merged.get("webhook_url"):
            if given.get("webhook_secret"):
                raise ConfigError("a webhook needs both --webhook-url and --webhook-secret")
            secret = ""
        elif not secret:
            secret = as_text(r.hget(keys.webhook_secrets, name) or b"")
            if not secret:
                raise ConfigError("a webhook needs both --webhook-url and --webhook-secret")
        merged["webhook_secret"] = secret
    settings = TenantSettings(**merged)
    if hook_changed and settings.webhook_url:
        webhooks.endpoint("tenant", settings.webhook_url, settings.webhook_secret)
    with r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.tenants, name, settings.to_json())
        if hook_changed and secret:
            pipe.hset(keys.webhook_secrets, name, secret)
        elif hook_changed:
            pipe.hdel(keys.webhook_secrets, name)
        pipe.execute()
    return settings


def delete(r: Any, keys: Keys, name: str) -> bool:
    """Back to the defaults: whether the tenant had settings of its own (its webhook secret
    goes too)."""
    raw = r.hget(keys.tenants, check_name(name))
    if raw is None:
        return False
    try:
        had_hook = bool(TenantSettings.from_json(raw).webhook_url)
    except (ConfigError, orjson.JSONDecodeError, TypeError, AttributeError):
        had_hook = True  # unreadable: clear whatever it had
    with r.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.tenants, name)
        if had_hook:
            pipe.hdel(keys.webhook_secrets, name)
        pipe.execute()
    return True
