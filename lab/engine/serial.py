"""MessagePack encoding of the engine-core messages (msgspec), for a core in another process.

The message types are the plain dataclasses of `lab.core.protocol` (and what they hold:
SamplingParams, LogprobsLists, RequestStats, StepStats); msgspec encodes dataclasses natively
and decodes them back into the same types, running their `__post_init__` (so SamplingParams are
validated again on the receiving side). A decoded message equals the one encoded.

    codec = MessageCodec()
    data = codec.encode(request)                      # bytes
    again = codec.decode(data, EngineCoreRequest)     # == request

A request whose params are a *subclass* of SamplingParams (a plug-in's own fields) travels as
(the class's import path, the request, its params) and is rebuilt as that subclass on the other
side, so the core's logits processors see what the frontend built. The class must be importable
by that path there: defined at the top level of a module (not in `__main__`, not inside a
function); one that is not is refused where the request is encoded, naming the class.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from typing import TypeVar

import msgspec

from lab.core.protocol import EngineCoreOutputs, EngineCoreRequest, UtilityCall
from lab.core.sampling_params import SamplingParams

T = TypeVar("T")

#: what crosses the process boundary: requests and utility calls in, step results out
MESSAGE_TYPES = (EngineCoreRequest, EngineCoreOutputs, UtilityCall)

#: a request with SamplingParams of a subclass: (its import path, the request, the params)
SubclassedRequest = tuple[str, msgspec.Raw, msgspec.Raw]


class _RequestId(msgspec.Struct):
    """Only the id of an encoded request (every other field ignored, whatever it holds)."""

    request_id: str


class _CallId(msgspec.Struct):
    """Only the id of an encoded utility call."""

    call_id: int


class MessageCodec:
    """One encoder, and one typed decoder per message type (msgspec reuses their buffers and
    type information, so make one codec per socket, not one per message)."""

    def __init__(self, types: tuple[type, ...] = MESSAGE_TYPES) -> None:
        self.encoder = msgspec.msgpack.Encoder()
        self.decoders = {t: msgspec.msgpack.Decoder(t) for t in types}
        if EngineCoreRequest in self.decoders:  # a request, or a subclassed one
            self._wire_request = msgspec.msgpack.Decoder(EngineCoreRequest | SubclassedRequest)
        self._request_id = msgspec.msgpack.Decoder(_RequestId | SubclassedRequest)
        self._call_id = msgspec.msgpack.Decoder(_CallId)
        self._paths: dict[type, str] = {}  # SamplingParams subclass -> its checked import path
        self._params_decoders: dict[str, msgspec.msgpack.Decoder] = {}  # path -> decoder

    def encode(self, message: object) -> bytes:
        if isinstance(message, EngineCoreRequest) and (
                type(message.sampling_params) is not SamplingParams):
            return self._encode_subclassed(message)
        return self.encoder.encode(message)

    def decode(self, data: bytes, message_type: type[T]) -> T:
        """Decode `data` as `message_type`; a malformed message raises msgspec.DecodeError /
        ValidationError naming the bad field (or ValueError from a SamplingParams check)."""
        decoder = self.decoders.get(message_type)
        if decoder is None:
            raise TypeError(f"{message_type.__name__} is not a message type of this codec "
                            f"({', '.join(t.__name__ for t in self.decoders)})")
        if message_type is EngineCoreRequest:
            message = self._wire_request.decode(data)
            return message if isinstance(message, EngineCoreRequest) else self._rebuild(message)
        return decoder.decode(data)

    def request_id_of(self, data: bytes) -> str | None:
        """The request id of an encoded request that does not decode as one (a field of the
        wrong type, params that fail their checks), so the engine core can fail that request
        alone; None when not even the id can be read."""
        try:
            named = self._request_id.decode(data)
            if isinstance(named, tuple):  # a subclassed request: the id is in the request part
                named = msgspec.msgpack.decode(named[1], type=_RequestId)
        except msgspec.DecodeError:  # (ValidationError is one)
            return None
        return named.request_id

    def call_id_of(self, data: bytes) -> int | None:
        """The call id of an encoded utility call that does not decode as one (None: unread)."""
        try:
            return self._call_id.decode(data).call_id
        except msgspec.DecodeError:
            return None

    def _encode_subclassed(self, request: EngineCoreRequest) -> bytes:
        cls = type(request.sampling_params)
        path = self._paths.get(cls) or self._paths.setdefault(cls, params_class_path(cls))
        try:
            params = msgspec.Raw(self.encoder.encode(request.sampling_params))
        except (TypeError, msgspec.EncodeError) as e:
            raise ValueError(f"{cls.__qualname__} (a SamplingParams subclass) cannot cross to "
                             f"the engine-core process: {e}") from None
        return self.encoder.encode((path, msgspec.Raw(self.encoder.encode(request)), params))

    def _rebuild(self, message: tuple[str, msgspec.Raw, msgspec.Raw]) -> EngineCoreRequest:
        """A subclassed request: the request, then its params decoded as their own class."""
        path, request, params = message
        base = self.decoders[EngineCoreRequest].decode(request)
        decoder = self._params_decoders.get(path)
        if decoder is None:
            decoder = msgspec.msgpack.Decoder(resolve_params_class(path))
            self._params_decoders[path] = decoder
        return replace(base, sampling_params=decoder.decode(params))


def params_class_path(cls: type) -> str:
    """`module:qualname` of a SamplingParams subclass, checked to import back to `cls`; a
    ValueError naming the class when it would not (defined in __main__ or in a function)."""
    module, qualname = cls.__module__, cls.__qualname__
    path = f"{module}:{qualname}"
    hint = ("engine_client=mp rebuilds a SamplingParams subclass in the engine-core process by "
            "its import path: define it at the top level of an importable module")
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(f"{qualname} (a SamplingParams subclass defined in {module}"
                         f"{' inside a function' if '<locals>' in qualname else ''}) cannot "
                         f"cross to the engine-core process: {hint}")
    try:
        found = resolve_params_class(path)
    except (ImportError, AttributeError, ValueError):
        found = None
    if found is not cls:
        raise ValueError(f"{qualname} does not import back from {path}: {hint}")
    return path


def resolve_params_class(path: str) -> type[SamplingParams]:
    """The SamplingParams subclass at `module:qualname` (ValueError if it is none)."""
    module, _, qualname = path.partition(":")
    obj: object = import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, SamplingParams)):
        raise ValueError(f"{path} is not a SamplingParams subclass")
    return obj
