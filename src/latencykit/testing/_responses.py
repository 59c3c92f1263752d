"""OpenAI's Responses wire format: ``POST /v1/responses``.

A ``response`` JSON object, or SSE events, each named by an ``event:`` line and its ``type``,
numbered by ``sequence_number``: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` ..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then one terminal event:
``response.completed``, or ``response.incomplete`` (``max_output_tokens`` reached). A stream
has no ``[DONE]``: the terminal event is the end. Reasoning comes as
``response.reasoning_summary_text.delta``, a tool call as a ``function_call`` item with
``response.function_call_arguments.delta``. An error mid-stream is an ``error`` event; errors
before the stream are chat completions' (the same statuses and bodies).
"""

from __future__ import annotations

from ._openai import OpenAIWire
from ._wire import Parsed, Piece, PieceKind, content_text, dicts, dumps, integer, json_object, sse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

PATHS = frozenset({"/v1/responses", "/responses"})

# Output item types and the delta event of each piece kind.
_ITEMS: dict[PieceKind, str] = {
    "text": "message",
    "reasoning": "reasoning",
    "tool": "function_call",
}
_DELTAS: dict[PieceKind, str] = {
    "text": "response.output_text.delta",
    "reasoning": "response.reasoning_summary_text.delta",
    "tool": "response.function_call_arguments.delta",
}


def _input_text(value: object) -> str:
    """The text of a Responses ``input``: a string, or items with ``content`` (a string or
    ``input_text`` parts)."""
    if isinstance(value, str):
        return value
    return "".join(content_text(item.get("content")) for item in dicts(value))


class ResponsesWire(OpenAIWire):
    """OpenAI Responses: ``POST /v1/responses`` (also ``/responses``).

    litellm's ``aresponses(model="openai/<model>", api_base=fake.base_url)`` posts here.
    Rate-limit headers, error statuses and bodies are chat completions' (:class:`OpenAIWire`).
    """

    name = "openai-responses"
    endpoints = "POST /v1/responses"
    id_prefix = "resp_fake"

    def __init__(self, url_model: str) -> None:
        super().__init__(url_model)
        self.sequence = 0
        self.started = False  # response.created sent
        self.item: PieceKind | None = None  # the open output item's kind
        self.index = -1  # the open output item's index
        self.texts: list[str] = []  # the open item's pieces
        self.done: list[dict[str, object]] = []  # output items closed so far

    @classmethod
    def route(cls, method: str, path: str) -> str | None:
        return "" if method == "POST" and path in PATHS else None

    def parse(self, body: Mapping[str, object]) -> Parsed:
        model = body.get("model")
        chars = len(_input_text(body.get("input"))) + len(content_text(body.get("instructions")))
        return Parsed(
            model=model if isinstance(model, str) else "",
            stream=body.get("stream") is True,
            prompt_tokens=max(chars // 4, 1),
            prefill=None,
            max_tokens=integer(body.get("max_output_tokens")),
            include_usage=True,
        )

    # -- the response object and its items

    def _response(
        self, status: str, output: list[dict[str, object]], n: int | None
    ) -> dict[str, object]:
        meta = self.meta
        response: dict[str, object] = {
            "id": meta.response_id,
            "object": "response",
            "created_at": meta.created,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "model": meta.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        }
        if n is not None:
            response["usage"] = {
                "input_tokens": meta.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": n,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": meta.prompt_tokens + n,
            }
        return response

    def _item(self, kind: PieceKind, index: int, text: str | None) -> dict[str, object]:
        """Output item ``index`` of ``kind``: ``text`` is its whole text once done, ``None``
        while it is open."""
        status = "in_progress" if text is None else "completed"
        item_id = f"{_ITEMS[kind][:2]}_fake{index}{self.meta.response_id[-8:]}"
        if kind == "tool":
            return {
                "type": "function_call",
                "id": item_id,
                "call_id": f"call_fake{index}{self.meta.response_id[-8:]}",
                "name": self.meta.tool_name,
                "arguments": text or "",
                "status": status,
            }
        if kind == "reasoning":
            summary = [] if text is None else [{"type": "summary_text", "text": text}]
            return {"type": "reasoning", "id": item_id, "summary": summary}
        content = [] if text is None else [self._part(text)]
        return {
            "type": "message",
            "id": item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def _part(text: str) -> dict[str, object]:
        return {"type": "output_text", "text": text, "annotations": []}

    def _items(self, pieces: list[Piece]) -> list[dict[str, object]]:
        """The output items of a whole answer: runs of one kind, a tool call each."""
        runs: list[tuple[PieceKind, list[str]]] = []
        for kind, text in pieces:
            if runs and runs[-1][0] == kind and kind != "tool":
                runs[-1][1].append(text)
            else:
                runs.append((kind, [text]))
        if not any(kind == "text" for kind, _ in runs) and not any(k == "tool" for k, _ in runs):
            runs.append(("text", []))
        return [self._item(kind, i, "".join(texts)) for i, (kind, texts) in enumerate(runs)]

    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        status = "incomplete" if finish in (None, "length") else "completed"
        return dumps(self._response(status, self._items(pieces), len(pieces)))

    # -- the stream

    def _event(self, type_: str, **fields: object) -> bytes:
        self.sequence += 1
        return sse(dumps({"type": type_, "sequence_number": self.sequence, **fields}), type_)

    def opening(self) -> bytes:
        self.started = True
        response = self._response("in_progress", [], None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _close_item(self) -> bytes:
        kind = self.item
        if kind is None:
            return b""
        self.item = None
        text = "".join(self.texts)
        item = self._item(kind, self.index, text)
        self.done.append(item)
        where: dict[str, object] = {"item_id": item["id"], "output_index": self.index}
        out = b""
        if kind == "text":
            out += self._event("response.output_text.done", **where, content_index=0, text=text)
            out += self._event(
                "response.content_part.done", **where, content_index=0, part=self._part(text)
            )
        elif kind == "tool":
            out += self._event("response.function_call_arguments.done", **where, arguments=text)
        else:
            out += self._event(
                "response.reasoning_summary_text.done", **where, summary_index=0, text=text
            )
        return out + self._event("response.output_item.done", output_index=self.index, item=item)

    def _open_item(self, kind: PieceKind) -> bytes:
        self.index += 1
        self.item, self.texts = kind, []
        item = self._item(kind, self.index, None)
        out = self._event("response.output_item.added", output_index=self.index, item=item)
        if kind == "text":
            out += self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.index,
                content_index=0,
                part=self._part(""),
            )
        return out

    def piece(self, piece: Piece) -> bytes:
        kind, text = piece
        out = b"" if self.started else self.opening()
        if kind != self.item or kind == "tool":
            out += self._close_item() + self._open_item(kind)
        self.texts.append(text)
        where: dict[str, object] = {
            "item_id": self._item(kind, self.index, None)["id"],
            "output_index": self.index,
        }
        if kind != "tool":
            where["summary_index" if kind == "reasoning" else "content_index"] = 0
        return out + self._event(_DELTAS[kind], **where, delta=text)

    def beat(self, k: int) -> bytes:
        return b": keep-alive\n\n"

    def stream_error(self, error: bytes) -> bytes:
        # The Responses stream's error event: the error object's fields at the top level.
        parsed = json_object(error.decode("utf-8"))
        fields = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
        if not isinstance(fields, dict):
            fields = {}
        self.sequence += 1
        event = {
            "type": "error",
            "code": fields.get("code") or fields.get("type"),
            "message": fields.get("message", ""),
            "param": fields.get("param"),
            "sequence_number": self.sequence,
        }
        return sse(dumps(event), "error")

    def end_without_finish(self) -> list[bytes]:
        # The items end properly but no terminal event says how the response ended.
        return [self._close_item()]

    def end(self, finish: str, n_tokens: int, *, terminator: bool) -> list[bytes]:
        events = [b"" if self.started else self.opening()]
        if self.item is None and not self.done:  # an empty answer still has its message
            events.append(self._open_item("text"))
        events.append(self._close_item())
        if terminator:
            status = "incomplete" if finish == "length" else "completed"
            kind = "response.incomplete" if status == "incomplete" else "response.completed"
            events.append(self._event(kind, response=self._response(status, self.done, n_tokens)))
        return events
