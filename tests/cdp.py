"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`), standard library only.

Chromium reads commands on fd 3 and writes replies and events on fd 4, one JSON message per NUL-terminated
record. One page target is attached in flat mode; every console message, uncaught exception and log entry
(CSP violations, failed loads) of that page is kept in `problems`, so a test can say that there were none.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no name resolves
    "--remote-debugging-pipe",
]
READ_TIMEOUT_S = 60


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one attached page; use as a context manager."""

    def __init__(self, chromium: str, profile: Path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire_fds() -> None:  # the protocol's fixed descriptors in the child
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self._proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds,  # the test process runs no other thread
            pass_fds=(3, 4),  # kept open past close_fds, which runs after preexec_fn
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.session = self._attach_page()

    # --- the wire ---------------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed the pipe")
            self._buffer += chunk
        record, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(record)

    def _note(self, message: dict[str, Any]) -> None:
        """Keep what the page said; events are also queued for `wait_event`."""
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.problems.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.problems.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            self.problems.append(f"log.{entry.get('level')} ({entry.get('source')}): {entry.get('text')}")
        if method:
            self._events.append(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._note(reply)

    def wait_event(self, method: str, timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    return self._events.pop(i)
            self._note(self._read_message(deadline))

    def _attach_page(self) -> str:
        targets = self.send("Target.getTargets", session=False)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        return self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}, session=False)[
            "sessionId"
        ]

    # --- what a test does -------------------------------------------------------------------------------
    def open(self, url: str, width: int, height: int = 900, dark: bool = False) -> None:
        """Load a page in a window of the given size (CSS pixels) and wait for its load event."""
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.viewport(width, height)
        scheme = "dark" if dark else "light"
        self.send("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        self._events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def viewport(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited); DevTools is not bound by the CSP."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise BrowserError(f"never true: {expression}")

    def screenshot(self, path: Path, full_page: bool = True, max_height: int = 12000) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": min(size["height"], max_height),
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))

    def print_media(self, on: bool) -> None:
        self.send("Emulation.setEmulatedMedia", {"media": "print" if on else ""})

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.send("Browser.close", session=False)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
