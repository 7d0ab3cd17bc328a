"""When the proxy may close its connections to a child: the decision, apart from the sockets.

The proxy keeps one connection pool (a *link*) per child port. Before a child is asked to exit
its link is *retired*: closed at once when nobody uses it (an idle keep-alive connection makes
llama-server exit 10 ms slower), else only when its last user is done. Closing a link that a
stream still reads cut that stream without a word (the client waited for its own timeout);
left open, the stream reads the child's exit and ends with the documented error event.
A port that a new child takes again gets a new link; the retired one lives on for its users.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkStatistics:
    links: int  # open links (current and retired)
    retired: int  # retired links still in use
    users: int  # requests holding or waiting for a link


class LinkBook:
    """Links by port, their users, and which link to close when. Pure: no sockets, no clock."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._current: dict[int, int] = {}  # port -> its current link
        self._users: dict[int, int] = {}  # link -> requests using it (every open link)
        self._retired: set[int] = set()

    def current(self, port: int) -> int | None:
        """The link new requests to ``port`` use, or None when there is none yet."""
        return self._current.get(port)

    def add(self, port: int) -> tuple[int, int | None]:
        """A new link for ``port``; and the link it replaces, to close now, when that one is
        idle (a busy one is retired and closes with its last user)."""
        old = self._current.get(port)
        link = next(self._ids)
        self._current[port] = link
        self._users[link] = 0
        if old is None:
            return link, None
        return link, self.retire_link(old)

    def enter(self, link: int) -> None:
        self._users[link] += 1

    def leave(self, link: int) -> bool:
        """A request is done with ``link``; True when the link must be closed now (it was
        retired and this was its last user)."""
        self._users[link] -= 1
        if self._users[link] == 0 and link in self._retired:
            self._forget(link)
            return True
        return False

    def users(self, link: int) -> int:
        return self._users.get(link, 0)

    def retire(self, port: int) -> int | None:
        """The child on ``port`` is about to exit: the link to close now, or None (there is
        none, or it is busy and closes when its last user leaves)."""
        link = self._current.get(port)
        if link is None:
            return None
        return self.retire_link(link)

    def idle(self) -> list[int]:
        """Current links nobody uses (the proxy drops them when it holds too many)."""
        return [link for link in self._current.values() if self._users[link] == 0]

    def retire_link(self, link: int) -> int | None:
        """Retire one link (see :meth:`retire`): itself when it is to be closed now."""
        for port, current in list(self._current.items()):
            if current == link:
                del self._current[port]
        if self._users[link] == 0:
            self._forget(link)
            return link
        self._retired.add(link)
        return None

    def _forget(self, link: int) -> None:
        self._retired.discard(link)
        del self._users[link]

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(
            links=len(self._users),
            retired=len(self._retired),
            users=sum(self._users.values()),
        )
