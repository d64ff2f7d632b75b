from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FunctionRef(_message.Message):
    __slots__ = ("app", "name", "pickled", "spec_json", "generator", "retries", "packages", "imports")
    APP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PICKLED_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    PACKAGES_FIELD_NUMBER: _ClassVar[int]
    IMPORTS_FIELD_NUMBER: _ClassVar[int]
    app: str
    name: str
    pickled: bytes
    spec_json: str
    generator: bool
    retries: int
    packages: _containers.RepeatedScalarFieldContainer[str]
    imports: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, app: _Optional[str] = ..., name: _Optional[str] = ..., pickled: _Optional[bytes] = ..., spec_json: _Optional[str] = ..., generator: _Optional[bool] = ..., retries: _Optional[int] = ..., packages: _Optional[_Iterable[str]] = ..., imports: _Optional[_Iterable[str]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol", "function", "mode", "session_id", "python", "call_id", "timeout")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    function: FunctionRef
    mode: str
    session_id: str
    python: str
    call_id: str
    timeout: float
    def __init__(self, protocol: _Optional[int] = ..., function: _Optional[_Union[FunctionRef, _Mapping]] = ..., mode: _Optional[str] = ..., session_id: _Optional[str] = ..., python: _Optional[str] = ..., call_id: _Optional[str] = ..., timeout: _Optional[float] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("index", "args", "blob_key")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    index: int
    args: bytes
    blob_key: str
    def __init__(self, index: _Optional[int] = ..., args: _Optional[bytes] = ..., blob_key: _Optional[str] = ...) -> None: ...

class InputsDone(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("index", "size")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    index: int
    size: int
    def __init__(self, index: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("hello", "input", "done", "cancel", "upload")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    input: Input
    done: InputsDone
    cancel: Cancel
    upload: UploadRequest
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ..., done: _Optional[_Union[InputsDone, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., upload: _Optional[_Union[UploadRequest, _Mapping]] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("function_id", "correlation_id", "python")
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    function_id: str
    correlation_id: str
    python: str
    def __init__(self, function_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., python: _Optional[str] = ...) -> None: ...

class Output(_message.Message):
    __slots__ = ("index", "fd", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    fd: int
    text: str
    def __init__(self, index: _Optional[int] = ..., fd: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("index", "value")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    index: int
    value: bytes
    def __init__(self, index: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("index", "call_id", "ok", "value", "blob_url", "error_type", "error", "traceback", "attempts", "duration", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    BLOB_URL_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    call_id: str
    ok: bool
    value: bytes
    blob_url: str
    error_type: str
    error: str
    traceback: str
    attempts: int
    duration: float
    reason: str
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ..., ok: _Optional[bool] = ..., value: _Optional[bytes] = ..., blob_url: _Optional[str] = ..., error_type: _Optional[str] = ..., error: _Optional[str] = ..., traceback: _Optional[str] = ..., attempts: _Optional[int] = ..., duration: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Spawned(_message.Message):
    __slots__ = ("index", "call_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    call_id: str
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ...) -> None: ...

class UploadUrl(_message.Message):
    __slots__ = ("index", "url", "blob_key")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    index: int
    url: str
    blob_key: str
    def __init__(self, index: _Optional[int] = ..., url: _Optional[str] = ..., blob_key: _Optional[str] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("accepted", "output", "item", "result", "spawned", "upload")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SPAWNED_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    accepted: Accepted
    output: Output
    item: Item
    result: Result
    spawned: Spawned
    upload: UploadUrl
    def __init__(self, accepted: _Optional[_Union[Accepted, _Mapping]] = ..., output: _Optional[_Union[Output, _Mapping]] = ..., item: _Optional[_Union[Item, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., spawned: _Optional[_Union[Spawned, _Mapping]] = ..., upload: _Optional[_Union[UploadUrl, _Mapping]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("function", "python")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    function: FunctionRef
    python: str
    def __init__(self, function: _Optional[_Union[FunctionRef, _Mapping]] = ..., python: _Optional[str] = ...) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("exists", "python", "function_id", "generator")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    python: str
    function_id: str
    generator: bool
    def __init__(self, exists: _Optional[bool] = ..., python: _Optional[str] = ..., function_id: _Optional[str] = ..., generator: _Optional[bool] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EndSessionReply(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    def __init__(self, ended: _Optional[bool] = ...) -> None: ...

class EchoRequest(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class EchoReply(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...
