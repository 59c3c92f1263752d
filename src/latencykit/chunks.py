"""The fast lane's answers: what a response and a stream's events decode into, and the one rule
for what counts as content (:func:`delta_content`), on every lane and entry point.

Each body or SSE event is decoded once, from its bytes, by msgspec:

- into **typed** answers: a :class:`Response` (:class:`Choice`, :class:`Message`) or a
  :class:`Chunk` (:class:`ChunkChoice`, :class:`ChunkDelta`), with :class:`ToolCall`,
  :class:`Function` and :class:`Usage`: OpenAI's ``chat.completion`` and
  ``chat.completion.chunk`` schemas and the fields OpenAI-compatible providers commonly add.
  Decoding into them is faster than into dicts, and reading ``chunk.choices[0].delta.content``
  is a few C-level attribute reads (a user reads that on every chunk);
- a body or event with a field the schema does not name, or a value of another JSON type, is
  decoded into a :class:`Node` instead (a ``dict`` with attribute access), so nothing a provider
  sends is dropped; the rest of that stream is then decoded that way.

Both kinds read as litellm's objects do: attributes (an absent field reads as ``None``),
``chunk[key]``, ``chunk.get(key)``, ``key in chunk``, ``chunk.model_dump()``;
``litellm.stream_chunk_builder`` accepts the chunks, and
:func:`latencykit.llm.to_model_response` makes a litellm ``ModelResponse`` of a response.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

__all__ = [
    "CONTENT_FIELDS",
    "OPENAI_CHUNKS",
    "Choice",
    "Chunk",
    "ChunkChoice",
    "ChunkDelta",
    "Embedding",
    "EmbeddingResponse",
    "Function",
    "FunctionDelta",
    "Message",
    "Node",
    "Response",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "decode_chunk",
    "decode_embeddings",
    "decode_node",
    "decode_response",
    "delta_content",
]


class _ReadsLikeAMapping:
    """What the typed chunks share with :class:`Node` (and litellm's chunk objects): they are
    read-only mappings of their fields that are set (not ``None``), with ``model_dump``, and
    ``None`` for an attribute the type does not name. (``litellm.stream_chunk_builder`` reads
    a delta as a mapping.)"""

    __slots__ = ()
    __struct_fields__: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:  # only called for names the type lacks
        if name.startswith("_"):
            raise AttributeError(name)
        return None

    def __getitem__(self, key: str) -> Any:
        if key in self.__struct_fields__:
            return getattr(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` (``None``) if it is absent or null."""
        value = getattr(self, key) if key in self.__struct_fields__ else None
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return key in self.__struct_fields__ and getattr(self, key) is not None

    def __iter__(self) -> Iterator[str]:
        return (name for name in self.__struct_fields__ if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # The views of the fields that are set, as any Mapping has them.
    keys = Mapping.keys
    items = Mapping.items
    values = Mapping.values

    def model_dump(self, **_pydantic_options: Any) -> dict[str, Any]:
        """Its fields as plain JSON values, null fields left out (pydantic's options, such as
        ``mode="json"``, are accepted and change nothing)."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    def model_dump_json(self, **_pydantic_options: Any) -> str:
        """:meth:`model_dump` as JSON text."""
        return msgspec.json.encode(self).decode()


# forbid_unknown_fields: an event with a field not named here is decoded as a Node (nothing is
# dropped). gc=False: these hold only decoded JSON (no cycles), so the collector skips them.
_TYPED = {
    "forbid_unknown_fields": True,
    "gc": False,
    "omit_defaults": True,
    "repr_omit_defaults": True,
}


class Function(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    """A function call: its ``name`` and ``arguments`` (JSON text); in a chunk, a piece of one
    (the name on the first piece, the arguments as text to concatenate). Both default to
    ``None``."""

    name: str | None = None
    arguments: str | None = None


class ToolCall(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    """A tool call: ``id``, ``type`` and ``function`` (a :class:`Function`); in a chunk, a
    piece of one, with its ``index`` (``id`` and ``type`` on its first piece). Defaults
    ``None``."""

    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: Function | None = None


FunctionDelta = Function
ToolCallDelta = ToolCall


class Message(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    """A response's message: ``content``, ``role``, ``tool_calls`` (:class:`ToolCall` s), and
    the providers' reasoning fields (``reasoning_content``: DeepSeek, vLLM, SGLang;
    ``reasoning``: OpenRouter, Groq). All default to ``None``."""

    content: str | None = None
    role: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: Function | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    reasoning_details: Any = None
    audio: Any = None
    annotations: Any = None


class ChunkDelta(Message):
    """What one chunk adds to a choice's message: the fields of a :class:`Message`, each a
    piece (text to concatenate). All default to ``None``."""


class _Choice(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    index: int | None = None
    finish_reason: str | None = None
    logprobs: Any = None
    stop_reason: Any = None
    matched_stop: Any = None
    native_finish_reason: str | None = None
    content_filter_results: Any = None


class ChunkChoice(_Choice):
    """One choice of a chunk: ``index``, ``delta`` (:class:`ChunkDelta`),
    ``finish_reason`` (``None`` until the last), ``logprobs``, and providers' extras
    (``stop_reason``: vLLM, ``matched_stop``: SGLang, ``native_finish_reason``: OpenRouter,
    ``content_filter_results``: Azure). Defaults ``None``."""

    delta: ChunkDelta | None = None


class Choice(_Choice):
    """One choice of a response: ``index``, ``message`` (:class:`Message`), ``finish_reason``,
    ``logprobs`` and the providers' extras of :class:`ChunkChoice`. Defaults ``None``."""

    message: Message | None = None


class Usage(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    """Token counts (on a response; on the last chunk of a stream when asked with
    ``stream_options``): ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and their
    details. Defaults ``None``."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: Any = None
    completion_tokens_details: Any = None


class _Completion(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    id: str | None = None
    object: str | None = None
    created: int | None = None
    model: str | None = None
    usage: Usage | None = None
    system_fingerprint: str | None = None
    service_tier: str | None = None
    x_groq: Any = None
    provider: str | None = None
    citations: Any = None
    prompt_filter_results: Any = None


class Chunk(_Completion):
    """One ``chat.completion.chunk``: ``id``, ``model``, ``created``, ``choices`` (default
    empty), ``usage`` (:class:`Usage`, on the last chunk if asked), ``system_fingerprint``,
    ``service_tier``, and providers' extras (``obfuscation``: OpenAI, ``x_groq``: Groq,
    ``provider``: OpenRouter, ``citations``: Perplexity, ``prompt_filter_results``: Azure).
    Other fields default to ``None``."""

    choices: list[ChunkChoice] = []
    obfuscation: str | None = None


class Response(_Completion, dict=True, gc=True):
    """One ``chat.completion``, the fast lane's answer to a call without ``stream=True``:
    ``id``, ``model``, ``created``, ``choices`` (:class:`Choice` s, default empty), ``usage``
    (:class:`Usage`), ``system_fingerprint``, ``service_tier``, and the providers' extras of
    :class:`Chunk` (and vLLM's ``prompt_logprobs`` and ``kv_transfer_params``). Other fields
    default to ``None``.

    It reads as litellm's ``ModelResponse`` does (``response.choices[0].message.content``,
    ``response["usage"]``, ``response.model_dump()``, ``response._hidden_params``);
    :func:`latencykit.llm.to_model_response` makes one of it."""

    choices: list[Choice] = []
    prompt_logprobs: Any = None
    kv_transfer_params: Any = None


class Embedding(msgspec.Struct, _ReadsLikeAMapping, **_TYPED):
    """One input's vector in an :class:`EmbeddingResponse`: ``embedding`` (a list of floats;
    base64 text if the call asked for ``encoding_format="base64"``), ``index`` (its input's
    position) and ``object`` (``"embedding"``). Defaults ``None``."""

    object: str | None = None
    index: int | None = None
    embedding: list[float] | str | None = None


class EmbeddingResponse(msgspec.Struct, _ReadsLikeAMapping, **{**_TYPED, "gc": True, "dict": True}):
    """The fast lane's answer to :meth:`~latencykit.LLM.aembedding`: ``data`` (one
    :class:`Embedding` per input, default empty), ``model``, ``usage`` (:class:`Usage`:
    ``prompt_tokens``, ``total_tokens``) and ``object`` (``"list"``); other fields default to
    ``None``. It reads as litellm's ``EmbeddingResponse`` does
    (``response.data[0].embedding``, ``response["usage"]``, ``response.model_dump()``,
    ``response._hidden_params``)."""

    object: str | None = None
    data: list[Embedding] = []
    model: str | None = None
    usage: Usage | None = None
    id: str | None = None
    created: int | None = None


_TYPES = (
    Function,
    ToolCall,
    Message,
    ChunkDelta,
    ChunkChoice,
    Choice,
    Usage,
    Chunk,
    Response,
    Embedding,
    EmbeddingResponse,
)
for _typed in _TYPES:
    Mapping.register(_typed)
_SCHEMA_FIELDS = frozenset(name for typed in _TYPES for name in typed.__struct_fields__)

decode_chunk = msgspec.json.Decoder(Chunk).decode
"""An event's bytes as a :class:`Chunk`; raises ``msgspec.ValidationError`` for a field or
type the schema does not have, ``msgspec.DecodeError`` for anything that is not JSON."""

decode_response = msgspec.json.Decoder(Response).decode
"""A body's bytes as a :class:`Response` (raising as :func:`decode_chunk` does)."""

decode_embeddings = msgspec.json.Decoder(EmbeddingResponse).decode
"""A body's bytes as an :class:`EmbeddingResponse` (raising as :func:`decode_chunk` does)."""


# --- the general form -------------------------------------------------------------------------

_dict_getitem = dict.__getitem__
_dict_setitem = dict.__setitem__


def _nodes_in(items: list[Any]) -> None:
    """Turn the plain dicts in ``items`` (and in its nested lists) into :class:`Node` s, in
    place."""
    for i, item in enumerate(items):
        kind = type(item)
        if kind is dict:
            items[i] = Node(item)
        elif kind is list:
            _nodes_in(item)


class Node(dict[str, Any]):
    """A decoded JSON object with attribute access: ``node.choices`` is ``node["choices"]``.
    What an event the typed schema does not fit (:class:`Chunk`) decodes into.

    An absent field reads as ``None`` (as the OpenAI SDK's and litellm's optional fields do),
    also as ``node[key]`` for a field the typed schema names; private and special names are
    never looked up. Setting an attribute sets the key (a private one, ``_hidden_params``, is
    an attribute: where a response that does not fit :class:`Response` keeps what
    :func:`latencykit.report` reads, as litellm's ``ModelResponse`` does).

    Nested objects are made :class:`Node` s when first read (by attribute, ``node[key]`` or
    ``node.get(key)``, also inside lists), not when the chunk is decoded. ``dict`` views
    (``values()``, ``items()``) show them as stored.
    """

    __slots__ = ("_hidden_params",)

    def __getattr__(self, name: str) -> Any:
        if name not in self:
            if name.startswith("_"):
                raise AttributeError(name)
            return None
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __missing__(self, key: str) -> Any:
        # As on the typed chunks: a field the schema names reads as None when absent.
        if key in _SCHEMA_FIELDS:
            return None
        raise KeyError(key)

    def __getitem__(self, key: str) -> Any:
        value = _dict_getitem(self, key)  # an absent key: __missing__
        kind = type(value)
        if kind is dict:
            value = Node(value)
            _dict_setitem(self, key, value)
        elif kind is list:
            _nodes_in(value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """``node[key]`` if present, else ``default`` (``None``)."""
        return self[key] if key in self else default  # noqa: SIM401 (self.get is this method)

    def model_dump(self, **_pydantic_options: Any) -> dict[str, Any]:
        """Its fields as plain JSON values (a copy, null fields kept; pydantic's options are
        accepted and change nothing)."""
        return msgspec.json.decode(msgspec.json.encode(self))  # type: ignore[no-any-return]

    def model_dump_json(self, **_pydantic_options: Any) -> str:
        """Its fields as JSON text."""
        return msgspec.json.encode(self).decode()


decode_node = msgspec.json.Decoder().decode
"""An event's bytes as plain JSON values (dicts and lists), made a :class:`Node` by the
caller."""


# --- how a Stream reads them ----------------------------------------------------------------------

_NOT_CONTENT: tuple[str | None, str | None] = (None, None)


CONTENT_FIELDS = ("tool_calls", "function_call", "reasoning_content", "reasoning")
"""The delta fields that make a chunk content when its text is empty: a tool call (or a
legacy function call) and reasoning text (``reasoning_content``: DeepSeek, vLLM, SGLang,
litellm; ``reasoning``: vLLM >= 0.9, Ollama, OpenRouter). The one content rule, whatever the
lane or entry point: a chunk is content when its delta has text or one of these; a role-only
chunk, an empty delta, a finish chunk and a usage chunk are not."""


def delta_content(delta: Any, text: Any, field: Any = getattr) -> str | None:
    """The content of a delta whose text is ``text``: the text, ``""`` for content without
    text (:data:`CONTENT_FIELDS`), ``None`` when the delta is not content. ``field(delta,
    name, None)`` reads a field (default ``getattr``). Content sent as a list of parts
    (Mistral's ``[{"type": "text", "text": ...}, {"type": "thinking", ...}]``) is content, its
    text the text parts' joined."""
    if text:
        if type(text) is str:
            return text
        parts = text if isinstance(text, list) else ()
        return "".join(p["text"] for p in parts if _is_text_part(p))
    for name in CONTENT_FIELDS:
        if field(delta, name, None):
            return ""
    return None


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, Mapping) and part.get("type") == "text" and type(part.get("text")) is str
    )


class _OpenAIChunkReader:
    """Reads the fast lane's chunks (either kind) for a :class:`~latencykit.Stream`, by the one
    content rule (:func:`delta_content`)."""

    requires_finish = True

    def read(self, chunk: Any) -> tuple[str | None, str | None]:
        try:
            choices = chunk.choices
            if not choices:
                return _NOT_CONTENT
            choice = choices[0]
            finish = choice.finish_reason
            delta = choice.delta
            if delta is None:
                return None, finish
            return delta_content(delta, delta.content), finish
        except (AttributeError, TypeError, IndexError):  # a Node of another shape
            return _NOT_CONTENT

    def output_tokens(self, chunk: Any) -> int | None:
        try:
            tokens = chunk.usage.completion_tokens
        except AttributeError:  # no usage (None), or not an object
            return None
        return tokens if isinstance(tokens, int) else None


OPENAI_CHUNKS = _OpenAIChunkReader()
"""The reader of the fast lane's chunks."""
