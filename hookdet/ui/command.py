"""``hookdet ui [DIR ...] [--host 127.0.0.1] [--port 8080]``: serve the web view until Ctrl-C.

The server is uvicorn running :func:`hookdet.ui.app.build_app`; it binds 127.0.0.1 unless
``--host`` says otherwise, and then every request needs the access token it prints. Without the
``ui`` extra (Starlette, uvicorn, Jinja2, Plotly) it says which extra in one line.
"""
from __future__ import annotations

import argparse
import ipaddress
import secrets
import socket
from pathlib import Path
from typing import Any, List

from hookdet.errors import UsageError

#: What ``pip install 'hookdet[ui]'`` brings.
UI_MODULES = ("starlette", "uvicorn", "jinja2", "plotly")
LOOPBACK_NAMES = ("localhost",)


def add_ui_command(commands: Any) -> None:
    """Add ``ui`` to the ``hookdet`` parser's subcommands."""
    ui = commands.add_parser("ui", help="a local, read-only web view of runs and searches (hookdet[ui])")
    ui.add_argument("dirs", nargs="*", metavar="DIR",
                    help="folders of runs and searches (default: ./runs and the runs in your checkpoint index)")
    ui.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1; another needs the printed token)")
    ui.add_argument("--port", type=int, default=8080, help="the port (default 8080; 0: any free one)")
    ui.set_defaults(handler=command_ui)


def missing_modules() -> List[str]:
    """The ``ui`` extra's modules this environment lacks."""
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a module set to None in sys.modules, a broken package
            return True

    return [name for name in UI_MODULES if absent(name)]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command_ui(args: argparse.Namespace) -> int:
    """Start the server, print its URL, serve until Ctrl-C (which ends it with status 0)."""
    missing = missing_modules()
    if missing:
        raise UsageError(f"ui: the web view needs the 'ui' extra ({', '.join(missing)} missing): "
                         "pip install 'hookdet[ui]'")
    from hookdet.ui.catalog import Catalog, default_roots

    roots = [Path(given) for given in args.dirs] or default_roots()
    absent = [str(root) for root in roots if not root.is_dir()]
    if absent:
        raise UsageError(f"ui: {', '.join(absent)}: not a directory")
    token = None if is_loopback(args.host) else secrets.token_urlsafe(18)
    serve(Catalog(roots), args.host, args.port, token)
    return 0


def name_for_others(host: str) -> str:
    """The name the printed URL gives for the bound ``host``: the host itself, but for a wildcard
    (``0.0.0.0``, ``::``), which no other machine can open, this machine's address on its network
    (the one its outgoing traffic would leave from; nothing is sent), else its host name."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect(("2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1", 9))  # documentation addresses
        address = probe.getsockname()[0]
    except OSError:
        return socket.gethostname()
    finally:
        probe.close()
    return address if not ipaddress.ip_address(address).is_unspecified else socket.gethostname()


def serve(catalog: Any, host: str, port: int, token: Any) -> None:
    """Run uvicorn on an already bound socket, so the printed URL is the real one (port 0 too)."""
    import uvicorn

    from hookdet.ui.app import build_app

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        raise UsageError(f"ui: cannot listen on {host}:{port}: {error.strerror}") from None
    listener.listen(128)  # connections wait in the backlog until uvicorn takes them
    bound = listener.getsockname()[1]
    shown = name_for_others(host)
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    roots = ", ".join(str(root) for root in catalog.roots.values()) or "nothing"
    print(f"hookdet ui: serving {roots}", flush=True)
    if token:
        print(f"hookdet ui: listening on {host}, beyond this machine; every request needs this token "
              f"(open the URL below once): {token}", flush=True)
    print(f"hookdet ui: {url}  (Ctrl-C stops it)", flush=True)
    config = uvicorn.Config(build_app(catalog, token), log_level="warning", lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[listener])
    except KeyboardInterrupt:  # uvicorn shut down, then passes Ctrl-C on: it is how the view ends
        pass
    print("hookdet ui: stopped", flush=True)
