"""The systemd notify protocol (sd_notify(3)) in a few lines of socket code, without libsystemd.

With ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: an AF_UNIX datagram socket, in the abstract
namespace when it starts with "@". Each message is newline-separated ``KEY=value`` lines. Without
the variable every call does nothing; a failure to send is logged once and otherwise ignored: the
mount must never fail because its supervisor cannot be told about it.
"""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

SOCKET_ENV = "NOTIFY_SOCKET"


class Notifier:
    def __init__(self, address: str | None = None):
        """*address*: a socket path or "@abstract-name"; default ``$NOTIFY_SOCKET``."""
        if address is None:
            address = os.environ.get(SOCKET_ENV) or None
        self.address = address
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send one message made of *lines* ("READY=1", "STATUS=..."); True if it was sent."""
        if self.address is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        message = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, target)
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify the service manager at %s: %s", self.address, exc)
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def stopping(self, status: str = "unmounting") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")
