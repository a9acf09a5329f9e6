"""Value parsers for ``flowdir``'s flags: each turns one command-line string into a checked
value or raises ``argparse.ArgumentTypeError`` with a one-line reason naming the value.
Imports flowlib and the directory's protocol.
"""

from __future__ import annotations

import argparse

from flowlib import FlowID, Locality

from . import protocol as P


def flow_arg(text: str) -> FlowID:
    try:
        return FlowID.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def flow_or_any(text: str) -> str:
    return "*" if text == "*" else str(flow_arg(text))


def lsid_arg(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"LSID {text!r} is not a number (e.g. 16 or 0x10)") \
            from None
    if not 0 < value < 1 << 32:
        raise argparse.ArgumentTypeError(f"LSID {text!r} must be 1..0xffffffff")
    return value


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def ring(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ring {text!r} is not an integer") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"ring {text!r} must be 0..255")
    return value


def ring_type(text: str) -> Locality:
    if text.strip().lower() in ("ttl", "hops", "none"):
        return Locality.NONE
    try:
        return Locality.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"ring type {text!r}: use ttl, geography, delay or bandwidth") from None


def scope(text: str) -> P.Scope:
    kind, sep, value = text.partition(":")
    try:
        if not sep:
            return P.Reach.of(int(text, 0)).ttl
        scope = (Locality.parse(kind), int(value, 0))
        P.Reach.of(scope)
        return scope
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"scope {text!r} must be a TTL (e.g. 2) or TYPE:VALUE (e.g. geography:2): "
            f"{exc}") from None


def kind(text: str) -> str:
    if text == "*":
        return text
    try:
        return P.check_kind(text)
    except P.ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def name(text: str) -> str:
    try:
        return P.check_name(text)
    except P.ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
