# NATS subjects: what a valid one is, how wildcards match, and riverlog's cap on their length.
# Owns the checks every NATS subject riverlog accepts from a client goes through (stream
# subjects and queue groups at CreateStream, ack inboxes, PublishToSubject subjects) before it
# reaches a control line, because nats-server answers an over-long or malformed control line
# with -ERR and closes the connection (nats-server parser.go: "Maximum Control Line Exceeded"
# past max_control_line, 4096 bytes by default), which would cut the NATS door off.
# Rules (nats-server sublist.go IsValidSubject/IsValidLiteralSubject, docs.nats.io "Subject-
# Based Messaging"): tokens are separated by ".", none is empty; no whitespace; `*` as a whole
# token matches one token, `>` as the last token matches one or more; a literal subject (one
# published to) has no wildcard token. riverlog also refuses control characters and subjects
# over MAX_SUBJECT_BYTES (UTF-8).
from __future__ import annotations

import re

MAX_SUBJECT_BYTES = 1024
"""Longest subject (and queue group) riverlog accepts, in UTF-8 bytes: with a partition suffix,
a queue group and the protocol words it stays far below nats-server's 4096-byte control line."""

_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")  # control characters and whitespace


def _text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a subject or queue group in a NATS protocol line (too long,
    whitespace or control characters), or None."""
    if len(text) * 4 > MAX_SUBJECT_BYTES and len(text.encode()) > MAX_SUBJECT_BYTES:
        return f"is longer than {MAX_SUBJECT_BYTES} bytes"
    if _FORBIDDEN.search(text):
        return "has whitespace or a control character"
    return None


def subject_problem(subject: str, wildcards: bool = False) -> str | None:
    """None when ``subject`` is a valid NATS subject (with ``wildcards``: `*`/`>` tokens
    allowed, as in a subscription; else a literal subject, as published to); else why not,
    as a short phrase ("is empty", "has an empty token", ...)."""
    if not subject:
        return "is empty"
    problem = _text_problem(subject)
    if problem is not None:
        return problem
    tokens = subject.split(".")
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if not token:
            return "has an empty token"
        if token == "*" or token == ">":
            if not wildcards:
                return "has a wildcard"
            if token == ">" and i != last:
                return "has `>` before its last token"
    return None


def queue_problem(queue: str) -> str | None:
    """None when ``queue`` is a usable queue group name ("" is none); else why not."""
    return _text_problem(queue) if queue else None


def has_wildcard(subject: str) -> bool:
    """True when ``subject`` has a `*` or `>` token."""
    return any(token == "*" or token == ">" for token in subject.split("."))


def matches(pattern: str, subject: str) -> bool:
    """True when the NATS subscription ``pattern`` receives messages published on the literal
    ``subject``."""
    want = pattern.split(".")
    got = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(got) == len(want)
