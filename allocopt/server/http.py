"""The HTTP server: uvicorn (HTTP/1.1 over h11) running :class:`~allocopt.server.app.Service` on one socket.

uvicorn closes idle keep-alive connections (``keep_alive_s``); the service answers
503 past ``max_connections`` open connections; :class:`_Protocol` adds what uvicorn lacks: a
deadline for each request's line and headers (a client that sends them slowly,
or connects and sends nothing, is disconnected after ``header_timeout_s``), one
for a client that stops reading a response (writing stalled ``body_timeout_s``),
and JSON for the 400 of a request h11 cannot parse.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from allocopt.engine import Engine
from allocopt.runtime.elastic import GoodputEngine
from allocopt.errors import InvalidOptionError
from allocopt.server.app import Service
from allocopt.server.options import ServiceOptions, is_loopback

logger = logging.getLogger(__name__)

#: Largest request line plus headers, in bytes (h11's limit; more gets 400).
MAX_HEAD_BYTES = 16 * 1024


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on a request's head and on a stalled response."""

    header_timeout_s = ServiceOptions.header_timeout_s
    write_timeout_s = ServiceOptions.body_timeout_s

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (or a head over ``MAX_HEAD_BYTES``): 400 in JSON, then close."""
        body = json.dumps({"error": f"invalid HTTP request: {msg}", "type": "RequestError", "field": None}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request"))
                                 + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # a response was already under way: just close
            pass
        self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._abort, "stopped reading")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_expired)

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE:
            self._abort("sent no complete request head in time")

    def _abort(self, why: str) -> None:
        if not self.transport.is_closing():
            logger.info("closing the connection of %s: it %s", self.client, why)
            self.transport.close()


class AllocoptServer:
    """The service on a listening socket: :meth:`serve_forever` here, or :meth:`start` in a thread.

    Parameters
    ----------
    address : (str, int)
        Host and port; port 0 picks a free one (see :attr:`url`). The socket is bound here.
    engine : Engine or GoodputEngine, optional
        The engine of the ``/engine`` endpoints (an :class:`Engine`) or of the ``/elastic`` ones (a
        :class:`~allocopt.runtime.elastic.GoodputEngine`); none until ``POST /engine`` or ``POST /elastic``
        otherwise.
    options : ServiceOptions, optional
        Limits and timeouts.
    state_path : str, optional
        Save the engine's state there (atomically) after every change.
    token : str, optional
        The bearer token every request but the documentation must carry. Required
        when ``address`` is not a loopback address.
    profiles : str, optional
        Directory of the application profiles elastic jobs may name (default: Sia's shipped profiles).
    quiet : bool, default True
        No access log (uvicorn's ``INFO`` lines) on stderr.

    Raises
    ------
    InvalidOptionError
        For a non-loopback address without a token.
    OSError
        When the address cannot be bound (e.g. the port is in use).
    """

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0), engine: Engine | GoodputEngine | None = None,
                 *, options: ServiceOptions | None = None, state_path: str | None = None, token: str | None = None,
                 quiet: bool = True, profiles: str | None = None):
        host, port = address
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidOptionError(f"port must be an integer in [0, 65535], got {port!r}")
        if token is None and not is_loopback(host):
            raise InvalidOptionError(f"serving on {host}, which is not a loopback address, needs a bearer token "
                                     "(--token-file FILE); without one, serve on 127.0.0.1 or ::1")
        self.options = options or ServiceOptions()
        self.service = Service(engine, options=self.options, state_path=state_path, token=token, profiles=profiles)
        self.socket = _bind(host, port, self.options.backlog)
        protocol = type("Protocol", (_Protocol,), {"header_timeout_s": self.options.header_timeout_s,
                                                   "write_timeout_s": self.options.body_timeout_s})
        config = uvicorn.Config(self.service, http=protocol, ws="none", lifespan="off", log_config=None,
                                log_level="info" if not quiet else "warning", access_log=not quiet,
                                timeout_keep_alive=self.options.keep_alive_s,
                                backlog=self.options.backlog,
                                h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_graceful_shutdown=5,
                                server_header=False)
        self._server = uvicorn.Server(config)
        self.service.connections = self._server.server_state.connections
        self._thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[str, int]:
        """Host and port of the listening socket."""
        host, port = self.socket.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def engine(self) -> Engine | GoodputEngine | None:
        """The engine of the ``/engine`` endpoints, or the goodput engine of the ``/elastic`` ones."""
        return self.service.engine

    @engine.setter
    def engine(self, engine: Engine | GoodputEngine | None) -> None:
        self.service.engine = engine

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or, in the main thread, SIGINT/SIGTERM)."""
        self._server.run(sockets=[self.socket])

    def start(self) -> AllocoptServer:
        """Serve in a daemon thread; return once requests are answered."""
        self._thread = threading.Thread(target=self.serve_forever, name="allocopt-server", daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.01)
        return self

    def shutdown(self) -> None:
        """Stop serving (running requests get up to 5 s to finish) and release the socket and workers."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.service.close()
        self.socket.close()

    def __enter__(self) -> AllocoptServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # the protocol: asyncio sets TCP_NODELAY
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def serve(host: str = "127.0.0.1", port: int = 8000, engine: Engine | GoodputEngine | None = None, *,
          options: ServiceOptions | None = None, state_path: str | None = None, token: str | None = None,
          quiet: bool = False, announce: Callable[[str], None] | None = None, profiles: str | None = None) -> None:
    """Run the service in this thread until interrupted (see :class:`AllocoptServer`).

    ``announce`` receives "allocopt: serving on URL" once the socket is bound, and "allocopt: stopped"
    (default: the ``allocopt.server`` logger at INFO; ``allocopt serve`` prints them on stderr).
    """
    say = announce or logger.info
    server = AllocoptServer((host, port), engine, options=options, state_path=state_path, token=token, quiet=quiet,
                            profiles=profiles)
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    say(f"allocopt: serving on {server.url}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        say("allocopt: stopped")
    finally:
        server.service.close()
        server.socket.close()
