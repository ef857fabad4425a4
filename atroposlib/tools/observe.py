"""Read scored groups from a running trajectory API through its read-only ``GET /observe`` tap.

The tools never call ``/register``, ``/reset_data`` or ``/batch``: reading through ``/observe``
leaves every group in the trainer's queue, so they can run beside a training run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from atroposlib.api.client import AtroposClient


@dataclass(frozen=True)
class ObservedGroup:
    """One group as the API's tap returns it.

    Attributes:
        cursor: the API's monotonically increasing id of the group (resume with ``after=cursor``).
        env_id: id of the env that sent it, or None.
        received_at: when the API accepted it (UNIX seconds).
        group: the ScoredDataGroup wire dict (tokens, masks, scores, messages, ...).
    """

    cursor: int
    env_id: int | None
    received_at: float
    group: dict[str, Any]


class GroupObserver:
    """Follow the API's ``/observe`` cursor and hand out each new group once.

    Example::

        with AtroposClient("http://127.0.0.1:8000") as client:
            for observed in GroupObserver(client).follow(idle_timeout=60):
                print(observed.cursor, observed.group["scores"])
    """

    def __init__(
        self,
        client: AtroposClient,
        *,
        after: int | None = None,
        env_id: int | None = None,
        page_size: int = 64,
    ):
        """Start following.

        Args:
            client: a client of the API (its retries cover transient failures).
            after: only groups with a larger cursor; None starts at the oldest group the API
                still retains.
            env_id: only groups from this env; None reads all envs.
            page_size: groups per request (``limit``).

        Attributes:
            missed: groups that left the API's retention window (``run-api
                --observe-retention-groups``) before they could be read; counted only when
                reading all envs.
        """
        self.client = client
        self.cursor = after
        self.env_id = env_id
        self.page_size = page_size
        self.groups_read = 0
        self.missed = 0
        # group cursors are contiguous, so after a known position any jump that returned fewer
        # groups than it skipped means groups left the API's retention window unread
        self._anchored = after is not None

    def poll(self) -> list[ObservedGroup]:
        """Fetch the next page of groups (possibly empty) and advance the cursor.

        Raises:
            ApiError: the API cannot be reached after retries, or rejected the request
                (e.g. 401: wrong or missing ``--api-key``).
        """
        body = self.client.observe(after=self.cursor or 0, limit=self.page_size, env_id=self.env_id)
        page = [
            ObservedGroup(
                cursor=int(item["cursor"]),
                env_id=item.get("env_id"),
                received_at=float(item.get("received_at") or 0.0),
                group=item["group"],
            )
            for item in body.get("groups", [])
        ]
        before = self.cursor or 0
        next_cursor = body.get("next_cursor")
        if next_cursor is not None:
            self.cursor = int(next_cursor)
        elif page:
            self.cursor = page[-1].cursor
        if self._anchored and self.env_id is None and self.cursor is not None:
            self.missed += max(0, self.cursor - before - len(page))
        self._anchored = True
        self.groups_read += len(page)
        return page

    def follow(
        self,
        *,
        poll_interval: float = 1.0,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[ObservedGroup]:
        """Yield groups as they arrive, polling when there is nothing new.

        Args:
            poll_interval: seconds between polls while idle.
            idle_timeout: stop after this many seconds without a new group (None: never).
            stop: set it to stop following (checked between polls).

        Yields:
            Each new group once, in cursor order.
        """
        last_new = time.monotonic()
        while stop is None or not stop.is_set():
            page = self.poll()
            if page:
                last_new = time.monotonic()
                yield from page
                if len(page) >= self.page_size:
                    continue  # more may be waiting: do not sleep
            elif idle_timeout is not None and time.monotonic() - last_new >= idle_timeout:
                return
            if stop is not None:
                if stop.wait(poll_interval):
                    return
            else:
                time.sleep(poll_interval)


class RecentGroups:
    """A bounded, thread-safe window of the most recently observed groups (for ``view-run``)."""

    def __init__(self, observer: GroupObserver, max_groups: int = 200):
        """Keep at most ``max_groups`` groups from ``observer``, newest last."""
        self.observer = observer
        self._groups: deque[ObservedGroup] = deque(maxlen=max_groups)
        self._lock = threading.Lock()
        self.last_error: str | None = None

    def refresh(self, max_pages: int = 20) -> int:
        """Pull what the API has (at most ``max_pages`` pages); returns how many groups were new.

        Errors are kept in ``last_error`` (shown by the UI) instead of raised, so a UI refresh
        survives an API restart.
        """
        new = 0
        with self._lock:
            try:
                for _ in range(max_pages):
                    page = self.observer.poll()
                    self._groups.extend(page)
                    new += len(page)
                    if len(page) < self.observer.page_size:
                        break
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - surfaced in the UI
                self.last_error = f"{type(exc).__name__}: {exc}"
        return new

    def snapshot(self, env_id: int | None = None, limit: int | None = None) -> list[ObservedGroup]:
        """The retained groups, newest first, optionally of one env only and at most ``limit``."""
        with self._lock:
            groups = [g for g in reversed(self._groups) if env_id is None or g.env_id == env_id]
        return groups[:limit] if limit is not None else groups

    def env_ids(self) -> list[int | None]:
        """Distinct env ids among the retained groups, sorted (None last)."""
        with self._lock:
            ids = {g.env_id for g in self._groups}
        return sorted(i for i in ids if i is not None) + ([None] if None in ids else [])
