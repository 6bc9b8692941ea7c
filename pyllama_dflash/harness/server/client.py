"""The client half of a llama-server: HTTP, the answers, the slot actions, and the servers a check starts
beside its own.

:class:`Client` is what a :class:`~.server_process.ServerProcess` says over loopback: one HTTP exchange
(:meth:`Client.request`) that answers every status as a :class:`Response`, and the calls the checks make
on top of it. It holds the one failure policy for what a caller cannot go on without (``/tokenize``,
``/detokenize``, ``/props``): anything but the answer asked for raises ``ServerError`` with the answer and
the server's log tail, so a check never runs on an empty prompt (it fails, and says so). A slot action
(:meth:`Client.slot_save`, :meth:`Client.slot_restore`, :meth:`Client.slot_erase`) answers as it is,
since a check may expect a refusal.

Two servers a check starts beside its own are made here too, from the check's context (anything with
``server(name, **options)`` and ``work_dir``, as ``run_checks.Ctx``): :func:`slot_server`, one slot
saving to a fresh slot folder, and :func:`without_draft`, the same request asked of the variant without
the draft (the *no-draft answer* a check compares its own with).

HTTP goes through ``requests``, one short-lived session per request (so that concurrent requests share
nothing) that ignores proxy settings from the environment: the server is on loopback. A request that
gets no answer comes back as a :class:`Response` with status ``None``.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests

from ...errors import ServerError

__all__ = [
    "NO_DRAFT",
    "SLOT_ACTIONS",
    "Client",
    "Response",
    "fresh_slot_folder",
    "openai_client",
    "slot_server",
    "without_draft",
]

SLOT_ACTIONS = ("save", "restore", "erase")
NO_DRAFT = "_no_draft"  # what a server without the draft is named after its check's own
T = TypeVar("T")


@dataclass
class Response:
    """One HTTP exchange: status (None when the connection failed), parsed JSON (or text)."""

    status: int | None
    body: Any
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def error_message(self) -> str:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return str(self.body["error"].get("message", ""))
        return "" if self.ok else str(self.body)

    @property
    def content(self) -> str | None:
        """Generated text of a chat (``choices[0].message.content``) or /completion (``content``) answer."""
        if not isinstance(self.body, dict):
            return None
        if "choices" in self.body:
            choice = self.body["choices"][0]
            return (choice.get("message") or {}).get("content", choice.get("text"))
        return self.body.get("content")

    @property
    def tokens(self) -> list[int] | None:
        """Generated token ids of a /completion answer asked with ``return_tokens``."""
        return self.body.get("tokens") if isinstance(self.body, dict) else None

    @property
    def timings(self) -> dict:
        return self.body.get("timings", {}) if isinstance(self.body, dict) else {}

    @property
    def draft_stats(self) -> dict[str, int] | None:
        """``draft_n`` / ``draft_n_accepted`` from ``timings``; the server leaves them out when nothing was drafted."""
        t = self.timings
        if "draft_n" not in t:
            return None
        return {"draft_n": t["draft_n"], "draft_n_accepted": t.get("draft_n_accepted", 0)}

    def same_tokens_as(self, other: Response) -> bool:
        """Both answered, with the same generated token ids (a check's answer against the no-draft answer)."""
        return self.ok and other.ok and self.tokens == other.tokens

    def describe(self, limit: int = 300) -> str:
        """The answer for an error message: the status code and the body (or why there was none)."""
        body = self.error_message if not self.ok else str(self.body)
        if len(body) > limit:
            body = body[:limit] + "..."
        return f"{self.status if self.status is not None else 'no answer'}: {body}"

    def summary(self) -> dict:
        """A plain dict for reports: status, error or content, draft statistics."""
        out: dict[str, Any] = {"status": self.status}
        if self.ok:
            out["content"] = self.content
            if self.tokens is not None:
                out["tokens"] = self.tokens
            out["draft"] = self.draft_stats
        else:
            out["error"] = self.error_message
        return out


class Client:
    """HTTP to one llama-server at ``host``:``port``. A subclass keeps the server's log (``log_path``,
    ``log_tail``), which a refusal under the failure policy carries, and resets ``_media_marker`` when the
    server stops."""

    host: str
    port: int | None
    log_path: Path | None
    _media_marker: str | None

    def log_tail(self, n: int = 40) -> str:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request(self, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Response:
        """One HTTP exchange; every status comes back as a :class:`Response` (``None``: no answer,
        ``body`` then says why). ``timeout`` bounds the connection and each read, not the whole."""
        data = None if body is None else json.dumps(body).encode()
        t0 = time.monotonic()
        try:
            with requests.Session() as session:
                session.trust_env = False  # loopback: no proxies, no .netrc from the environment
                r = session.request(
                    method,
                    self.base_url + path,
                    data=data,
                    timeout=timeout,
                    headers={"Content-Type": "application/json"} if data else None,
                )
                status, raw = r.status_code, r.content
        except (requests.RequestException, OSError) as e:
            return Response(None, repr(e), time.monotonic() - t0)
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Response(status, parsed, time.monotonic() - t0)

    def post(self, path: str, body: Any, timeout: float = 120.0) -> Response:
        return self.request("POST", path, body, timeout)

    def get(self, path: str, timeout: float = 30.0) -> Response:
        return self.request("GET", path, None, timeout)

    def _must(self, r: Response, what: str, key: str, kind: type) -> Any:
        """The failure policy: ``r``'s ``key`` where it answered 200 with one of type ``kind``, else
        ServerError with the answer and the log's tail."""
        value = r.body.get(key) if r.ok and isinstance(r.body, dict) else None
        if not isinstance(value, kind):
            raise ServerError(f"{what} answered {r.describe()}", self.log_tail(), self.log_path)
        return value

    # -- text and ids: the failure policy ------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool | None = None) -> list[int]:
        """``POST /tokenize``: the ids the server gives ``text``. ``parse_special`` left out is the server's
        default (true in b11434)."""
        body: dict[str, Any] = {"content": text, "add_special": add_special}
        if parse_special is not None:
            body["parse_special"] = parse_special
        tokens = self._must(self.post("/tokenize", body, timeout=30.0), "POST /tokenize", "tokens", list)
        return [int(t) for t in tokens]

    def detokenize(self, ids: Sequence[int]) -> str:
        """``POST /detokenize``: the text the server writes for ``ids``."""
        r = self.post("/detokenize", {"tokens": list(ids)}, timeout=30.0)
        return self._must(r, "POST /detokenize", "content", str)

    def media_marker(self) -> str:
        """The marker that stands for an image in a raw /completion prompt (random per server, from /props)."""
        if self._media_marker is None:
            self._media_marker = self._must(self.get("/props"), "GET /props", "media_marker", str)
        return self._media_marker

    # -- slots: the answer as it is ---------------------------------------------------------------------

    def slot_action(
        self, action: str, filename: str | None = None, slot: int | str = 0, timeout: float = 120.0
    ) -> Response:
        """``POST /slots/{slot}?action=save|restore|erase``, for ``filename`` under ``--slot-save-path``
        (erase takes none). ``slot`` is sent as given: a string that is no slot number is a bad input's probe."""
        if action not in SLOT_ACTIONS:
            raise ValueError(f"slot action {action!r}: one of {', '.join(SLOT_ACTIONS)}")
        body = {} if filename is None else {"filename": filename}
        return self.post(f"/slots/{slot}?action={action}", body, timeout)

    def slot_save(self, filename: str, slot: int = 0, timeout: float = 120.0) -> Response:
        return self.slot_action("save", filename, slot, timeout)

    def slot_restore(self, filename: str, slot: int = 0, timeout: float = 120.0) -> Response:
        return self.slot_action("restore", filename, slot, timeout)

    def slot_erase(self, slot: int = 0, timeout: float = 120.0) -> Response:
        """Nothing of the slot's conversation left on it, the draft's included."""
        return self.slot_action("erase", None, slot, timeout)

    # -- generation -------------------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[dict],
        *,
        max_tokens: int = 8,
        temperature: float = 0.0,
        timeout: float = 120.0,
        **params: Any,
    ) -> Response:
        """``POST /v1/chat/completions`` (greedy by default)."""
        body = {"messages": list(messages), "max_tokens": max_tokens, "temperature": temperature, "seed": 0, **params}
        return self.post("/v1/chat/completions", body, timeout)

    def multimodal_prompt(self, text: str, images: Sequence[bytes], placeholder: str = "{image}") -> dict:
        """A /completion prompt object: ``text`` with each ``placeholder`` standing for the next image
        (PNG/JPEG bytes)."""
        if text.count(placeholder) != len(images):
            raise ValueError(f"{text.count(placeholder)} placeholders for {len(images)} images")
        return {
            "prompt_string": text.replace(placeholder, self.media_marker()),
            "multimodal_data": [base64.b64encode(b).decode("ascii") for b in images],
        }

    def completion(
        self, prompt: Any, *, n_predict: int = 8, temperature: float = 0.0, timeout: float = 120.0, **params: Any
    ) -> Response:
        """``POST /completion`` with the generated token ids (``return_tokens``), greedy by default."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "seed": 0,
            "return_tokens": True,
            **params,
        }
        return self.post("/completion", body, timeout)


# -- the servers a check starts beside its own ------------------------------------------------------------


def openai_client(base_url: str, timeout: float, api_key: str = "pyllama-dflash"):
    """The ``openai`` client an operator's program would use, on a llama-server at ``base_url`` (over
    loopback: no proxy from the environment; no retries, so that a refused request is seen as it was)."""
    import openai

    return openai.OpenAI(
        base_url=f"{base_url}/v1",
        api_key=api_key,
        timeout=timeout,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )


def fresh_slot_folder(path: Path) -> Path:
    """``path`` emptied (or made): a slot folder holding nothing from an earlier run."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def slot_server(
    ctx, name: str, *, draft: bool = True, folder: Path | None = None, prompt_cache: bool = False, **changes: Any
):
    """A server (not started) with one slot that saves to and restores from ``folder`` (default: a fresh
    ``<name>-slots`` in the check's work folder; ``srv.options.slot_save_path``). Without ``prompt_cache``
    the RAM prompt cache is off: a restored slot is then the only place a prefix can come back from.
    Without ``draft`` it is the check's no-draft server, named so."""
    name = name if draft else name + NO_DRAFT
    folder = folder if folder is not None else fresh_slot_folder(ctx.work_dir / f"{name}-slots")
    if not prompt_cache:
        changes.setdefault("cache_ram_mib", 0)
    changes.setdefault("n_parallel", 1)
    return ctx.server(name, draft=draft, slot_save_path=folder, **changes)


def without_draft(ctx, name: str, ask: Callable[[Client], T]) -> T:
    """``ask`` of a server of the check's variant started without the draft (``<name>_no_draft``): the
    no-draft answer, what the target alone makes of the same request."""
    with ctx.server(name + NO_DRAFT, draft=False) as srv:
        return ask(srv)
