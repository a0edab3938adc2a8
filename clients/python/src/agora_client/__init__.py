"""agora-client: the Python client of Agora, a fair GPU marketplace (Themis).

`Client` and `AsyncClient` speak the arbiter's HTTP API with typed models (`models`) and typed
errors (`errors`). `agora_client.optuna` runs Optuna studies on leased GPUs and
`agora_client.tune` does the same for Ray Tune.
"""

from . import models
from ._api import RetryPolicy
from .aio import AsyncClient
from .client import Client
from .errors import (
    AgoraError,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from .leases import LeaseGrants

__all__ = [
    "AgoraError",
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "LeaseGrants",
    "NotFound",
    "PayloadTooLarge",
    "RetryPolicy",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "models",
]
