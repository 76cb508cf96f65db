from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCEEDED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCEEDED: Outcome
OUTCOME_FAILED: Outcome

class LeaseRef(_message.Message):
    __slots__ = ("step_key", "attempt", "token")
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    step_key: int
    attempt: int
    token: str
    def __init__(self, step_key: _Optional[int] = ..., attempt: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("executor_id", "connectors", "slots", "version")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    connectors: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    version: str
    def __init__(self, executor_id: _Optional[str] = ..., connectors: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("lease_ms", "heartbeat_interval_ms", "max_poll_wait_ms", "session", "session_id", "pool")
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_POLL_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    lease_ms: int
    heartbeat_interval_ms: int
    max_poll_wait_ms: int
    session: str
    session_id: str
    pool: str
    def __init__(self, lease_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., max_poll_wait_ms: _Optional[int] = ..., session: _Optional[str] = ..., session_id: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class PollStepsRequest(_message.Message):
    __slots__ = ("executor_id", "connectors", "max_steps", "wait_ms", "session", "poll_seq")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    POLL_SEQ_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    connectors: _containers.RepeatedScalarFieldContainer[str]
    max_steps: int
    wait_ms: int
    session: str
    poll_seq: int
    def __init__(self, executor_id: _Optional[str] = ..., connectors: _Optional[_Iterable[str]] = ..., max_steps: _Optional[int] = ..., wait_ms: _Optional[int] = ..., session: _Optional[str] = ..., poll_seq: _Optional[int] = ...) -> None: ...

class PollStepsResponse(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepAssignment]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepAssignment, _Mapping]]] = ...) -> None: ...

class StepAssignment(_message.Message):
    __slots__ = ("lease", "task_id", "step_id", "tool", "connector", "config_json", "args_json", "idempotency_key", "trace_id", "traceparent", "timeout_ms", "lease_expires_at_ms", "max_attempts", "heartbeat_timeout_ms", "idempotent", "environment")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    task_id: str
    step_id: str
    tool: str
    connector: str
    config_json: bytes
    args_json: bytes
    idempotency_key: str
    trace_id: str
    traceparent: str
    timeout_ms: int
    lease_expires_at_ms: int
    max_attempts: int
    heartbeat_timeout_ms: int
    idempotent: bool
    environment: str
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., task_id: _Optional[str] = ..., step_id: _Optional[str] = ..., tool: _Optional[str] = ..., connector: _Optional[str] = ..., config_json: _Optional[bytes] = ..., args_json: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., trace_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., lease_expires_at_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ..., idempotent: _Optional[bool] = ..., environment: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("executor_id", "leases", "session", "polls_completed")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    POLLS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    session: str
    polls_completed: int
    def __init__(self, executor_id: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., session: _Optional[str] = ..., polls_completed: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("extended", "cancelled", "lost", "lease_expires_at_ms")
    EXTENDED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    extended: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    cancelled: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    lost: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    lease_expires_at_ms: int
    def __init__(self, extended: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., cancelled: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., lost: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., lease_expires_at_ms: _Optional[int] = ...) -> None: ...

class StepError(_message.Message):
    __slots__ = ("code", "message", "retryable", "retry_after_s", "maybe_applied")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    MAYBE_APPLIED_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    retry_after_s: float
    maybe_applied: bool
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., retry_after_s: _Optional[float] = ..., maybe_applied: _Optional[bool] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("lease", "outcome", "output_json", "error", "started_at_ms", "finished_at_ms", "throttle_s")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_S_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    outcome: Outcome
    output_json: bytes
    error: StepError
    started_at_ms: int
    finished_at_ms: int
    throttle_s: float
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., output_json: _Optional[bytes] = ..., error: _Optional[_Union[StepError, _Mapping]] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., throttle_s: _Optional[float] = ...) -> None: ...

class ReportResultsRequest(_message.Message):
    __slots__ = ("executor_id", "results", "session")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    results: _containers.RepeatedCompositeFieldContainer[StepResult]
    session: str
    def __init__(self, executor_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., session: _Optional[str] = ...) -> None: ...

class ResultAck(_message.Message):
    __slots__ = ("lease", "accepted", "reason")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    accepted: bool
    reason: str
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportResultsResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[ResultAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[ResultAck, _Mapping]]] = ...) -> None: ...

class ExecutorMessage(_message.Message):
    __slots__ = ("id", "timeout_ms", "poll", "heartbeat", "report")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    poll: PollStepsRequest
    heartbeat: HeartbeatRequest
    report: ReportResultsRequest
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., poll: _Optional[_Union[PollStepsRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., report: _Optional[_Union[ReportResultsRequest, _Mapping]] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("id", "poll", "heartbeat", "report", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    poll: PollStepsResponse
    heartbeat: HeartbeatResponse
    report: ReportResultsResponse
    status: CallStatus
    def __init__(self, id: _Optional[int] = ..., poll: _Optional[_Union[PollStepsResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., report: _Optional[_Union[ReportResultsResponse, _Mapping]] = ..., status: _Optional[_Union[CallStatus, _Mapping]] = ...) -> None: ...

class CallStatus(_message.Message):
    __slots__ = ("code", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...
