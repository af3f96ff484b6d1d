# -*- test-case-name: tests.unit.test_web_api -*-
"""Checking request fields: every bad value is a 400 that names the field.

JSON gives no guarantee about types, and a TypeError deep in the broker
would be a 500; so every field a handler reads goes through one of these.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from mqserver.limits import Limits
from mqserver.web.router import APIError, raw

MAX_TTL = 10 * 365 * 86400.0
"""The longest ``ttl`` a publish may ask for, in seconds."""

_NAME_PARAMS = ("queue", "event")
"""Path parameters that are queue or event names; every other one is an id."""


def bad_request(message: str) -> APIError:
    """A broken limit (``mqserver.limits``) as the 400 it is over HTTP."""
    return APIError(400, message)


def check_params(limits: Limits, params: dict[str, bytes]) -> None:
    """Path parameters obey the name and id rules before any handler sees them."""
    for key, value in params.items():
        if key in _NAME_PARAMS:
            limits.check_name(value, f"{key} name", bad_request)
        else:
            limits.check_id(value, key, bad_request)


def number(
    obj: dict[str, Any],
    key: str,
    default: float | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    integer: bool = False,
) -> Any:
    """A number field (None or absent gives ``default``), within bounds."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        try:
            value = float(value) if not integer else int(value)
        except ValueError:
            raise APIError(400, f"{key!r} must be a number") from None
    # an int is compared as it is: math.isfinite or float() of a 400-digit one overflows
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise APIError(400, f"{key!r} must be a number")
    if integer and value != int(value):
        raise APIError(400, f"{key!r} must be an integer")
    if minimum is not None and value < minimum:
        raise APIError(400, f"{key!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise APIError(400, f"{key!r} must be at most {maximum}")
    if integer:
        return int(value)
    try:
        return float(value)
    except OverflowError:
        raise APIError(400, f"{key!r} is too large") from None


def boolean(obj: dict[str, Any], key: str, default: bool = False) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
        return value.lower() in ("1", "true", "yes")
    if not isinstance(value, bool):
        raise APIError(400, f"{key!r} must be true or false")
    return value


def string(obj: dict[str, Any], key: str, default: str | None = None) -> str | None:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise APIError(400, f"{key!r} must be a non-empty string")
    return value


def checked(
    obj: dict[str, Any], key: str, limits: Limits, ids: bool = False
) -> bytes | None:
    """A string field naming a queue (or an id, with ``ids``) as bytes, within ``limits``."""
    value = string(obj, key)
    if value is None:
        return None
    result = raw(value)
    check = limits.check_id if ids else limits.check_name
    return check(result, repr(key), bad_request)


def names(
    obj: dict[str, Any], key: str, limits: Limits | None = None, ids: bool = False
) -> list[bytes]:
    """A list of non-empty strings (event names, masks, or ids with ``ids``) as bytes,
    each checked against ``limits`` when given."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(400, f"{key!r} must be a list of non-empty strings")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise APIError(400, f"{key!r} must be a list of non-empty strings; "
                                f"item {index} is {item!r}")
    result = [raw(v) for v in value]
    if limits is not None:
        check = limits.check_id if ids else limits.check_name
        for index, item in enumerate(result):
            check(item, f"item {index} of {key!r}", bad_request)
    return result


def headers(
    obj: dict[str, Any], key: str = "headers", limits: Limits | None = None
) -> dict[str, str] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise APIError(400, f"{key!r} must be an object of string values")
    for name, text in value.items():
        # JSON may spell a lone surrogate ("\ud800"), which no UTF-8 store
        # can write: refused here, not failed in every later batch
        if not (name + text).isascii():
            try:
                (name + text).encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, f"{key!r}: {name!r} is not encodable as UTF-8") from None
    if limits is not None:
        limits.check_headers(len(value), f"fields in {key!r}", bad_request)
    return dict(value) or None


def message_body(obj: dict[str, Any]) -> bytes:
    """``body`` (text, sent as UTF-8) or ``body_base64``: exactly one of them."""
    has_text, has_b64 = "body" in obj, "body_base64" in obj
    if has_text == has_b64:
        raise APIError(400, "give exactly one of 'body' (text) and 'body_base64'")
    if has_text:
        value = obj["body"]
        if not isinstance(value, str):
            raise APIError(400, "'body' must be a string (use 'body_base64' for binary data)")
        return raw(value)
    value = obj["body_base64"]
    if not isinstance(value, str):
        raise APIError(400, "'body_base64' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "'body_base64' is not valid base64") from None


PublishOptions = tuple[bytes | None, dict[str, str] | None, float | None, bool]
"""``(id, headers, ttl, durable)`` of one publish; None where the field was absent."""


def publish_options(obj: dict[str, Any], limits: Limits) -> PublishOptions:
    """The fields of a publish besides its body, each checked (a 400 names the bad one).

    ``ttl`` 0 means the queue's default, as absent does: both are None here.
    """
    return (
        checked(obj, "id", limits, ids=True),
        headers(obj, limits=limits),
        number(obj, "ttl", minimum=0, maximum=MAX_TTL) or None,
        boolean(obj, "durable"),
    )
