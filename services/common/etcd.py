"""The one module that talks to etcd (through aetcd).

`EtcdStore` is a small interface over one key prefix: reads, puts,
create-if-absent and compare-and-swap transactions, leases, and a watch that
survives a broken stream (it resumes after the last revision it delivered,
and re-lists when that revision is compacted). Keys are given and returned
relative to the prefix. Every etcd outage surfaces as `EtcdUnavailable`,
which servicers map to UNAVAILABLE. With a `TlsConfig` etcd is reached over
TLS (its certificate verified against the CA, the own certificate presented
when etcd runs with --client-cert-auth). With a user and password the store
signs in to etcd's own authentication before its first request, and again
when etcd refuses the token (etcd forgets tokens when it restarts, and after
--auth-token-ttl unused); `enable_auth` turns that authentication on (what
`omru up` with credentials does).

`Election` is etcd's leader election (its concurrency package): a candidate
holds a key under its own kept-alive lease. `EtcdStore.fenced` gives a view of
the store whose every write is conditional on that key still being the one
its leader created, so a deposed leader (paused, partitioned, lease lapsed)
cannot write: its writes raise `Fenced`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
from dataclasses import dataclass
from typing import AsyncIterator, Mapping, Sequence

import aetcd
import grpc
from aetcd import exceptions as aetcd_errors
from aetcd import rpc, watcher
from aetcd.utils import prefix_range_end

from services.common.channels import channel_credentials
from services.common.config import EtcdConfig, TlsConfig
from services.common.logging import get_logger

log = get_logger(__name__)

#: Channel options: reconnect fast after an etcd restart.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.max_receive_message_length": 64 << 20,  # a list page of big values
}
#: Keys per page of a list.
LIST_PAGE = 256


class EtcdUnavailable(Exception):
    """etcd cannot be reached (or did not answer in time)."""


class LeaseNotFound(Exception):
    """etcd says the lease does not exist (expired or revoked)."""


class Fenced(Exception):
    """A write of a fenced store refused: its leader no longer holds the fence key."""


@dataclass(frozen=True)
class Kv:
    """One stored key (relative to the prefix) with its etcd metadata."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch: kind is "put" or "delete"."""

    kind: str
    key: str
    value: bytes
    prev_value: bytes | None
    revision: int


@dataclass(frozen=True)
class WatchBatch:
    """Every change of one etcd revision."""

    revision: int
    events: tuple[WatchEvent, ...]


@dataclass(frozen=True)
class Resync:
    """The watch could not resume (compacted): the full state as of revision."""

    revision: int
    kvs: tuple[Kv, ...]


@dataclass(frozen=True)
class TxnResult:
    """Outcome of a transaction: its revision and, on failure, the keys that blocked it."""

    succeeded: bool
    revision: int
    existing: tuple[Kv, ...] = ()


class _Watcher(watcher.Watcher):
    """aetcd's watcher, but a watch etcd refuses at its creation (created and canceled at once: the stream's
    auth token is no longer valid) raises instead of waiting for events that never come."""

    async def _handle_response(self, response):
        if response.created and response.canceled:
            async with self._lock:
                if self._new_callback is not None:
                    self._new_callback.error = aetcd_errors.ClientError(f"watch refused: {response.cancel_reason}")
                    self._new_callback_ready.notify_all()
            return
        await super()._handle_response(response)


class _Client(aetcd.Client):
    """aetcd.Client over TLS when credentials are given (aetcd 1.0 itself opens plaintext channels only),
    signed in (`sign_in`) when a user is given. The channel opens without reaching etcd; the store signs in
    before its first request and again when etcd no longer knows the token (see EtcdStore._call)."""

    def __init__(self, credentials: grpc.ChannelCredentials | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials
        self._signing_in = asyncio.Lock()

    @property
    def signs_in(self) -> bool:
        return self._username is not None

    async def connect(self) -> None:
        # aetcd's connect, with a secure channel and without signing in; nothing awaits, so no other task interleaves
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        options = self._options.items()
        self.channel = (rpc.insecure_channel(target, options=options) if self._credentials is None
                        else rpc.secure_channel(target, self._credentials, options=options))
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self.auth_stub = rpc.AuthStub(self.channel)
        self._watcher = _Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()

    async def sign_in(self, stale=None) -> None:
        """A fresh token for every request from now on (the watch stream reopens with it); with stale (the
        metadata a refused request carried), only when no other task signed in since."""
        async with self._signing_in:
            if stale is not None and self.metadata != stale:
                return
            reply = await self.auth_stub.Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password), timeout=self._timeout)
            self.metadata = (("token", reply.token),)
            self._watcher._metadata = self.metadata  # noqa: SLF001 (aetcd reads it when it opens a stream)
            await self._watcher._terminate_stream(None)  # noqa: SLF001 (its watches resume on the new stream)


def _token_refused(exc: BaseException) -> bool:
    """Whether etcd refused a request for its token (unknown to it: restarted, or idle past --auth-token-ttl)."""
    if isinstance(exc, aetcd_errors.ClientError) and isinstance(exc.__cause__, grpc.aio.AioRpcError):
        exc = exc.__cause__
    text = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    return "invalid auth token" in (text or "")


class EtcdStore:
    """Keys under one prefix of one etcd endpoint (over TLS when tls is given)."""

    def __init__(self, endpoint: str, prefix: str = "/omru/", timeout: float = 2.0, tls: TlsConfig | None = None,
                 user: str | None = None, password: str | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        self.endpoint = endpoint
        self.prefix = prefix
        self.timeout = timeout
        self._client = _Client(None if tls is None else channel_credentials(tls), host=host, port=int(port),
                               username=user, password=password, timeout=timeout, options=dict(_CHANNEL_OPTIONS),
                               connect_wait_timeout=timeout)
        #: (operation, error kind) -> failed calls (views from `fenced` share it); services/common/metrics.py
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self._fence: tuple[bytes, int] | None = None  # (key, its create revision) every write requires
        self._keepalives: _KeepAlives | None = None

    def fenced(self, key: str, create_revision: int) -> "EtcdStore":
        """This store (same connection), writing only while `key` is the one created at create_revision."""
        view = copy.copy(self)
        view._fence = (self._key(key), create_revision)
        return view

    @classmethod
    def from_config(cls, config: EtcdConfig) -> "EtcdStore":
        """The store an EtcdConfig describes."""
        return cls(config.endpoint, config.prefix, config.timeout_seconds, config.tls, config.user, config.password)

    # --- lifecycle ---------------------------------------------------------

    async def connect(self) -> None:
        """Open the channel (etcd need not be up yet)."""
        with self._errors("connect", "connect"):
            await self._client.connect()

    async def close(self) -> None:
        """Close the channel and every watch."""
        if self._keepalives is not None:
            self._keepalives.close()
        with contextlib.suppress(Exception):
            await self._client.close()

    async def __aenter__(self) -> "EtcdStore":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- reads and writes --------------------------------------------------

    def _key(self, key: str) -> bytes:
        return (self.prefix + key).encode()

    def _kv(self, kv) -> Kv:
        return Kv(
            key=kv.key.decode()[len(self.prefix) :],
            value=bytes(kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            lease=kv.lease,
        )

    async def get(self, key: str) -> Kv | None:
        """The key, or None."""
        with self._errors("get", f"get {key}"):
            result = await self._call(lambda: self._client.get(self._key(key)))
        return None if result is None else self._kv(result)

    async def list(self, prefix: str = "") -> tuple[list[Kv], int]:
        """Every key under prefix (sorted by key) and the revision of the read.

        Read in pages of LIST_PAGE keys at the first page's revision (one
        consistent snapshot, as Kubernetes lists), so no reply outgrows
        gRPC's message limit however many keys there are."""
        full = self._key(prefix)
        end = prefix_range_end(full)
        out: list[Kv] = []
        start, revision = full, 0
        with self._errors("list", f"list {prefix}"):
            await self._client.connect()
            while True:
                request = rpc.RangeRequest(key=start, range_end=end, sort_order=rpc.RangeRequest.ASCEND,
                                           limit=LIST_PAGE, revision=revision)
                response = await self._call(lambda: self._client.kvstub.Range(request, timeout=self.timeout,
                                                                              metadata=self._client.metadata))
                revision = revision or response.header.revision
                out.extend(self._kv(kv) for kv in response.kvs)
                if not response.more or not response.kvs:
                    return out, revision
                start = response.kvs[-1].key + b"\0"

    async def revision(self) -> int:
        """The current revision of the store."""
        with self._errors("revision", "revision"):
            request = rpc.RangeRequest(key=self._key(""), count_only=True)
            response = await self._call(lambda: self._client.kvstub.Range(request, timeout=self.timeout,
                                                                          metadata=self._client.metadata))
        return response.header.revision

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write the key unconditionally (but for the fence); returns the revision."""
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(key), value=value, lease=lease))
        return (await self._txn([], [put], [], f"put {key}", "put")).header.revision

    async def create(self, items: Mapping[str, bytes], lease: int = 0) -> TxnResult:
        """Create every key (bound to lease), all or nothing: fails (writing nothing) when any exists.

        On failure `existing` holds the keys that already exist. LeaseNotFound
        when the lease is gone."""
        return await self.commit({k: (v, lease) for k, v in items.items()}, absent=list(items))

    async def commit(self, puts: Mapping[str, tuple[bytes, int]] = {}, deletes: Sequence[str] = (),
                     absent: Sequence[str] = ()) -> TxnResult:
        """One transaction: write puts (key -> (value, lease)) and delete keys, only when every key of
        `absent` is absent. On failure nothing is written and `existing` holds the keys of `absent`
        that exist. LeaseNotFound when a lease is gone."""
        compare = [rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=self._key(k), create_revision=0)
                   for k in absent]
        success = [rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(k), value=v, lease=lease))
                   for k, (v, lease) in puts.items()]
        success += [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self._key(k))) for k in deletes]
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=self._key(k))) for k in absent]
        keys = [*puts, *deletes]
        response = await self._txn(compare, success, failure,
                                   f"write {keys[0] if keys else ''}" + (f" and {len(keys) - 1} more keys" if len(keys) > 1 else ""),
                                   "commit")
        if response.succeeded:
            return TxnResult(True, response.header.revision)
        existing = tuple(self._kv(kv) for op in response.responses for kv in op.response_range.kvs)
        return TxnResult(False, response.header.revision, existing)

    async def cas(self, key: str, value: bytes, mod_revision: int, lease: int = 0,
                  also: Mapping[str, tuple[bytes, int]] = {}) -> TxnResult:
        """Write the key only when its mod revision is still mod_revision (0: only when absent), and
        with it the keys of `also` (key -> (value, lease)).

        On failure `existing` holds the current key (empty when it is gone)."""
        full = self._key(key)
        compare = [rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, key=full, mod_revision=mod_revision)]
        success = [rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(k), value=v, lease=lease))
                   for k, (v, lease) in {key: (value, lease), **also}.items()]
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=full))]
        response = await self._txn(compare, success, failure, f"cas {key}", "cas")
        if response.succeeded:
            return TxnResult(True, response.header.revision)
        return TxnResult(False, response.header.revision, tuple(self._kv(kv) for kv in response.responses[0].response_range.kvs))

    async def delete(self, key: str, mod_revision: int | None = None) -> TxnResult:
        """Delete the key (only when its mod revision is still mod_revision, when given).

        succeeded is False when the key was absent or had changed."""
        full = self._key(key)
        compare = []
        if mod_revision is not None:
            compare.append(rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, key=full, mod_revision=mod_revision))
        else:
            compare.append(rpc.Compare(result=rpc.Compare.GREATER, target=rpc.Compare.CREATE, key=full, create_revision=0))
        success = [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=full))]
        response = await self._txn(compare, success, [], f"delete {key}", "delete")
        return TxnResult(response.succeeded, response.header.revision)

    async def _call(self, request):
        """await request() (an etcd call reading the client's metadata when made), signed in first when this
        store has a user and is not signed in yet, and once more after signing in again when etcd no longer
        knows the token (it forgets tokens when it restarts, and after --auth-token-ttl seconds unused)."""
        await self._client.connect()
        if not self._client.signs_in:
            return await request()
        if self._client.metadata is None:
            await self._client.sign_in(stale=None)
        sent = self._client.metadata
        try:
            return await request()
        except (grpc.aio.AioRpcError, aetcd_errors.ClientError) as exc:
            if not _token_refused(exc):
                raise
        await self._client.sign_in(stale=sent)
        return await request()

    async def _txn(self, compare, success, failure, what: str, op: str):
        if self._fence is not None:
            key, revision = self._fence
            compare = [rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key,
                                   create_revision=revision), *compare]
            failure = [*failure, rpc.RequestOp(request_range=rpc.RangeRequest(key=key))]
        request = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        with self._errors(op, what):
            response = await self._call(lambda: self._client.kvstub.Txn(request, timeout=self.timeout,
                                                                        metadata=self._client.metadata))
        if self._fence is not None and not response.succeeded:
            held = response.responses[-1].response_range.kvs
            if not held or held[0].create_revision != self._fence[1]:
                self.errors[op, "fenced"] += 1
                raise Fenced(f"{what}: refused, {self._fence[0].decode()} is no longer this leader's")
            del response.responses[-1]
        return response

    # --- leases ------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: int) -> int:
        """A new lease of ttl_seconds; returns its id."""
        with self._errors("grant_lease", "grant lease"):
            lease = await self._call(lambda: self._client.lease(ttl_seconds))
        return lease.id

    async def refresh_lease(self, lease_id: int) -> int:
        """Keep the lease alive; returns its remaining TTL, 0 when the lease is gone.

        Every refresh goes over one LeaseKeepAlive stream (`_KeepAlives`), as etcd's own client keeps
        one for all its leases: a registry keeping hundreds of nodes alive opens no stream per refresh."""
        with self._errors("refresh_lease", f"refresh lease {lease_id}"):
            await self._client.connect()
            if self._keepalives is None:
                self._keepalives = _KeepAlives(self._client)
            return max(0, await self._keepalives.refresh(lease_id, self.timeout))

    async def revoke_lease(self, lease_id: int) -> bool:
        """Revoke the lease (its keys vanish); False when it was already gone."""
        try:
            with self._errors("revoke_lease", f"revoke lease {lease_id}"):
                await self._call(lambda: self._client.revoke_lease(lease_id))
        except LeaseNotFound:
            return False
        return True

    # --- watch -------------------------------------------------------------

    async def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchBatch | Resync]:
        """Every change under prefix after after_revision, one batch per revision, forever.

        A broken stream (etcd restart, network) is resumed after the last
        delivered revision; when that revision is compacted, a `Resync` with
        the full state comes instead and the watch goes on from there.
        `after_revision` 0 means: from now on."""
        full = self._key(prefix)
        last = after_revision if after_revision > 0 else await self.revision()
        backoff = 0.05
        while True:
            queue: asyncio.Queue = asyncio.Queue()
            try:
                # The raw callback sees each etcd response's events together,
                # so a revision is never split across batches.
                with self._errors("watch", "connect"):
                    callback = await self._call(lambda: self._client._watcher.add_callback(  # noqa: SLF001
                        full, queue.put, range_end=prefix_range_end(full), start_revision=last + 1, prev_kv=True))
                backoff = 0.05
                try:
                    async for batch in self._batches(queue):
                        last = batch.revision
                        yield batch
                finally:
                    with contextlib.suppress(Exception):
                        await self._client._watcher.cancel(callback.watch_id)  # noqa: SLF001
            except aetcd_errors.RevisionCompactedError as exc:
                log.warning("watch_compacted", prefix=prefix, after_revision=last, compacted=exc.compacted_revision)
                try:
                    kvs, revision = await self.list(prefix)
                except EtcdUnavailable:
                    await asyncio.sleep(backoff)
                    continue
                last = revision
                yield Resync(revision, tuple(kvs))
            except (aetcd_errors.ClientError, grpc.RpcError, EtcdUnavailable, asyncio.TimeoutError) as exc:
                if not isinstance(exc, EtcdUnavailable):  # (counted where it was raised)
                    self.errors["watch", error_kind(exc)] += 1
                log.warning("watch_broken", prefix=prefix, after_revision=last, error=_brief(exc))
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    async def _batches(self, queue: asyncio.Queue) -> AsyncIterator[WatchBatch]:
        """Group queued events by revision; raise what the watcher reports."""
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            events: list[WatchEvent] = []
            for item in items:
                if item is None or isinstance(item, BaseException):
                    for batch in _group(events):
                        yield batch
                    raise item if item is not None else aetcd_errors.ClientError("watch closed")
                events.append(self._event(item))
            for batch in _group(events):
                yield batch

    def _event(self, event) -> WatchEvent:
        kv = event.kv
        return WatchEvent(
            kind="put" if event.kind == "PUT" else "delete",
            key=kv.key.decode()[len(self.prefix) :],
            value=bytes(kv.value),
            prev_value=bytes(event.prev_kv.value) if event.prev_kv is not None else None,
            revision=kv.mod_revision,
        )

    # --- errors ------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, op: str, what: str):
        """etcd's failures as EtcdUnavailable or LeaseNotFound (what: for the message), each counted in
        `errors` by op and kind."""
        try:
            yield
        except aetcd_errors.RevisionCompactedError:
            raise
        except (aetcd_errors.ConnectionFailedError, aetcd_errors.ConnectionTimeoutError, asyncio.TimeoutError) as exc:
            self.errors[op, error_kind(exc)] += 1
            raise EtcdUnavailable(f"etcd at {self.endpoint} unavailable ({what}): {exc or type(exc).__name__}") from exc
        except grpc.aio.AioRpcError as exc:
            self.errors[op, error_kind(exc)] += 1
            raise self._from_status(exc.code(), exc.details(), what) from exc
        except aetcd_errors.ClientError as exc:
            self.errors[op, error_kind(exc)] += 1
            cause = exc.__cause__
            if isinstance(cause, grpc.aio.AioRpcError):
                raise self._from_status(cause.code(), cause.details(), what) from exc
            raise EtcdUnavailable(f"etcd at {self.endpoint} failed ({what}): {exc}") from exc

    def _from_status(self, code: grpc.StatusCode, details: str, what: str) -> Exception:
        if code == grpc.StatusCode.NOT_FOUND and "lease" in (details or ""):
            return LeaseNotFound(details)
        return EtcdUnavailable(f"etcd at {self.endpoint} unavailable ({what}): {code.name} {details}")


class _KeepAlives:
    """One LeaseKeepAlive stream for every lease a store refreshes: a refresh sends the lease's id and
    waits for etcd's answer for that id (any answer for it: refreshes of one lease in flight together
    share one). The stream opens at the first refresh and again after it broke or a refresh timed out."""

    def __init__(self, client: aetcd.Client) -> None:
        self._client = client
        self._reader: asyncio.Task | None = None
        self._requests: asyncio.Queue  # the open stream's (each stream has its own queue and waiters)
        self._waiters: dict[int, list[asyncio.Future]]

    async def refresh(self, lease_id: int, timeout: float) -> int:
        """The lease's TTL after the refresh (0: etcd does not know the lease)."""
        if self._reader is None or self._reader.done():
            self._requests, self._waiters = asyncio.Queue(), {}
            self._reader = asyncio.get_running_loop().create_task(self._read(self._requests, self._waiters))
        waiters = self._waiters
        answer = asyncio.get_running_loop().create_future()
        waiters.setdefault(lease_id, []).append(answer)
        self._requests.put_nowait(rpc.LeaseKeepAliveRequest(ID=lease_id))
        try:
            return await asyncio.wait_for(answer, timeout)
        except asyncio.TimeoutError:
            self.close()  # a stream that stopped answering is not used again
            raise
        finally:
            with contextlib.suppress(ValueError):
                waiters.get(lease_id, []).remove(answer)

    async def _read(self, requests: asyncio.Queue, waiters: dict[int, list[asyncio.Future]]) -> None:
        async def sent():
            while True:
                yield await requests.get()

        error: BaseException = aetcd_errors.ClientError("lease keep-alive stream closed")
        try:
            async for reply in self._client.leasestub.LeaseKeepAlive(sent(), metadata=self._client.metadata):
                for answer in waiters.pop(reply.ID, []):
                    if not answer.done():
                        answer.set_result(int(reply.TTL))
        except Exception as exc:  # handed to every refresh that waits
            error = exc
        finally:
            for answer in (a for group in waiters.values() for a in group):
                if not answer.done():
                    answer.set_exception(error)
            waiters.clear()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None


def error_kind(exc: BaseException) -> str:
    """The kind of a failed etcd call, for the error counts: "timeout", "connection_failed", a gRPC
    status code in lower case ("unavailable", "deadline_exceeded", "not_found" ...), "lease_not_found"."""
    if isinstance(exc, aetcd_errors.ClientError) and isinstance(exc.__cause__, grpc.aio.AioRpcError):
        exc = exc.__cause__
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() == grpc.StatusCode.NOT_FOUND and "lease" in (exc.details() or ""):
            return "lease_not_found"
        return exc.code().name.lower()
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aetcd_errors.ConnectionFailedError):
        return "connection_failed"
    if isinstance(exc, aetcd_errors.ConnectionTimeoutError):
        return "connection_timeout"
    return "client_error" if isinstance(exc, aetcd_errors.ClientError) else type(exc).__name__.lower()


def _brief(exc: BaseException) -> str:
    """One short line for a log: the status code and details of gRPC errors."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def _group(events: list[WatchEvent]) -> list[WatchBatch]:
    """Consecutive events of one revision, as batches."""
    batches: list[WatchBatch] = []
    for event in events:
        if batches and batches[-1].revision == event.revision:
            batches[-1] = WatchBatch(event.revision, batches[-1].events + (event,))
        else:
            batches.append(WatchBatch(event.revision, (event,)))
    return batches


class Election:
    """Leadership of `key` among candidates (etcd's concurrency.Election).

    `campaign` grants this candidate a lease of ttl_seconds, keeps it alive,
    and returns once the key holds `identity` under that lease (the key's
    create revision: the fence of `EtcdStore.fenced`). The leader loses when
    its lease lapses (`lost` is set) or it resigns (the lease is revoked and
    the next candidate takes over at once); candidates try again every
    `poll_seconds`, so a takeover after a leader died comes within the TTL
    and a poll."""

    def __init__(self, store: EtcdStore, key: str, identity: str, ttl_seconds: int = 5, poll_seconds: float = 0.5):
        self.store, self.key, self.identity = store, key, identity
        self.ttl_seconds, self.poll_seconds = ttl_seconds, poll_seconds
        self.lease = 0
        self.lost = asyncio.Event()
        self._keeper: asyncio.Task | None = None

    async def campaign(self) -> int:
        while True:
            try:
                if not self.lease:
                    self.lost.clear()
                    self.lease = await self.store.grant_lease(self.ttl_seconds)
                    self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())
                result = await self.store.create({self.key: self.identity.encode()}, lease=self.lease)
                if result.succeeded:
                    log.info("leader_elected", key=self.key, identity=self.identity, revision=result.revision)
                    return result.revision
            except (EtcdUnavailable, LeaseNotFound) as exc:
                log.warning("campaign_retry", key=self.key, error=str(exc))
                if isinstance(exc, LeaseNotFound):
                    await self._drop_lease()
            await asyncio.sleep(self.poll_seconds)

    async def leader(self) -> str:
        """Identity of the leader now ("" when none)."""
        kv = await self.store.get(self.key)
        return kv.value.decode() if kv is not None else ""

    async def _keep_alive(self) -> None:
        delay = self.ttl_seconds / 3
        while True:
            await asyncio.sleep(delay)
            try:
                left = await self.store.refresh_lease(self.lease)
            except EtcdUnavailable:  # etcd away or slow: the lease may still hold (the fence decides); soon again
                delay = min(1.0, self.ttl_seconds / 3)
                continue
            except LeaseNotFound:
                left = 0
            delay = self.ttl_seconds / 3
            if left <= 0:
                log.warning("leader_lease_lost", key=self.key, identity=self.identity)
                self.lost.set()
                return

    async def _drop_lease(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        self.lease, self._keeper = 0, None

    async def resign(self) -> None:
        """Give up (the lease is revoked: the key goes, another candidate takes over)."""
        lease = self.lease
        await self._drop_lease()
        if lease:
            with contextlib.suppress(Exception):
                await self.store.revoke_lease(lease)


#: The etcd role of OMRU's services (`enable_auth`): read and write the keys under the prefix, nothing else.
SERVICE_ROLE = "omru-service"


async def enable_auth(endpoint: str, prefix: str, root_password: str, users: Mapping[str, str],
                      timeout: float = 10.0) -> None:
    """Turn on etcd's own authentication at endpoint (plaintext): user root with root_password, and each of
    `users` (name -> password) with read and write on the keys under prefix only. From then on etcd serves
    no request without a user's token (its /health stays open). On data where auth is on already (an earlier
    run), it signs in as root with root_password and sets the users' passwords anew.

    EtcdUnavailable when etcd cannot be reached or refuses (root_password not the one it has, for one)."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        auth = rpc.AuthStub(channel)
        metadata = None
        step = "sign in as root"
        try:
            try:
                reply = await auth.Authenticate(rpc.AuthenticateRequest(name="root", password=root_password),
                                                timeout=timeout)
                metadata = (("token", reply.token),)
            except grpc.aio.AioRpcError as exc:
                if "authentication is not enabled" not in (exc.details() or ""):
                    raise
            steps = [] if metadata else [
                ("add user root", auth.UserAdd, rpc.AuthUserAddRequest(name="root", password=root_password)),
                ("grant root its role", auth.UserGrantRole, rpc.AuthUserGrantRoleRequest(user="root", role="root")),
            ]
            steps += [
                (f"add role {SERVICE_ROLE}", auth.RoleAdd, rpc.AuthRoleAddRequest(name=SERVICE_ROLE)),
                (f"grant {SERVICE_ROLE} {prefix}", auth.RoleGrantPermission, rpc.AuthRoleGrantPermissionRequest(
                    name=SERVICE_ROLE, perm=rpc.Permission(permType=rpc.Permission.READWRITE, key=prefix.encode(),
                                                           range_end=prefix_range_end(prefix.encode())))),
            ]
            for name, password in users.items():
                steps += [(f"add user {name}", auth.UserAdd, rpc.AuthUserAddRequest(name=name, password=password)),
                          (f"grant {name} {SERVICE_ROLE}", auth.UserGrantRole,
                           rpc.AuthUserGrantRoleRequest(user=name, role=SERVICE_ROLE))]
            for step, call, request in steps:
                try:
                    await call(request, timeout=timeout, metadata=metadata)
                except grpc.aio.AioRpcError as exc:
                    if "already exists" not in (exc.details() or ""):
                        raise
                    if isinstance(request, rpc.AuthUserAddRequest):  # a user of an earlier run: this run's password
                        await auth.UserChangePassword(rpc.AuthUserChangePasswordRequest(
                            name=request.name, password=request.password), timeout=timeout, metadata=metadata)
            if metadata is None:
                step = "enable auth"
                await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise EtcdUnavailable(f"etcd at {endpoint}: cannot {step}: {exc.code().name} {exc.details()}") from exc
