"""Lease grants as an iterator that gives back what it handed out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import models
from .errors import Conflict

if TYPE_CHECKING:
    from .client import Client


class LeaseGrants:
    """The app's leases as they are granted, from its event stream (long polls).

    ```python
    with agora.lease_grants(app.id) as grants:
        for lease in grants:
            run_on(lease.cuda_visible_devices)
            break
    # every lease yielded above that is still active has been released
    ```
    """

    def __init__(self, client: Client, app: int, *, after: int, poll_timeout_ms: int) -> None:
        self._client = client
        self._app = app
        self._after = after
        self._poll_timeout_ms = poll_timeout_ms
        self.granted: list[models.Lease] = []

    def __enter__(self) -> LeaseGrants:
        return self

    def __exit__(self, *_: object) -> None:
        self.release_all()

    def __iter__(self) -> Iterator[models.Lease]:
        for event in self._client.events(
            self._app, self._after, transport="poll", poll_timeout_ms=self._poll_timeout_ms
        ):
            self._after = event.id
            if isinstance(event.data, models.LeaseGranted):
                lease = self._lease(event.data.lease)
                self.granted.append(lease)
                yield lease

    def _lease(self, lease_id: int) -> models.Lease:
        """The granted lease with its GPUs' hosts and CUDA UUIDs."""
        for lease in self._client.leases(self._app):
            if lease.id == lease_id:
                return lease
        raise LookupError(f"lease {lease_id} was granted to app {self._app} but is not among its leases")

    def release_all(self) -> None:
        """Releases every lease handed out that is still active; ended ones are left alone."""
        active = {lease.id for lease in self._client.leases(self._app) if lease.state == "active"}
        for lease in self.granted:
            if lease.id in active:
                try:
                    self._client.release_lease(lease.id)
                except Conflict:
                    pass  # It ended meanwhile (expired or revoked): nothing to give back.
