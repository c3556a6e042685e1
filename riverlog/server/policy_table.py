# RabbitMQ's policies (issue 30: rabbitmqctl set_policy / clear_policy / list_policies and
# /api/policies): the table of one server, how a policy is checked, which policy a stream
# takes and what it changes in the stream's log settings. Pure values, no I/O (the file and
# the broker are runtime_policies.py's).
# Rules (rabbitmq-server deps/rabbit/src/rabbit_policy.erl, rabbit_policies.erl,
# rabbit_stream_queue.erl, v3.13.x / v4.0.x):
# - a policy is (vhost, name, pattern, definition, priority, apply-to); the pattern is a
#   regular expression searched in the queue name, unanchored unless it anchors itself
#   (re:run(Name, Pattern, [{capture, none}]));
# - a stream takes, among its vhost's policies that apply to queues ("all", "queues",
#   "streams"), the one of highest priority (sort_pred: priority >=; equal priorities are
#   ordered here by name so that the choice is stable);
# - its max-length-bytes, max-age and stream-max-segment-size-bytes win over the stream's own
#   x-arguments (rabbit_stream_queue:update_stream_conf, args_policy_lookup with
#   policy_precedence/2); a key the policy lacks leaves the stream's own setting;
# - a definition is checked as RabbitMQ checks it: no empty definition, every key known,
#   each value of its type; errors read "Validation failed\n\n<reason>\n" with Erlang terms.
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable

from ..config import MIN_SEGMENT_MAX_BYTES
from .rabbitmq_stream.arguments import MAX_SEGMENT_SIZE_BYTES, max_age_ms

APPLY_TO = ("all", "queues", "classic_queues", "quorum_queues", "streams", "exchanges")
"""The apply-to values RabbitMQ takes (rabbit_policy:apply_to_validation, 3.12+)."""
STREAM_APPLY_TO = frozenset(("all", "queues", "streams"))
"""The apply-to values whose policies a stream takes."""


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; ``str()`` is RabbitMQ's reason."""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    return _integer(value) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _max_age(value: Any) -> bool:
    try:
        return isinstance(value, str) and max_age_ms(value) >= 0
    except ValueError:
        return False


# definition keys RabbitMQ knows (rabbit_policies:validate_policy0 and the plugins'
# validators most used), each with its check and the reason RabbitMQ gives when it fails;
# streams act on the first three, the others are kept and shown only
_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max-length-bytes": (_non_negative, "~p is not a valid maximum length in bytes"),
    "max-age": (_max_age, "~p is not a valid max age"),
    "stream-max-segment-size-bytes": (
        lambda v: _non_negative(v) and v <= MAX_SEGMENT_SIZE_BYTES,
        "~p is not a valid segment size"),
    "stream-filter-size-bytes": (lambda v: _integer(v) and 16 <= v <= 255,
                                 "~p is not a valid filter size. Valid range is 16-255"),
    "queue-leader-locator": (_text, "~p is not a valid queue leader locator value"),
    "max-length": (_non_negative, "~p is not a valid maximum length"),
    "message-ttl": (_non_negative, "~p is not a valid message TTL"),
    "expires": (lambda v: _integer(v) and v >= 1, "~p is not a valid queue expiry"),
    "overflow": (lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"),
                 "~p is not a valid overflow value"),
    "dead-letter-exchange": (_text, "~p is not a valid dead letter exchange"),
    "dead-letter-routing-key": (_text, "~p is not a valid dead letter routing key"),
    "dead-letter-strategy": (lambda v: v in ("at-most-once", "at-least-once"),
                             "~p is not a valid dead letter strategy"),
    "delivery-limit": (_non_negative, "~p is not a valid delivery limit"),
    "alternate-exchange": (_text, "~p is not a valid alternate exchange"),
    "queue-version": (lambda v: v in (1, 2), "~p is not a valid queue version"),
    "federation-upstream": (_text, "~p is not a valid federation upstream"),
    "federation-upstream-set": (_text, "~p is not a valid federation upstream set"),
}


def erlang_term(value: Any) -> str:
    """``value`` (JSON) as Erlang's ``~p`` prints the term RabbitMQ decodes it to:
    ``<<"text">>``, ``5``, ``true``, ``[...]``, ``#{...}``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{erlang_term(k)} => {erlang_term(v)}"
                               for k, v in value.items()) + "}"
    return repr(value)


def _failed(reason: str) -> PolicyError:
    return PolicyError(f"Validation failed\n\n{reason}\n")


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """One policy: ``definition`` is the JSON object as given (checked by ``check``)."""

    vhost: str
    name: str
    pattern: str
    definition: dict
    priority: int = 0
    apply_to: str = "all"

    def to_json(self) -> dict[str, Any]:
        """RabbitMQ's shape (rabbit_mgmt_wm_policies): vhost, name, pattern, apply-to,
        definition, priority."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}

    def matches_stream(self, vhost: str, name: str) -> bool:
        """Whether this policy applies to stream ``name`` of ``vhost`` (rabbit_policy:
        matches: apply-to, vhost, and the pattern searched in the name)."""
        return (self.vhost == vhost and self.apply_to in STREAM_APPLY_TO
                and re.search(self.pattern, name) is not None)


def check(vhost: str, name: str, pattern: Any, definition: Any, priority: Any = 0,
          apply_to: Any = "all") -> Policy:
    """The Policy of these values; raises PolicyError with RabbitMQ's reason when it would
    refuse them (rabbit_policy:policy_validation, rabbit_parameter_validation:regex/number,
    apply_to_validation, validation/3, rabbit_policies:validate_policy0)."""
    if not name:
        raise _failed("name must not be empty")
    if not isinstance(pattern, str):
        raise _failed(f"pattern should be a string, actually was {erlang_term(pattern)}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _failed(f"pattern should be regular expression but is invalid: "
                      f"{{\"{exc.msg}\",{exc.pos or 0}}}") from None
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise _failed(f"priority should be a number, actually was {erlang_term(priority)}")
    if apply_to not in APPLY_TO:
        raise _failed(f"apply-to '{apply_to}' unrecognised; should be one of: 'queues', "
                      f"'classic_queues', 'quorum_queues', 'streams', 'exchanges', or 'all'")
    if not isinstance(definition, dict):
        raise _failed(f"definition must be a dictionary: {erlang_term(definition)}")
    if not definition:
        raise _failed("no policy provided")
    unknown = [(k, v) for k, v in definition.items() if k not in _KEYS]
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        raise _failed(f"[{terms}] are not recognised policy settings")
    for key, value in definition.items():
        valid, reason = _KEYS[key]
        if not valid(value):
            raise _failed(reason.replace("~p", erlang_term(value)))
    return Policy(vhost, name, pattern, dict(definition),
                  int(priority) if float(priority).is_integer() else priority, apply_to)


def stream_policy(policies: Iterable[Policy], vhost: str, name: str) -> Policy | None:
    """The policy stream ``name`` of ``vhost`` takes: the matching one of highest priority
    (then the first by name); None when none matches."""
    best = None
    for policy in policies:
        if policy.matches_stream(vhost, name) and (
                best is None or (-policy.priority, policy.name) < (-best.priority, best.name)):
            best = policy
    return best


def log_overrides(policy: Policy | None) -> dict[str, int]:
    """The LogConfig fields (riverlog.config) ``policy`` sets, which win over the stream's
    own: retention_max_bytes (max-length-bytes, bytes), retention_max_age_ms (max-age, ms),
    segment_max_bytes (stream-max-segment-size-bytes, raised to MIN_SEGMENT_MAX_BYTES as a
    Create argument is). Empty for None."""
    if policy is None:
        return {}
    d = policy.definition
    out = {}
    if "max-length-bytes" in d:
        out["retention_max_bytes"] = d["max-length-bytes"]
    if "max-age" in d:
        out["retention_max_age_ms"] = max_age_ms(d["max-age"])
    if "stream-max-segment-size-bytes" in d:
        out["segment_max_bytes"] = max(d["stream-max-segment-size-bytes"],
                                       MIN_SEGMENT_MAX_BYTES)
    return out


def to_json(policies: Iterable[Policy]) -> dict[str, Any]:
    """The file's content: ``{"version": 1, "policies": [Policy.to_json, ...]}``."""
    return {"version": 1, "policies": [p.to_json() for p in policies]}


def from_json(data: Any) -> dict[tuple[str, str], Policy]:
    """The table (keyed by (vhost, name)) of ``to_json``'s content; raises ValueError
    (PolicyError) for a bad one."""
    if not isinstance(data, dict) or not isinstance(data.get("policies"), list):
        raise ValueError("not a policies file: no \"policies\" list")
    table = {}
    for item in data["policies"]:
        policy = check(item["vhost"], item["name"], item["pattern"], item["definition"],
                       item.get("priority", 0), item.get("apply-to", "all"))
        table[(policy.vhost, policy.name)] = policy
    return table
