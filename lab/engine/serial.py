"""MessagePack encoding of the engine-core messages (msgspec), for a core in another process.

The message types are the plain dataclasses of `lab.core.protocol` (and what they hold:
SamplingParams, LogprobsLists, RequestStats, StepStats); msgspec encodes dataclasses natively
and decodes them back into the same types, running their `__post_init__` (so SamplingParams are
validated again on the receiving side). A decoded message equals the one encoded.

    codec = MessageCodec()
    data = codec.encode(request)                      # bytes
    again = codec.decode(data, EngineCoreRequest)     # == request
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from lab.core.protocol import EngineCoreOutputs, EngineCoreRequest, UtilityCall

T = TypeVar("T")

#: what crosses the process boundary: requests and utility calls in, step results out
MESSAGE_TYPES = (EngineCoreRequest, EngineCoreOutputs, UtilityCall)


class MessageCodec:
    """One encoder, and one typed decoder per message type (msgspec reuses their buffers and
    type information, so make one codec per socket, not one per message)."""

    def __init__(self, types: tuple[type, ...] = MESSAGE_TYPES) -> None:
        self.encoder = msgspec.msgpack.Encoder()
        self.decoders = {t: msgspec.msgpack.Decoder(t) for t in types}

    def encode(self, message: object) -> bytes:
        return self.encoder.encode(message)

    def decode(self, data: bytes, message_type: type[T]) -> T:
        """Decode `data` as `message_type`; a malformed message raises msgspec.DecodeError /
        ValidationError naming the bad field (or ValueError from a SamplingParams check)."""
        decoder = self.decoders.get(message_type)
        if decoder is None:
            raise TypeError(f"{message_type.__name__} is not a message type of this codec "
                            f"({', '.join(t.__name__ for t in self.decoders)})")
        return decoder.decode(data)
