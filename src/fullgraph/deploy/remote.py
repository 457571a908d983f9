"""Fleet caches on Redis (issue 35): torch's remote FX-graph, AOTAutograd and (on a GPU) autotuning caches for this
process, through one Redis client of ours that signs and checks every entry.

    fleet = fullgraph.deploy.remote_cache("redis://cache:6379/0", password=..., key=...)
    compiled = fullgraph.compile(model, "perception")   # hits what another replica compiled
    fleet.stats()                                       # {"hits": ..., "misses": ..., "refused": ..., ...}

What torch's own Redis backend does not (torch 2.11 and 2.13 alike): it makes a client per graph from
TORCHINDUCTOR_REDIS_URL, retries a timeout with a warning at every lookup, and goes silent on a wrong password.
Here one client serves the process, with connect and read timeouts (1 s by default) and no retries; the first
failure (refused, timed out, wrong password) is said once and turns Redis off for the process ("compiling
locally"). Entries are code and pickles, so each is wrapped in a header naming torch, triton, fullgraph, the GPU
and its capability (or "cpu") and signed with HMAC-SHA256 over the Redis key, header and payload with the user's
key; an entry that fails the signature or the header check is refused with one line naming the cause, counted,
and never handed to torch (torch compiles locally and writes a good entry over it). Redis keeps no hit count per
key, so each verified hit is counted in the hash HITS_KEY (`fullgraph cache stats` shows them).

Compile once per fleet. Replicas that start together all miss, and each compiled the same graphs (on an H100, four
ViT-B/16 replicas at once: one of them chose other kernels, 4.8% slower in steady state: Inductor times choices
such as padding a matmul while it compiles, and four compiles at once on one GPU time them apart). Now a miss of an
FX-graph or AOTAutograd entry claims it (SET NX on `fullgraph:compiling:<key>`, renewed while the holder compiles):
the claimant compiles and its `put` releases the claim; a replica that misses a claimed entry waits for it (up to
`wait`) and loads it, so the fleet runs one compile's code. A holder killed mid-compile stops renewing, its claim
lapses within LEASE_TTL_S, and the waiters compile for themselves; a claim whose entry torch never saves (an
uncacheable graph) is released when Dynamo's compile ends. Each Redis operation still has the `timeout`; only the
wait for another replica's compile is longer, and it is never longer than compiling here would have taken, unless
the holder is slower than this replica.

torch picks a remote cache's backend by class name in `torch._inductor.remote_cache` and offers no supported hook
for another backend (2.11 to 2.13, as on main): the one way in is the class attribute `backend_override_cls` that
torch's own tests use. `_hook` is the only code that touches it, and checks that it exists. The hook is
process-wide, so one remote cache serves a process: a second `remote_cache` call replaces the first.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import torch

from fullgraph.deploy._common import DeployError, environment, mismatches
from fullgraph.errors import UsageError

ENV_URL = "FULLGRAPH_REMOTE_CACHE"
ENV_KEY = "FULLGRAPH_REMOTE_CACHE_KEY"
ENV_WAIT = "FULLGRAPH_REMOTE_CACHE_WAIT"  # seconds, as remote_cache(wait=...)
DEFAULT_TIMEOUT_S = 1.0
# Compile once per fleet: a replica that misses an FX-graph or AOTAutograd entry claims it (a lease in Redis) and
# compiles; a replica that misses an entry another has claimed waits for it (at most DEFAULT_WAIT_S) instead of
# compiling it again. The holder renews its lease every LEASE_TTL_S / 3 while it compiles, so a killed holder's lease
# lapses within LEASE_TTL_S and its waiters compile for themselves.
DEFAULT_WAIT_S = 300.0
LEASE_TTL_S = 10.0
POLL_S = 0.1  # how often a waiter looks for the entry
LEASE_PREFIX = "fullgraph:compiling:"  # + the entry's Redis key
LEASED = ("fx-graph", "autograd")  # torch's caches whose misses are claimed (cache ids begin so); not autotuning
# compare-and-act on a lease: only the replica that claimed it renews or releases it
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
MAGIC = b"FGRC1\n"  # then the signature (64 hex digits), a newline, the JSON header, a newline, torch's bytes
FORMAT = 1
HITS_KEY = "fullgraph:hits"  # Redis hash: entry key -> hits fullgraph recorded
CHECKED = ("torch", "triton", "fullgraph", "device", "capability")
# torch's remote caches that read through our backend (classes of torch._inductor.remote_cache); PGO stays off.
CACHE_CLASSES = ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache", "RemoteBundledAutotuneCache")


class RemoteCacheWarning(UserWarning):
    """A remote cache entry refused, or Redis turned off for this process: one line naming the cause."""


def import_redis() -> Any:
    try:
        import redis
    except ImportError:
        raise DeployError("the remote cache needs the redis client: pip install 'fullgraph[remote]'") from None
    return redis


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redis_url(url: str | None, missing: str) -> str:
    """`url`, else FULLGRAPH_REMOTE_CACHE's; `missing` begins the UsageError when neither is there."""
    url = url or os.environ.get(ENV_URL)
    if not url:
        raise UsageError(f"{missing}, or set {ENV_URL}")
    return url


def client(url: str, password: str | None, timeout: float) -> Any:
    """A Redis client that waits at most `timeout` to connect and `timeout` per reply, and never retries.
    `password`: given, else the URL's; there must be one (entries run code when loaded)."""
    redis = import_redis()
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise UsageError(f"remote cache {url!r}: give redis://HOST:PORT/DB, or rediss:// for TLS")
    if timeout <= 0:
        raise UsageError(f"remote cache timeout {timeout!r}: give seconds > 0, e.g. 1.0")
    password = password or parts.password
    if not password:
        raise UsageError(f"remote cache {shown_url(url)}: give password= (or redis://:PASSWORD@HOST:PORT): the "
                         "entries are code, so Redis must require a password (requirepass)")  # fmt: skip
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
    found = redis.Redis.from_url(url, **kwargs)
    found.connection_pool.connection_kwargs["password"] = password  # the argument wins over the URL's
    return found


def _secret(key: str | bytes | None) -> bytes:
    key = key if key is not None else os.environ.get(ENV_KEY)
    if not key:
        raise UsageError(f"the remote cache needs a signing key: key=... or {ENV_KEY} (the same on every replica)")
    return key.encode() if isinstance(key, str) else bytes(key)


# ---- entries: header, signature, checks --------------------------------------------------------------------------


def signature(secret: bytes, key: str, header: bytes, payload: bytes) -> bytes:
    """HMAC-SHA256 over the Redis key (an entry cannot be moved to another key), the header and the payload."""
    mac = hmac.new(secret, key.encode() + b"\n" + header + b"\n", hashlib.sha256)
    mac.update(payload)
    return mac.hexdigest().encode()


def wrap(secret: bytes, key: str, payload: bytes, env: dict[str, Any]) -> bytes:
    header = json.dumps({"format": FORMAT, **env}, sort_keys=True).encode()
    return MAGIC + signature(secret, key, header, payload) + b"\n" + header + b"\n" + payload


def unwrap(secret: bytes, key: str, data: bytes, here: dict[str, Any]) -> tuple[bytes | None, str | None]:
    """(torch's bytes, None) for a good entry, else (None, the cause)."""
    if not data.startswith(MAGIC):
        return None, "not signed by fullgraph (written by torch's own Redis backend or another tool)"
    sig, _, rest = data[len(MAGIC) :].partition(b"\n")
    header, _, payload = rest.partition(b"\n")
    if not hmac.compare_digest(sig, signature(secret, key, header, payload)):
        return None, "bad signature (signed with another key, or changed since)"
    meta = json.loads(header)
    if meta.get("format") != FORMAT:
        return None, f"entry format {meta.get('format')!r} there, {FORMAT} here"
    wrong = mismatches(meta, here, CHECKED)
    return (None, ", ".join(wrong)) if wrong else (payload, None)


def cache_of(key: str) -> str:
    """torch's cache id in a Redis key `pt2:<cache id>::<key>:c1` ("fx-graph-v1", "autograd-experimental", ...)."""
    return key.split("::", 1)[0].removeprefix("pt2:") if key.startswith("pt2:") else "other"


# ---- the backend: one client, one failure, counters ---------------------------------------------------------------


class SignedRedisBackend:
    """What torch's RemoteCache instances call (`get(key)`, `put(key, bytes)`), shared by all of them: torch's
    `RemoteCacheBackend` interface, duck-typed so that this module imports no Inductor until it is hooked in."""

    def __init__(self, url: str, *, password: str | None, key: str | bytes | None, timeout: float,
                 wait: float = DEFAULT_WAIT_S):  # fmt: skip
        if wait < 0:
            raise UsageError(f"remote cache wait={wait!r}: give seconds >= 0 (0: never wait for another replica)")
        self.url, self.timeout, self.wait = shown_url(url), timeout, wait
        self._secret = _secret(key)
        self._redis = import_redis()
        self._client = client(url, password, timeout)
        self._env = environment()
        self._lock = threading.Lock()
        self._off: str | None = None  # why Redis was turned off for this process
        self.counts: Counter[str] = Counter()  # "<cache>.hit|miss|refused|put|claimed|waited", "skipped"
        self.redis_s = 0.0  # time spent waiting for Redis, all operations
        self.slowest_s = 0.0  # the longest single operation
        self.waited_s = 0.0  # time spent waiting for entries other replicas were compiling
        self._token = secrets.token_hex(8)  # this process's leases carry it
        self._held: dict[str, float] = {}  # entry key -> when this process claimed it
        self._renewer: threading.Thread | None = None
        self._on_end: Callable[..., None] | None = None  # its compile-end callback (_release_at_compile_end)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            totals = Counter()
            for name, n in self.counts.items():
                totals[name.rsplit(".", 1)[-1]] += n
            return {"url": self.url, "off": self._off, "redis_s": self.redis_s, "slowest_s": self.slowest_s,
                    "waited_s": self.waited_s,
                    **{k: totals[k] for k in ("hit", "miss", "refused", "put", "skipped", "claimed", "waited")},
                    "by_cache": dict(sorted(self.counts.items()))}  # fmt: skip

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _call(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, fn()) or, after a failure or once Redis is off, (False, None): the first failure turns Redis off
        for the process and is said once."""
        if self._off:
            self._count("skipped")
            return False, None
        start = time.perf_counter()
        try:
            return True, fn()
        except self._redis.RedisError as e:
            self._turn_off(e)
            return False, None
        finally:
            took = time.perf_counter() - start
            with self._lock:
                self.redis_s += took
                self.slowest_s = max(self.slowest_s, took)

    def _turn_off(self, e: Exception) -> None:
        text = " ".join(str(e).split()) or type(e).__name__
        errors = self._redis.exceptions
        if isinstance(e, errors.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH", "invalid")):
            why = f"Redis refused the password ({text}); check password= or the URL"
        elif isinstance(e, errors.TimeoutError):
            why = f"Redis did not answer within {self.timeout:g} s ({text})"
        else:
            why = f"Redis failed ({type(e).__name__}: {text})"
        with self._lock:
            if self._off:
                return
            self._off = why
        warnings.warn(f"remote cache {self.url}: {why}; compiling locally, and not asking Redis again in this "
                      "process", RemoteCacheWarning, stacklevel=2)  # fmt: skip

    def get(self, key: str) -> bytes | None:
        ok, data = self._call(lambda: self._client.get(key))
        if not ok:
            return None
        name = cache_of(key)
        if data is None and self.wait and name.startswith(LEASED):
            data = self._claim_or_wait(key, name)
        if data is None:
            self._count(f"{name}.miss")
            return None
        payload, why = unwrap(self._secret, key, data, self._env)
        if payload is None:
            self._count(f"{name}.refused")
            warnings.warn(f"remote cache {self.url}: refused {name} entry {key.split('::')[-1][:16]}: {why}; "
                          "compiling locally", RemoteCacheWarning, stacklevel=2)  # fmt: skip
            return None
        self._count(f"{name}.hit")
        self._call(lambda: self._client.hincrby(HITS_KEY, key, 1))
        return payload

    def put(self, key: str, data: bytes) -> None:
        ok, _ = self._call(lambda: self._client.set(key, wrap(self._secret, key, data, self._env)))
        if ok:
            self._count(f"{cache_of(key)}.put")
        self._release(key)  # the entry is there (or Redis is off): its waiters stop waiting

    def close(self) -> None:
        self.release_all()
        self._client.close()

    # -- compile once per fleet: leases on missed entries ------------------------------------------------------------

    def _claim_or_wait(self, key: str, name: str) -> bytes | None:
        """After a miss: claim `key` (this process compiles it: None), or, when another replica holds its claim, wait
        for its entry and return it (None when the claim lapses or `wait` passes first: this process compiles)."""
        with self._lock:
            if key in self._held:  # this process claimed it (asked again, or another thread compiles it): no wait
                return None
        lease = LEASE_PREFIX + key
        ttl_ms = int(min(LEASE_TTL_S, self.wait) * 1000)
        ok, claimed = self._call(lambda: self._client.set(lease, self._token, nx=True, px=ttl_ms))
        if not ok:
            return None
        if claimed:
            self._count(f"{name}.claimed")
            with self._lock:
                self._held[key] = time.monotonic()
            self._renew_in_background()
            _release_at_compile_end(self)
            return None
        self._count(f"{name}.waited")
        start = time.monotonic()
        try:
            while time.monotonic() - start < self.wait:
                time.sleep(POLL_S)
                ok, (there, claimed_still) = self._call(lambda: self._exists(key, lease))
                if not ok:
                    return None
                if there:
                    ok, data = self._call(lambda: self._client.get(key))
                    return data if ok else None
                if not claimed_still:  # the holder stopped without an entry (killed, or nothing to save)
                    return None
            warnings.warn(f"remote cache {self.url}: waited {self.wait:g} s for the {name} entry another replica "
                          "is compiling; compiling it here (remote_cache(wait=...) for models that compile longer)",
                          RemoteCacheWarning, stacklevel=3)  # fmt: skip
            return None
        finally:
            with self._lock:
                self.waited_s += time.monotonic() - start

    def _exists(self, key: str, lease: str) -> tuple[bool, bool]:
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(key)
        pipe.exists(lease)
        there, leased = pipe.execute()
        return bool(there), bool(leased)

    def _release(self, key: str) -> None:
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None and not self._off:
            self._call(lambda: self._client.eval(_RELEASE, 1, LEASE_PREFIX + key, self._token))

    def release_all(self) -> None:
        """Give up every claim this process holds: its compiles are over, and what they saved is in Redis."""
        with self._lock:
            keys = list(self._held)
        for key in keys:
            self._release(key)

    def _renew_in_background(self) -> None:
        with self._lock:  # a renewer that ends clears `_renewer` under this lock first (`_renew_once`)
            if self._renewer is not None and self._renewer.is_alive():
                return
            self._renewer = threading.Thread(target=_renew, args=(weakref.ref(self),), daemon=True,
                                             name="fullgraph remote cache leases")  # fmt: skip
            self._renewer.start()

    def _renew_once(self) -> bool:
        """Renew the claims younger than `wait`, drop the older ones; whether the renewer goes on. It stops, clearing
        `_renewer` under the lock, only when no claim is left then, so a claim made meanwhile starts a new one."""
        now = time.monotonic()
        with self._lock:
            old = [k for k, t in self._held.items() if now - t >= self.wait]
            live = [k for k in self._held if k not in old]
        for key in old:
            self._release(key)
        ttl_ms = int(LEASE_TTL_S * 1000)
        for key in live:
            renew = lambda k=key: self._client.eval(_RENEW, 1, LEASE_PREFIX + k, self._token, ttl_ms)  # noqa: E731
            if self._off or not self._call(renew)[0]:  # Redis is off: the claims lapse by themselves
                with self._lock:
                    self._held.clear()
                break
        with self._lock:
            if self._held:
                return True
            self._renewer = None
            return False


def _renew(backend: weakref.ref) -> None:
    """The renewing thread's loop: ends when no claim is left (or the backend is gone)."""
    while True:
        time.sleep(LEASE_TTL_S / 3)
        found = backend()
        if found is None or not found._renew_once():
            return
        del found  # no reference held while asleep: the backend can be collected


def _release_at_compile_end(backend: SignedRedisBackend) -> None:
    """Release `backend`'s claims when Dynamo's compile in progress ends: an entry claimed but never saved (torch
    declined to cache that graph) then holds no other replica waiting. Through Dynamo's compile-end callbacks
    (torch 2.6 and later), registered again at each claim (`torch._dynamo.reset()` clears them); without them, a
    claim lapses after `wait` at most."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    registered = getattr(callback_handler, "end_callbacks", None)
    if registered is None or not hasattr(callback_handler, "register_end_callback"):
        return
    if backend._on_end is None:
        ref = weakref.ref(backend)

        def ended(*_: Any) -> None:
            found = ref()
            if found is not None:
                with contextlib.suppress(Exception):  # never fail a compile over a claim: it lapses by itself
                    found.release_all()

        backend._on_end = ended
    if backend._on_end not in registered:
        callback_handler.register_end_callback(backend._on_end)


# ---- turning it on and off for the process -------------------------------------------------------------------------


def _hook(backend: SignedRedisBackend | None) -> None:
    """Point torch's remote caches at `backend` (None: back to torch's own). The one place that reaches into
    torch's private `backend_override_cls` (no public hook exists, 2.11 to 2.13); it checks that it is there."""
    import torch._inductor.remote_cache as rc

    if not hasattr(rc, "RemoteCache") or not hasattr(rc.RemoteCache, "backend_override_cls"):
        raise DeployError(f"torch {torch.__version__} has no remote cache hook (RemoteCache.backend_override_cls), "
                          "which fullgraph's remote cache needs; use torch 2.9 to 2.14")  # fmt: skip
    for name in CACHE_CLASSES:
        if (cls := getattr(rc, name, None)) is not None:
            cls.backend_override_cls = None if backend is None else (lambda: backend)
    try:  # AOTAutograd keeps the first cache object it made (functools.cache): make it ask again
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

        getattr(AOTAutogradCache.get_remote_cache, "cache_clear", lambda: None)()
    except ImportError:
        pass


def _flags(gpu: bool) -> list[tuple[Any, str, bool]]:
    """(config module, flag, value) that turn the remote caches on: autotuning only where there is a GPU."""
    import torch._functorch.config as aot
    import torch._inductor.config as inductor

    wanted = [(inductor, "fx_graph_remote_cache", True), (aot, "enable_remote_autograd_cache", True),
              (inductor, "autotune_remote_cache", gpu), (inductor, "bundled_autotune_remote_cache", gpu)]  # fmt: skip
    return [(m, name, value) for m, name, value in wanted if hasattr(m, name)]


class FleetCache:
    """This process's remote cache, from `remote_cache`: `stats()` its counters, `close()` (or leaving a `with`
    block) turns it off and restores torch's settings."""

    def __init__(self, backend: SignedRedisBackend):
        self.backend = backend
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def url(self) -> str:
        return self.backend.url

    def stats(self) -> dict[str, Any]:
        return self.backend.stats()

    def _open(self, gpu: bool) -> None:
        _hook(self.backend)
        for module, name, value in _flags(gpu):
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)

    def close(self) -> None:
        global _active
        with _active_lock:
            if _active is not self:
                return
            for module, name, value in reversed(self._saved):
                setattr(module, name, value)
            _hook(None)
            _active = None
        self.backend.close()

    def __enter__(self) -> FleetCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FleetCache({self.url!r}, {self.stats()})"


_active: FleetCache | None = None
_active_lock = threading.Lock()


def remote_cache(url: str | None = None, *, password: str | None = None, key: str | bytes | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, wait: float | None = None) -> FleetCache:  # fmt: skip
    """Turn on torch's remote FX-graph and AOTAutograd caches (and autotuning on a GPU) on Redis for this process.

    `url`: redis://[:PASSWORD@]HOST:PORT/DB or rediss:// (TLS); default FULLGRAPH_REMOTE_CACHE. `password`: Redis'
    (required). `key`: the signing key, the same on every replica; default FULLGRAPH_REMOTE_CACHE_KEY. `timeout`:
    seconds to connect and per reply (default 1). `wait`: the longest this process waits for an FX-graph or
    AOTAutograd entry that another replica is compiling (it claimed the entry first) rather than compile it too
    (default FULLGRAPH_REMOTE_CACHE_WAIT, else 300 s; 0: never wait). Process-wide (torch's hook is): a second
    call replaces the first. Nothing is contacted until the first compile asks."""
    global _active
    url = redis_url(url, "remote_cache: give the Redis URL")
    wait = _wait_from_env() if wait is None else wait
    fleet = FleetCache(SignedRedisBackend(url, password=password, key=key, timeout=timeout, wait=wait))
    previous = active()
    if previous is not None:
        previous.close()
    with _active_lock:
        fleet._open(gpu=torch.cuda.is_available())
        _active = fleet
    return fleet


def _wait_from_env() -> float:
    text = os.environ.get(ENV_WAIT)
    if not text:
        return DEFAULT_WAIT_S
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{ENV_WAIT}={text!r}: give seconds, e.g. 300 (0: never wait for another replica)") from None


def active() -> FleetCache | None:
    """The remote cache this process uses, if any."""
    return _active


# ---- what Redis holds ----------------------------------------------------------------------------------------------


def entries(url: str | None = None, *, password: str | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, dict[str, int]]:  # fmt: skip
    """Per torch cache in Redis ("fx-graph-v1", "autograd-experimental", ...): entries, bytes and the hits fullgraph
    recorded. A Redis that cannot be reached is a DeployError naming the cause."""
    url = redis_url(url, "give the Redis URL (--remote)")
    c = client(url, password, timeout)
    redis = import_redis()
    try:
        hits = {k.decode(): int(v) for k, v in c.hgetall(HITS_KEY).items()}
        keys = [k.decode() for k in c.scan_iter(match="pt2:*", count=1000)]
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.strlen(k)
        sizes = pipe.execute()
    except redis.RedisError as e:
        raise DeployError(f"remote cache {shown_url(url)}: {type(e).__name__}: {' '.join(str(e).split())}") from None
    finally:
        c.close()
    found: dict[str, dict[str, int]] = {}
    for k, size in zip(keys, sizes, strict=True):
        row = found.setdefault(cache_of(k), {"entries": 0, "bytes": 0, "hits": 0, "largest": 0})
        row["entries"] += 1
        row["bytes"] += int(size)
        row["hits"] += hits.get(k, 0)
        row["largest"] = max(row["largest"], int(size))
    return dict(sorted(found.items()))
