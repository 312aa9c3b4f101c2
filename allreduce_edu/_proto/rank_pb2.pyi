from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Signature(_message.Message):
    __slots__ = ("collective", "algorithm", "op", "dtype", "shape", "root")
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    collective: str
    algorithm: str
    op: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    root: int
    def __init__(self, collective: _Optional[str] = ..., algorithm: _Optional[str] = ..., op: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., root: _Optional[int] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("src", "tag", "seq", "epoch", "collective_id", "step", "dtype", "shape", "nbytes", "offset", "length", "signature", "segment", "segment_bytes")
    SRC_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    src: int
    tag: str
    seq: int
    epoch: int
    collective_id: int
    step: int
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    offset: int
    length: int
    signature: Signature
    segment: int
    segment_bytes: int
    def __init__(self, src: _Optional[int] = ..., tag: _Optional[str] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ..., collective_id: _Optional[int] = ..., step: _Optional[int] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., signature: _Optional[_Union[Signature, _Mapping]] = ..., segment: _Optional[int] = ..., segment_bytes: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: Header
    data: bytes
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExchangeSummary(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: int
    def __init__(self, messages: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("src",)
    SRC_FIELD_NUMBER: _ClassVar[int]
    src: int
    def __init__(self, src: _Optional[int] = ...) -> None: ...

class PingReply(_message.Message):
    __slots__ = ("rank", "world_size", "host", "shm")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    host: str
    shm: str
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., host: _Optional[str] = ..., shm: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("rank", "world_size", "address")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    address: str
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("addresses",)
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ...) -> None: ...
