"""Errors: every refusal of the arbiter is an RFC 9457 problem, raised as a typed exception.

The arbiter answers every error with `application/problem+json` and a stable `code`
(`docs/api.md` lists them). `ApiError.from_problem` picks the subclass by HTTP status, so
callers can catch a family (`Conflict`) or branch on `error.code` (`"round_closed"`).
"""

from __future__ import annotations

from typing import Any


class AgoraError(Exception):
    """Anything this client raises."""


class TransportError(AgoraError):
    """The arbiter could not be reached, or did not answer, after every retry."""


class ApiError(AgoraError):
    """The arbiter refused a request; nothing was changed by it.

    `status` is the HTTP status, `code` the arbiter's stable machine code (`invalid_app`,
    `round_closed`, ...) and `detail` its explanation, which says what to do.
    """

    def __init__(self, status: int, code: str, detail: str, title: str = "") -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title

    @classmethod
    def from_problem(cls, status: int, body: Any, text: str = "") -> ApiError:
        """The exception for an error answer: a problem+json body, or any other text."""
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            code = body["code"]
            detail = str(body.get("detail", ""))
            title = str(body.get("title", ""))
        else:
            code, detail, title = "http_error", text.strip() or f"HTTP {status}", ""
        return _BY_STATUS.get(status, cls)(status, code, detail, title)


class BadRequest(ApiError):
    """400: the request could not be read (malformed JSON, a bad query or key)."""


class Unauthorized(ApiError):
    """401: no token, or a token the arbiter does not know."""


class Forbidden(ApiError):
    """403: the token may not do this (an admin-only call). Another tenant's app is a 404."""


class NotFound(ApiError):
    """404: no such app, round, GPU or endpoint."""


class Conflict(ApiError):
    """409: the request clashes with the market's state (round closed, app finished, ...)."""


class PayloadTooLarge(ApiError):
    """413: the body is over the arbiter's limit."""


class Unprocessable(ApiError):
    """422: well-formed but invalid (a bad app, progress report or bid)."""


class Unavailable(ApiError):
    """503: the arbiter or its database is briefly unavailable; retried before it is raised."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    503: Unavailable,
}
