"""Command actions: run a catalog action's local program as a sync or async directive (anyio).

Rules of this file:
- the program runs WITHOUT a shell, from the catalog's argv list; `argv[0] == "python3"` means the
  interpreter running the connector (`sys.executable`), so `python3 -m connector.actions...` runs this
  very installation; the child gets a minimal environment (PATH, a UTF-8 locale, PYTHONPATH of this
  package) in its own session, so that termination reaches its whole process group;
- `input: stdin-json` programs get the directive's `input` as canonical JSON on stdin, `input: none`
  programs get no stdin and accept only an empty input object;
- stdout becomes `result.json`: parsed as JSON when it is JSON, else the UTF-8 text without its final
  line break (so `uname -srm` works); it is bounded (`response-too-large`). stderr is drained and dropped,
  never shown to a caller; a non-zero exit is `failed` with `command-failed`;
- `timeout_ms` (narrowed by the directive's own) ends the work `timed-out` (`deadline-exceeded`);
  `expires_at` ends it `expired`; both terminate the process first; a SYNC call's wait for a worker counts
  against its `timeout_ms`, and one still queued at its timeout ends `failed` `deadline-exceeded`;
- workers are shared fairly: while another principal waits, one principal holds at most half of them (at
  least one); a freed worker goes to the first waiter whose principal is under that share;
- cancel: queued work is `cancelled` at once; running work with `cancel: terminate` gets SIGTERM, then
  SIGKILL after a bound, and is `cancelled` only once its exit was seen; `cancel: none` is `not-cancelable`;
- every status change is checked against `connector.core.lifecycle` and persisted before anyone sees it;
  after a restart, `recover` marks every pending or running row `failed` with `interrupted-by-restart`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process, TaskGroup

import connector
from connector.core import projections
from connector.core.admission import AdmittedCommand, check_execution_mode
from connector.core.clock import format_time, from_ms
from connector.core.commands import CommandAction, check_command_input
from connector.core.endings import CANCELLATION_UNCONFIRMED, CLEANUP_UNCONFIRMED, DEADLINE_EXCEEDED
from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import INTERRUPTED_BY_RESTART, Status, check_transition, is_terminal
from connector.errors import Code, SensoriumError
from connector.runtime.operations import Kind, Observed
from connector.storage.state import CommandOperation, Mode
from connector.timer import WALL_TIMER, Timer, scope_after

PYTHON_ALIAS = "python3"
NOT_CANCELABLE_REASON = "this action's command cannot be interrupted once started"
DEFAULT_TTL_SECONDS = 900
DEFAULT_MAX_OUTPUT_BYTES = 262144

_log = logging.getLogger(__name__)
# How long the exit of a SIGKILLed program may take to be seen (it cannot refuse; a loaded machine delays it).
_REAP_BOUND_MS = 10_000

# Fixed messages per terminal code: the database holds codes only, and no message ever echoes I/O.
_ERROR_MESSAGES: Mapping[str, str] = {
    Code.COMMAND_FAILED: "the command failed or its output could not be read",
    DEADLINE_EXCEEDED: "the command did not finish within its time budget",
    Code.RESPONSE_TOO_LARGE: "the command's output exceeded the size bound",
    CANCELLATION_UNCONFIRMED: "the command's termination after cancel could not be confirmed",
    CLEANUP_UNCONFIRMED: "the command's termination could not be confirmed",
    INTERRUPTED_BY_RESTART: "the connector stopped while the work was pending or running",
    Status.EXPIRED.value: "the operation expired before it finished",
    Status.CANCELLED.value: "the operation was cancelled",
}


class CommandJournal(Protocol):
    """The durable rows of commands (`connector.storage.state.ConnectorState`): the runner owns each row."""

    async def insert_operation(self, operation: CommandOperation) -> None: ...

    async def update_operation(self, operation: CommandOperation) -> None: ...

    async def get_operation(self, operation_id: str) -> CommandOperation | None: ...

    async def list_operations(self, statuses: Iterable[str] | None = None) -> list[CommandOperation]: ...

    async def delete_operations_before(self, statuses: Iterable[str], updated_before: datetime) -> int: ...

    async def compact(self) -> None: ...


def resolve_argv(argv: tuple[str, ...]) -> list[str]:
    """The argv to execute: `python3` is the connector's own interpreter."""
    first = sys.executable if argv[0] == PYTHON_ALIAS else argv[0]
    return [first, *argv[1:]]


def child_environment() -> dict[str, str]:
    """A minimal environment: PATH, UTF-8 locale, and this package on PYTHONPATH (nothing else leaks)."""
    package_root = str(Path(connector.__file__).resolve().parent.parent)
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": package_root,
    }


def status_document(operation: CommandOperation, *, retry_after_seconds: int = 1) -> dict[str, Any]:
    """The `deferred-operation-status.v1` document of a command operation."""
    status = Status(operation.status)
    doc: dict[str, Any] = {
        "schema": "deferred-operation-status.v1",
        "schema/v": 1,
        "operation/id": operation.operation_id,
        "operation/kind": OPERATION_KIND,
        "status": status.value,
        "expires_at": format_time(operation.expires_at),
        "updated_at": format_time(operation.updated_at),
        "diagnostics": [],
    }
    if not is_terminal(status):
        doc["retry_after_seconds"] = retry_after_seconds
    if status is Status.COMPLETED:
        doc["result"] = {"json": operation.result}
    elif is_terminal(status) and status is not Status.CANCELLED:
        doc["error"] = _error(operation)
    if operation.causal_context_json is not None:
        doc["causal/context"] = json.loads(operation.causal_context_json)
    return doc


def directive_result(operation: CommandOperation) -> dict[str, Any]:
    """The `sensorium-directive-result.v1` of a finished operation (sync answers and their replays)."""
    doc: dict[str, Any] = {"schema": "sensorium-directive-result.v1", "action_id": operation.action_id}
    if operation.status == Status.COMPLETED:
        doc.update(status="completed", result={"json": operation.result})
    else:
        doc.update(status="failed", error=_error(operation))
    doc["diagnostics"] = []
    return doc


def deferred_handle(operation: CommandOperation, action: CommandAction) -> dict[str, Any]:
    """The `sensorium-connector-deferred.v1` handle; identical on every replay of the same operation."""
    return projections.deferred_handle(
        operation.operation_id,
        operation.action_id,
        retry_after_seconds=action.retry_after_seconds,
        fail_after=operation.expires_at - operation.created_at,
        rounding="up",
        cancel_unavailable_reason=None if operation.cancelable else NOT_CANCELABLE_REASON,
    )


def _error(operation: CommandOperation) -> dict[str, str]:
    """`error` of a terminal, non-completed operation: its code (or status) and a fixed message."""
    return projections.coded(operation.error_code or operation.status, messages=_ERROR_MESSAGES)


def _ended_by_cancel(operation: CommandOperation) -> bool:
    """Still live (the stop goes on), cancelled, or a cancel whose stop was not confirmed."""
    status = Status(operation.status)
    if not is_terminal(status) or status is Status.CANCELLED:
        return True
    return operation.error_code == CANCELLATION_UNCONFIRMED


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How a run ended, before it is persisted."""

    status: Status
    result_json: str | None = None
    error_code: str | None = None


class FairSlots:
    """Worker slots; while another principal waits, one principal holds at most half of them (>= 1)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.per_principal = max(1, total // 2)
        self._busy: Counter[str] = Counter()
        self._waiting: list[tuple[str, anyio.Event]] = []
        self._waiting_by: Counter[str] = Counter()

    def busy(self, owner: str) -> int:
        """Slots `owner` holds now."""
        return self._busy.get(owner, 0)

    def _may_take(self, owner: str) -> bool:
        if sum(self._busy.values()) >= self.total:
            return False
        others_wait = len(self._waiting) > self._waiting_by[owner]
        return self._busy[owner] < self.per_principal or not others_wait

    async def acquire(self, owner: str) -> None:
        """Wait for a slot under the fair share (FIFO among those allowed to take one)."""
        if not self._waiting and self._may_take(owner):
            self._busy[owner] += 1
            return
        entry = (owner, anyio.Event())
        self._waiting.append(entry)
        self._waiting_by[owner] += 1
        try:
            self._grant()
            await entry[1].wait()
        except BaseException:
            if entry in self._waiting:
                self._remove(entry)
                self._grant()
            elif entry[1].is_set():
                self.release(owner)  # granted as we were cancelled: hand it on
            raise

    def release(self, owner: str) -> None:
        """Give a slot back and grant it to the first waiter allowed to take it."""
        self._busy[owner] -= 1
        if self._busy[owner] <= 0:
            del self._busy[owner]
        self._grant()

    def _grant(self) -> None:
        granted = True
        while granted:
            granted = False
            for entry in self._waiting:
                if self._may_take(entry[0]):
                    self._remove(entry)
                    self._busy[entry[0]] += 1
                    entry[1].set()
                    granted = True
                    break

    def _remove(self, entry: tuple[str, anyio.Event]) -> None:
        self._waiting.remove(entry)
        self._waiting_by[entry[0]] -= 1
        if self._waiting_by[entry[0]] <= 0:
            del self._waiting_by[entry[0]]


class _Job:
    """In-memory control of one live operation (never persisted)."""

    def __init__(
        self, action: CommandAction, stdin: bytes | None, *, budget_ends_ms: int | None = None
    ) -> None:
        self.action = action
        self.stdin = stdin
        # A sync call's budget runs from its submission (timer ms): the queue wait counts against it.
        self.budget_ends_ms = budget_ends_ms
        self.cancel_requested = False
        self.scope: anyio.CancelScope | None = None
        self.process: Process | None = None
        self.done = anyio.Event()

    def request_cancel(self) -> None:
        """Record the request and interrupt whatever the job is waiting on."""
        self.cancel_requested = True
        if self.scope is not None:
            self.scope.cancel()


class CommandRunner:
    """Runs command actions with bounded concurrency; `async with CommandRunner(state) as runner`.

    `Operations` for the command kind: it owns each command's row in the state, insert and update. Every
    deadline and wait is on the injected `Timer` (the programs are real processes); the stored times come
    from `clock`, by default the timer's own now. Call `recover` once before the first `submit`. Leave the
    runner before closing its state store: leaving terminates running programs and records their work as
    `interrupted-by-restart`.
    """

    kind: ClassVar[Kind] = "command"
    bindable: ClassVar[bool] = False

    def __init__(
        self,
        state: CommandJournal,
        *,
        max_workers: int = 2,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        kill_after_seconds: float = 2.0,
        timer: Timer = WALL_TIMER,
        clock: Callable[[], datetime] | None = None,
        listener: Callable[[str, CommandOperation], None] | None = None,
    ) -> None:
        self._state = state
        self._listener = listener
        self._slots = FairSlots(max_workers)
        self._max_output_bytes = max_output_bytes
        self._kill_after_ms = int(kill_after_seconds * 1000)
        self._timer = timer
        self._clock = clock or (lambda: from_ms(timer.now_ms()))
        self._jobs: dict[str, _Job] = {}
        self._task_group: TaskGroup | None = None
        self._closing = False
        self._ended_listeners: list[Callable[[str], None]] = []

    def add_ended_listener(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(operation_id)` once a submitted operation's work ended; returns an undo."""
        self._ended_listeners.append(listener)
        return lambda: self._ended_listeners.remove(listener)

    async def __aenter__(self) -> CommandRunner:
        self._task_group = await anyio.create_task_group().__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._task_group is not None
        self._closing = True
        self._task_group.cancel_scope.cancel()
        return await self._task_group.__aexit__(exc_type, exc, tb)

    async def recover(self, now: datetime) -> list[str]:
        """Mark every pending or running row `failed` (`interrupted-by-restart`); returns their ids."""
        unfinished = await self._state.list_operations([Status.PENDING.value, Status.RUNNING.value])
        # Work this runner is doing itself was not interrupted (recover belongs before the first submit).
        interrupted = [op for op in unfinished if op.operation_id not in self._jobs]
        for operation in interrupted:
            await self._persist(operation, _Outcome(Status.FAILED, error_code=INTERRUPTED_BY_RESTART), now)
        if interrupted:
            await self._state.compact()
        return [operation.operation_id for operation in interrupted]

    async def submit(
        self,
        operation_id: str,
        owner: str,
        action: CommandAction,
        input: Mapping[str, Any],
        mode: Mode,
        now: datetime,
        *,
        timeout_ms: int | None = None,
        expires_at: datetime | None = None,
        idempotency_fp: str | None = None,
        causal_context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run (sync: the directive result) or queue (async: the deferred handle) one command operation."""
        check_execution_mode(action.execution_mode_support, mode)
        stdin = check_command_input(action, input)
        operation = CommandOperation(
            operation_id=operation_id,
            owner=owner,
            action_id=action.action_id,
            mode=mode,
            status=Status.PENDING.value,
            created_at=now,
            updated_at=now,
            expires_at=expires_at or now + timedelta(seconds=_ttl_seconds(action)),
            cancelable=action.cancelable,
            input_json=None if stdin is None else stdin.decode("utf-8"),
            idempotency_fp=idempotency_fp,
            causal_context_json=None if causal_context is None else json.dumps(dict(causal_context)),
        )
        budget = action.timeout_ms if timeout_ms is None else min(action.timeout_ms, timeout_ms)
        budget_ends_ms = self._timer.now_ms() + budget if mode == "sync" else None
        job = _Job(replace(action, timeout_ms=budget), stdin, budget_ends_ms=budget_ends_ms)
        if mode == "async" and self._task_group is None:
            raise SensoriumError("the command runner is not started", code=Code.INTERNAL)
        await self._state.insert_operation(operation)
        self._emit("admitted", operation)
        self._jobs[operation_id] = job
        if mode == "sync":
            await self._run_job(operation, job)
            return directive_result(await self._require(operation_id))
        assert self._task_group is not None
        self._task_group.start_soon(self._run_job, operation, job)
        return deferred_handle(operation, action)

    async def replay(self, operation_id: str, action: CommandAction) -> dict[str, Any]:
        """Answer an idempotent repeat exactly as the first time (waits for sync work still running)."""
        operation = await self._require(operation_id)
        if operation.mode == "async":
            return deferred_handle(operation, action)
        job = self._jobs.get(operation_id)
        if job is not None:
            await job.done.wait()
        return directive_result(await self._require(operation_id))

    async def operation(self, operation_id: str) -> CommandOperation | None:
        """The stored row (owner, action, fingerprint) for authority and idempotency checks."""
        return await self._state.get_operation(operation_id)

    async def admit(self, admission: AdmittedCommand) -> dict[str, Any]:
        """Store the command's row, then run it (sync: its result) or queue it (async: its handle)."""
        return await self.submit(
            admission.operation_id,
            admission.owner,
            admission.command,
            admission.input,
            admission.mode,
            admission.created_at,
            timeout_ms=admission.timeout_ms,
            expires_at=admission.expires_at,
            idempotency_fp=admission.fingerprint.hex(),
            causal_context=admission.causal_context,
        )

    async def status(
        self, operation_id: str, *, after: int | None = None, wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        """The `deferred-operation-status.v1`; with `wait_s`, once terminal or after that (a command has no
        revisions, `after` is not used); None for an operation not stored."""
        job = self._jobs.get(operation_id)
        if job is not None and wait_s > 0:
            with scope_after(self._timer, wait_s * 1000):
                await job.done.wait()
        operation = await self._state.get_operation(operation_id)
        return None if operation is None else self._document(operation)

    def _document(self, operation: CommandOperation) -> dict[str, Any]:
        job = self._jobs.get(operation.operation_id)
        retry = job.action.retry_after_seconds if job is not None else 1
        return status_document(operation, retry_after_seconds=retry)

    async def observe(self, operation_id: str) -> Observed | None:
        """The status without its result, and the full status."""
        document = await self.status(operation_id)
        if document is None:
            return None
        hint = document.get("retry_after_seconds")
        return Observed(
            str(document["status"]),
            projections.command_metadata(document),
            hint if isinstance(hint, int) else None,
            document,
        )

    async def cancel(self, operation_id: str) -> tuple[bool, dict[str, Any]] | None:
        """Cancel and wait for the confirmed end: whether the request interrupted live work (not when it
        ended on its own first), and the status after it (a terminal operation answers its unchanged
        status); `not-cancelable` for `cancel: none`."""
        operation = await self._state.get_operation(operation_id)
        if operation is None:
            return None
        if is_terminal(Status(operation.status)):
            return False, self._document(operation)
        if not operation.cancelable:
            raise SensoriumError(NOT_CANCELABLE_REASON, code=Code.NOT_CANCELABLE)
        job = self._jobs.get(operation_id)
        if job is not None:
            job.request_cancel()
            with scope_after(self._timer, self._kill_after_ms + _REAP_BOUND_MS + 5000):
                await job.done.wait()
        after = await self._require(operation_id)
        return job is not None and _ended_by_cancel(after), self._document(after)

    async def stop(self, operation_id: str, error_code: str) -> None:
        """Cancel cancelable work that has not ended (the runner records its own ending)."""
        operation = await self._state.get_operation(operation_id)
        if operation is not None and operation.cancelable and not is_terminal(Status(operation.status)):
            await self.cancel(operation_id)

    async def purge(self, now: datetime, retention: timedelta = timedelta(days=7)) -> int:
        """Forget terminal rows older than the retention (they then answer `unknown-operation`)."""
        terminal = [status.value for status in Status if is_terminal(status)]
        return await self._state.delete_operations_before(terminal, now - retention)

    # -- one job ----------------------------------------------------------------------------------------

    async def _run_job(self, operation: CommandOperation, job: _Job) -> None:
        """Queue, run and finish one operation; every end is persisted, cancellation is re-raised."""
        try:
            outcome, operation = await self._queue_and_run(operation, job)
            await self._persist(operation, outcome, self._clock())
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._abandon(operation.operation_id, job)
            raise
        except Exception as error:
            # One broken job must not take the runner down; only the error type is logged, never data.
            _log.error("command operation ended by an unexpected %s", type(error).__name__)
            with anyio.CancelScope(shield=True):
                await self._abandon(operation.operation_id, job, error_code=Code.COMMAND_FAILED)
            if operation.mode == "sync":
                raise
        finally:
            job.done.set()
            self._jobs.pop(operation.operation_id, None)
            for listener in list(self._ended_listeners):
                listener(operation.operation_id)

    async def _queue_and_run(
        self, operation: CommandOperation, job: _Job
    ) -> tuple[_Outcome, CommandOperation]:
        """Wait for a worker (pending), then run the process (running)."""
        acquired = False
        expiry_ms = self._deadline_ms(operation.expires_at)
        deadline_ms = expiry_ms if job.budget_ends_ms is None else min(expiry_ms, job.budget_ends_ms)
        with self._timer.scope_until(deadline_ms) as queued:
            job.scope = queued
            if job.cancel_requested:
                queued.cancel()
            await self._slots.acquire(operation.owner)
            acquired = True
        if not acquired:
            return _queued_end(job, expired=self._timer.now_ms() >= expiry_ms), operation
        try:
            operation = await self._persist(operation, _Outcome(Status.RUNNING), self._clock())
            return await self._run_process(operation, job), operation
        finally:
            self._slots.release(operation.owner)

    async def _run_process(self, operation: CommandOperation, job: _Job) -> _Outcome:
        """Spawn the program, collect its output within the deadline, and judge the result."""
        try:
            process = await anyio.open_process(
                resolve_argv(job.action.argv),
                stdin=subprocess.PIPE if job.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_environment(),
                start_new_session=True,
            )
        except OSError:
            return _Outcome(Status.FAILED, error_code=Code.COMMAND_FAILED)
        job.process = process
        budget_ends_ms = job.budget_ends_ms or self._timer.now_ms() + job.action.timeout_ms
        deadline_ms = min(budget_ends_ms, self._deadline_ms(operation.expires_at))
        stdout, overflow = b"", False
        with self._timer.scope_until(deadline_ms) as running:
            job.scope = running
            if job.cancel_requested:
                running.cancel()
            stdout, overflow = await _communicate(process, job.stdin, self._max_output_bytes)
            if not overflow:
                await process.wait()
        if running.cancelled_caught or overflow or process.returncode is None:
            return await self._stop(process, job, operation, overflow=overflow)
        await process.aclose()
        return _judge(process.returncode, stdout)

    async def _stop(
        self, process: Process, job: _Job, operation: CommandOperation, *, overflow: bool
    ) -> _Outcome:
        """Terminate the process, then name the end by its cause (only once the exit was seen)."""
        confirmed = await _terminate(process, self._timer, self._kill_after_ms)
        if job.cancel_requested:
            return (
                _Outcome(Status.CANCELLED)
                if confirmed
                else _Outcome(Status.FAILED, error_code=CANCELLATION_UNCONFIRMED)
            )
        if not confirmed:
            return _Outcome(Status.FAILED, error_code=CLEANUP_UNCONFIRMED)
        if overflow:
            return _Outcome(Status.FAILED, error_code=Code.RESPONSE_TOO_LARGE)
        if self._clock() >= operation.expires_at:
            return _Outcome(Status.EXPIRED)
        return _Outcome(Status.TIMED_OUT, error_code=DEADLINE_EXCEEDED)

    async def _abandon(self, operation_id: str, job: _Job, *, error_code: str | None = None) -> None:
        """The runner, the sync caller or the job itself broke off: stop the process, record the end."""
        confirmed = job.process is None or await _terminate(job.process, self._timer, self._kill_after_ms)
        operation = await self._state.get_operation(operation_id)
        if operation is None or is_terminal(Status(operation.status)):
            return
        if error_code is not None or self._closing:
            outcome = _Outcome(Status.FAILED, error_code=error_code or INTERRUPTED_BY_RESTART)
        elif confirmed:
            outcome = _Outcome(Status.CANCELLED)
        else:
            outcome = _Outcome(Status.FAILED, error_code=CANCELLATION_UNCONFIRMED)
        await self._persist(operation, outcome, self._clock())

    # -- persistence ------------------------------------------------------------------------------------

    async def _persist(
        self, operation: CommandOperation, outcome: _Outcome, now: datetime
    ) -> CommandOperation:
        """Check the move against the lifecycle table, then store it (input cleared once terminal)."""
        check_transition(Status(operation.status), outcome.status)
        terminal = is_terminal(outcome.status)
        updated = replace(
            operation,
            status=outcome.status.value,
            updated_at=max(now, operation.updated_at),
            input_json=None if terminal else operation.input_json,
            result_json=outcome.result_json,
            error_code=outcome.error_code,
        )
        await self._state.update_operation(updated)
        self._emit("ended" if terminal else updated.status, updated)
        return updated

    def _emit(self, event: str, operation: CommandOperation) -> None:
        """Tell the listener (telemetry); its failure never reaches the operation."""
        if self._listener is None:
            return
        try:
            self._listener(event, operation)
        except Exception as error:
            _log.error("command listener failed with %s", type(error).__name__)

    async def _require(self, operation_id: str) -> CommandOperation:
        """The stored row; `unknown-operation` when there is none."""
        operation = await self._state.get_operation(operation_id)
        if operation is None:
            raise SensoriumError("unknown operation", code=Code.UNKNOWN_OPERATION)
        return operation

    def _deadline_ms(self, moment: datetime) -> int:
        """The timer's moment for a moment of the stored clock."""
        return self._timer.now_ms() + max(0, (moment - self._clock()) // timedelta(milliseconds=1))


def _queued_end(job: _Job, *, expired: bool) -> _Outcome:
    """How work that never got a worker ends: cancelled, expired, or (sync) out of its time budget."""
    if job.cancel_requested:
        return _Outcome(Status.CANCELLED)
    if expired:
        return _Outcome(Status.EXPIRED)
    return _Outcome(Status.FAILED, error_code=DEADLINE_EXCEEDED)


def _ttl_seconds(action: CommandAction) -> int:
    """The default lifetime: the action's preferred TTL, never above the host's 15 minutes."""
    return min(action.preferred_max_ttl_seconds or DEFAULT_TTL_SECONDS, DEFAULT_TTL_SECONDS)


def _judge(returncode: int, stdout: bytes) -> _Outcome:
    """A finished process: exit status, then stdout as JSON or as text."""
    if returncode != 0:
        return _Outcome(Status.FAILED, error_code=Code.COMMAND_FAILED)
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError:
        return _Outcome(Status.FAILED, error_code=Code.COMMAND_FAILED)
    try:
        value: Any = json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        value = text.removesuffix("\n").removesuffix("\r")
    return _Outcome(Status.COMPLETED, result_json=json.dumps(value, ensure_ascii=False))


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; such output is taken as text."""
    raise ValueError(name)


async def _communicate(process: Process, stdin: bytes | None, limit: int) -> tuple[bytes, bool]:
    """Feed stdin, collect at most `limit` stdout bytes, drop stderr; True when stdout overflowed."""
    collected = bytearray()
    overflow = False

    async def collect(stream: ByteReceiveStream) -> None:
        nonlocal overflow
        async for chunk in stream:
            collected.extend(chunk)
            if len(collected) > limit:
                overflow = True
                group.cancel_scope.cancel()
                return

    async with anyio.create_task_group() as group:
        if process.stdin is not None:
            group.start_soon(_feed, process.stdin, stdin or b"")
        assert process.stdout is not None and process.stderr is not None
        group.start_soon(collect, process.stdout)
        group.start_soon(_drain, process.stderr)
    return bytes(collected[:limit]), overflow


async def _feed(stream: ByteSendStream, body: bytes) -> None:
    """Write the input and close stdin; a program that exits without reading is not an error here."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(body)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.aclose()


async def _drain(stream: ByteReceiveStream) -> None:
    """Read and discard stderr so the program never blocks on it; it is never shown to callers."""
    async for _ in stream:
        pass


async def _terminate(process: Process, timer: Timer, grace_ms: int) -> bool:
    """SIGTERM the process group, SIGKILL after the grace period; True once the exit was seen."""
    with anyio.CancelScope(shield=True):
        # The grace is the program's to end politely; after SIGKILL only the kernel's exit and our reaping
        # remain, which a loaded machine can hold up past a short grace.
        for sig, bound_ms in ((signal.SIGTERM, grace_ms), (signal.SIGKILL, max(grace_ms, _REAP_BOUND_MS))):
            if process.returncode is not None:
                break
            _signal_group(process, sig)
            with scope_after(timer, bound_ms):
                await process.wait()
        if process.returncode is not None:
            await process.aclose()
    return process.returncode is not None


def _signal_group(process: Process, sig: signal.Signals) -> None:
    """Signal the child's whole session (it was started as a group leader)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
