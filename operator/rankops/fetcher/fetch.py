"""The strict model fetcher: copy a model artifact into Triton's model repository.

`rankops fetch-model` (commands/fetch.py) runs it as the `fetch-model` init container of every
Triton pod (render/serving.py) and as `fetch-reference` in the equivalence gate's Job
(rollout/jobs.py). s3:// goes through boto3 with
the standard AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for
MinIO/Ceph/other S3-compatible stores, AWS_DEFAULT_REGION), which the RankingModel's
`modelCredentialsSecret` provides; without credentials it asks anonymously (public buckets).
gs:// goes through Cloud Storage's S3-compatible XML API at storage.googleapis.com with HMAC keys
in the same two AWS_* variables. http(s):// and file:// use the standard library.

URIs: s3://BUCKET/KEY and gs://BUCKET/KEY are object-store paths, not URLs: everything after the
bucket is the key, taken literally (`#`, `?` and `%` are key characters, as the AWS CLI reads them).
https:// is a URL (its `#fragment` is not sent). file:///PATH is percent-decoded.

A strict downloader: every failure is one line (URI, cause, fix) and a non-zero exit. Time is
bounded: an overall deadline (--deadline-s), no answer for --first-byte-s fails a request, no byte
for --stall-s fails a body's read, listings stop at --max-objects, --max-listing-pages and
--max-listing-bytes, transient errors (5xx, dropped or stalled connections, cut bodies) are retried
with back-off inside the deadline. Sizes and checksums are checked wherever the store gives them
(Content-Length, an S3 ETag that is an MD5, Content-MD5, x-goog-hash), and --sha256 (a version's
`sha256`) is checked whatever the store gives, which is what catches a body sent without a length
that closed early.

Versions on disk, for a directory DEST (/models/m/1): each fetch lands in a hidden staging
sibling, becomes a complete version `.1.v-<id>` by one rename, and DEST is a symlink to it,
switched by one rename of a new symlink over it (Triton stats version directories, so a symlink
serves; its hidden siblings are not integers, which Triton ignores). The previous version serves
until that switch and is removed only after it; a lock file beside DEST (`.1.lock`) makes a second
fetch into the same DEST wait for the first (up to its deadline). Leftovers of a killed run are
removed under that lock, never the version DEST points to. A file DEST (/reference/model.pt) is
replaced by one rename.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import hashlib
import http.client
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import unquote, urlparse

GCS_XML_ENDPOINT = "https://storage.googleapis.com"
SECRET = "the Secret named by the RankingModel's spec.modelCredentialsSecret"
DEADLINE_FIELD = "spec.fetch.deadlineSeconds"
STALL_FIELD = "spec.fetch.stallSeconds"
FIRST_BYTE_FIELD = "spec.fetch.firstByteSeconds"
SIZE_FIELD = "spec.storage.modelVolumeSize"
SHA256_FIELD = "spec.versions[].sha256"
SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20
NAME_MAX = 255                   # bytes in one file name (ext4, xfs, overlayfs)
DEFAULT_DEADLINE_S = 1800.0
DEFAULT_STALL_S = 60.0
# The wait for a request's first byte (connecting, and until the answer's headers), lower than
# the stall allowed mid-body: S3, GCS and MinIO answer a GET or a listing page in well under a
# second, and one that has said nothing for 20 s is down or hung, while a body may pause longer on
# a congested path. Each of the ATTEMPTS waits this long, so a hung store fails the init container
# in about a minute, not 3 x --stall-s (3-4 minutes by default).
DEFAULT_FIRST_BYTE_S = 20.0
DEFAULT_MAX_OBJECTS = 100_000
ATTEMPTS = 3
RETRY_HTTP = (408, 429, 500, 502, 503, 504)
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
REGION_NAME = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")   # botocore's own check
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
REDIRECTS_MAX = urllib.request.HTTPRedirectHandler.max_redirections


class FetchError(Exception):
    """What went wrong, on one line, naming the URI and the fix."""


class Transient(FetchError):
    """A failure another attempt may not have (5xx, a dropped, stalled or cut connection)."""


class ResponseNotS3(Exception):
    """A listing answered 200 with something botocore read as XML of no S3 shape (an HTML page)."""


class Interrupted(BaseException):
    """SIGTERM (the pod is being deleted): unwinds like Ctrl-C so the staging directory is removed."""


class DeadlineExceeded(BaseException):
    """The overall deadline passed (SIGALRM): a BaseException so no library's `except Exception` eats it."""


# A listing's bounds follow --max-objects unless given. S3, GCS and MinIO send up to 1000 keys a
# page and fill every page but the last; a store may send fewer ("up to"), so a page holding 100
# on average is still honest: more pages than max_objects/100 (at least 20) is a store that keeps
# paging, with empty or near-empty pages that --max-objects alone never stops (the time goes, and
# the memory of what each page held). One listed object is ~400 bytes of XML besides its key
# (at most 1024 bytes): 2 KiB an object (at least 1 MiB in all) is room for any honest listing,
# and a store that pads its pages is stopped after that many bytes, not after the deadline.
OBJECTS_PER_PAGE = 100
MIN_PAGES = 20
BYTES_PER_OBJECT = 2048
MIN_LISTING_BYTES = 1 << 20


def default_max_pages(max_objects: int) -> int:
    return max(MIN_PAGES, -(-max_objects // OBJECTS_PER_PAGE))


def default_max_listing_bytes(max_objects: int) -> int:
    return max(MIN_LISTING_BYTES, BYTES_PER_OBJECT * max_objects)


@dataclass(frozen=True)
class Limits:
    deadline_s: float = DEFAULT_DEADLINE_S
    stall_s: float = DEFAULT_STALL_S
    first_byte_s: float | None = None        # None: DEFAULT_FIRST_BYTE_S, or stall_s when that is lower
    max_objects: int = DEFAULT_MAX_OBJECTS
    attempts: int = ATTEMPTS
    max_pages: int | None = None             # None: default_max_pages(max_objects)
    max_listing_bytes: int | None = None     # None: default_max_listing_bytes(max_objects)
    max_bytes: int | None = None             # the artifact's bytes in all (None: unbounded): the volume's size

    @property
    def first_byte(self) -> float:
        return self.first_byte_s if self.first_byte_s is not None else min(self.stall_s, DEFAULT_FIRST_BYTE_S)

    @property
    def pages(self) -> int:
        return self.max_pages if self.max_pages is not None else default_max_pages(self.max_objects)

    @property
    def listing_bytes(self) -> int:
        return (self.max_listing_bytes if self.max_listing_bytes is not None
                else default_max_listing_bytes(self.max_objects))


@dataclass(frozen=True)
class Source:
    """A parsed URI: `bucket` and `key` for s3/gs, `path` for file, the URI itself for http(s)."""
    scheme: str
    bucket: str = ""
    key: str = ""
    path: str = ""


@dataclass
class Progress:
    """What the run is doing, for the deadline's and the interruption's messages."""
    activity: str = "starting"
    dest_had_version: bool = False
    switched: bool = False
    files: int = 0
    bytes: int = 0
    verified: int = 0
    unverified: list[str] = field(default_factory=list)
    sha256_checked: str = ""     # the file whose sha256 matched --sha256


# --- pure helpers -------------------------------------------------------------------------------

def parse_uri(uri: str) -> Source:
    """The URI as a source; FetchError names what is wrong with it and how to write it."""
    if CONTROL.search(uri):
        raise FetchError(f"{uri!r}: the URI holds a control character (a newline, tab or NUL): remove it")
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise FetchError(f"{uri}: not a URI: write s3://BUCKET/KEY, gs://BUCKET/KEY, https://HOST/FILE or file:///PATH")
    if scheme in ("s3", "gs"):
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise FetchError(f"{uri}: no bucket: write {scheme}://BUCKET/PATH")
        if not BUCKET_NAME.fullmatch(bucket):
            raise FetchError(f"{uri}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.' and '-'): "
                             f"write {scheme}://BUCKET/PATH")
        return Source(scheme, bucket=bucket, key=key)
    if scheme in ("http", "https"):
        if not urlparse(uri).hostname:
            raise FetchError(f"{uri}: no host: write {scheme}://HOST/PATH/FILE")
        return Source(scheme)
    if scheme == "file":
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost") or parsed.query or parsed.fragment:
            raise FetchError(f"{uri}: a file:// URI names a path on this node only (no host, ? or #): write file:///PATH")
        path = unquote(parsed.path)
        if "\x00" in path:
            raise FetchError(f"{uri}: the path decodes to a NUL byte (%00): remove it")
        return Source(scheme, path=path)
    if scheme == "pvc":
        raise FetchError(f"{uri}: pvc:// is mounted from its claim by the serving pod, never fetched: "
                         "put the artifact in s3://, gs:// or https://")
    raise FetchError(f"{uri}: unsupported scheme {scheme!r}: use s3://, gs://, https:// or file://")


def flat(text: str) -> str:
    """`text` on one line: what a server or a library says may hold newlines."""
    return CONTROL.sub(" ", text).strip()


def check_dest(text: str, uri: str = "") -> Path:
    """--dest as an absolute path; refuses one that names no entry of its own (`.`, `..`, `/`)."""
    last = text.rstrip("/").rsplit("/", 1)[-1]
    if last in ("", ".", ".."):
        raise FetchError(f"{uri + ': ' if uri else ''}--dest {text!r} names no directory or file of its own: give the version directory "
                         "(e.g. /models/NAME/1) or the file (e.g. /reference/model.pt)")
    dest = Path(os.path.abspath(text))
    if len(dest.name.encode()) > NAME_MAX - 40:   # its hidden siblings add a prefix and an id
        raise FetchError(f"{uri + ': ' if uri else ''}--dest {text!r}: the name {dest.name!r} is too long for the staging names beside it: "
                         f"use one of at most {NAME_MAX - 40} bytes")
    return dest


def check_expect(expect: str | None, uri: str) -> PurePosixPath | None:
    """--expect as a path inside DEST; an absolute path or one with `..` could be met by any file."""
    if not expect:
        return None
    path = PurePosixPath(expect)
    if path.is_absolute() or ".." in path.parts or not path.parts or CONTROL.search(expect):
        raise FetchError(f"{uri}: --expect {expect!r} must name a file inside --dest (e.g. model.onnx or "
                         "model.savedmodel/saved_model.pb), not an absolute path or one with `..`")
    return path


def check_sha256(sha256: str | None, uri: str) -> str | None:
    """--sha256 as 64 lower-case hex digits."""
    if sha256 is None:
        return None
    if not SHA256.fullmatch(sha256.lower()):
        raise FetchError(f"{uri}: --sha256 {sha256[:80]!r} is not a SHA-256 digest: give its 64 hex digits "
                         "(e.g. from `sha256sum model.onnx`)")
    return sha256.lower()


def verify_sha256(uri: str, staging: Path, dest: Path, expected_file: PurePosixPath | None, sha256: str, clock: Clock,
                  progress: Progress) -> None:
    """The digest of the file --expect names (or of the artifact's one file) must be `sha256`: a body
    the server sent without a length or checksum that closed early, or an artifact replaced at the
    URI, is refused before it becomes the version."""
    if expected_file is None:
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        if len(files) != 1:
            raise FetchError(f"{uri}: --sha256 covers one file but the artifact holds {len(files)}: give --expect "
                             "to name the file it is the digest of")
        target = files[0]
    else:
        target = staging / expected_file
    rel = target.relative_to(staging).as_posix()
    progress.activity = f"checking the sha256 of {rel}"
    digest = hashlib.sha256()
    try:
        with open(target, "rb") as handle:
            while chunk := handle.read(CHUNK):
                clock.check()
                digest.update(chunk)
    except OSError as exc:
        raise FetchError(f"{uri}: cannot read back {rel} to check its sha256 ({exc.strerror or exc}): "
                         "check --dest's volume") from None
    if digest.hexdigest() != sha256:
        raise FetchError(f"{uri}: {rel} has sha256 {digest.hexdigest()}, not the {sha256} expected (--sha256; "
                         f"{SHA256_FIELD}): the artifact at the URI is another one, or it arrived cut short or "
                         f"corrupted; upload the right artifact or correct {SHA256_FIELD}; "
                         f"{where(dest, progress)}")
    progress.sha256_checked = rel


def is_file_dest(dest: Path) -> bool:
    """A DEST with a suffix (/reference/model.pt) is a file; otherwise a directory (/models/m/1)."""
    return bool(dest.suffix)


def safe_relative(rel: str, uri: str, key: str | None = None) -> PurePosixPath:
    """An object's path below DEST; refuses keys that would write outside it (the URI is tenant input)
    or that no filesystem can hold."""
    what = f"object key {key!r}" if key is not None else f"object key part {rel!r}"
    if CONTROL.search(rel):
        raise FetchError(f"{uri}: {what} holds a control character (a newline or NUL): rename the object")
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise FetchError(f"{uri}: {what} would land outside --dest: rename the object")
    long = next((p for p in path.parts if len(p.encode()) > NAME_MAX), None)
    if long:
        raise FetchError(f"{uri}: {what} has a name of {len(long.encode())} bytes, over the filesystem's "
                         f"{NAME_MAX}: rename the object")
    return path


def object_plan(uri: str, prefix: str, objects: Iterable[tuple[str, int]]) -> list[tuple[str, PurePosixPath, int]]:
    """(key, path below DEST, size) for each listed object that is the URI itself or below it as a
    directory: s3://b/m/3 takes m/3 and m/3/..., never m/30/...; directory markers are skipped.
    Keys that would land on one path (m/3/x, m/3/./x, m/3//x) or on a file and a directory at once
    (m/3/a, m/3/a/b) are refused: which one wins would be an accident of listing order."""
    base = prefix.rstrip("/")
    plan = []
    for key, size in objects:
        if key.endswith("/"):
            continue
        if key == base:
            plan.append((key, safe_relative(PurePosixPath(key).name, uri, key), size))
        elif not base or key.startswith(base + "/"):
            plan.append((key, safe_relative(key[len(base):].lstrip("/"), uri, key), size))
    by_path: dict[PurePosixPath, list[str]] = {}
    for key, rel, _ in plan:
        by_path.setdefault(rel, []).append(key)
    for rel, keys in by_path.items():
        if len(keys) > 1:
            raise FetchError(f"{uri}: the keys {', '.join(map(repr, keys))} would all land at {rel}: "
                             "keep one of them and delete the others")
    for rel, keys in by_path.items():
        parent = next((p for p in rel.parents if p in by_path), None)
        if parent is not None:
            raise FetchError(f"{uri}: {by_path[parent][0]!r} would be a file and {keys[0]!r} needs a directory "
                             f"at the same path ({parent}): rename one of them")
    return plan


def client_settings(scheme: str, env: Mapping[str, str]) -> dict[str, Any]:
    """boto3.client keyword arguments for s3:// or gs://. A custom S3 endpoint gets path-style
    addressing (MinIO, Ceph and in-cluster Service names have no per-bucket DNS); gs:// always
    talks to Cloud Storage, whatever AWS_ENDPOINT_URL says, and only sends checksums GCS accepts."""
    if scheme == "gs":
        return {"endpoint_url": GCS_XML_ENDPOINT, "region_name": "auto",
                "config": {"s3": {"addressing_style": "path"}, "request_checksum_calculation": "when_required",
                           "response_checksum_validation": "when_required"}}
    custom = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    settings: dict[str, Any] = {"config": {"s3": {"addressing_style": "path"}} if custom else {}}
    if not (env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION")):
        settings["region_name"] = "us-east-1"
    return settings


def env_problem(scheme: str, env: Mapping[str, str]) -> str | None:
    """What in the AWS environment (the credentials Secret) boto3 would choke on, before it does.
    Names variables, never their secret values."""
    if scheme == "s3":
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            value = env.get(name)
            if value:
                parsed = urlparse(value.strip())
                if parsed.scheme not in ("http", "https") or not parsed.hostname or value != value.strip():
                    return (f"{name} {value!r} in {SECRET} is not a URL with a scheme: write it like "
                            "http://minio.minio.svc:9000 or https://s3.eu-west-1.amazonaws.com")
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        value = env.get(name)
        if value and not REGION_NAME.fullmatch(value):
            return f"{name} {value!r} in {SECRET} is not a region name: write one like us-east-1"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        value = env.get(name)
        if value is not None and (value != value.strip() or CONTROL.search(value) or " " in value):
            return (f"{name} in {SECRET} has a space, newline or control character (often a trailing newline "
                    "from `echo` or a file): store the bare value, e.g. kubectl create secret generic --from-literal")
    if bool(env.get("AWS_ACCESS_KEY_ID")) != bool(env.get("AWS_SECRET_ACCESS_KEY")):
        have, missing = (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if env.get("AWS_ACCESS_KEY_ID")
                         else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"))
        return f"{SECRET} sets {have} but not {missing}: give both, or neither for a public bucket"
    return None


def explain_client_error(uri: str, code: str, status: int, endpoint: str, detail: str = "") -> str:
    """The one-line message for an error the object store answered with."""
    if code in ("NoSuchBucket",):
        return f"{uri}: bucket does not exist at {endpoint}: check the bucket in the URI (and AWS_ENDPOINT_URL in {SECRET})"
    if code in ("NoSuchKey", "404", "NotFound"):
        return f"{uri}: no such object at {endpoint}: check the URI, or upload the artifact there"
    if code == "InvalidAccessKeyId":
        return f"{uri}: {endpoint} does not know the access key (InvalidAccessKeyId): check AWS_ACCESS_KEY_ID in {SECRET}"
    if code == "SignatureDoesNotMatch":
        return (f"{uri}: {endpoint} refused the signature (SignatureDoesNotMatch): check that AWS_SECRET_ACCESS_KEY "
                f"in {SECRET} belongs to its AWS_ACCESS_KEY_ID")
    if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
        return (f"{uri}: {endpoint} denied access ({code}): the key in AWS_ACCESS_KEY_ID of {SECRET} needs read "
                f"(GetObject, ListBucket) on this bucket; without a Secret only public buckets work")
    if code == str(status) or not code:
        # botocore found no S3 error document: the body was a web page, a proxy's answer, nothing.
        return (f"{uri}: {endpoint} answered HTTP {status} without an S3 error document (not S3's XML): "
                f"check that AWS_ENDPOINT_URL in {SECRET} points at an S3 API, not a web page or proxy")
    return f"{uri}: {endpoint} answered {status} {code}{': ' + detail if detail else ''}"


def local_error(uri: str, path: Path, exc: OSError) -> str:
    """A filesystem error while writing `path`, as a sentence with the fix."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return (f"{uri}: the disk under {path.parent} is full (writing {path.name}): the model needs more room; "
                "give the model repository's volume more space (the node's disk for an emptyDir, or its sizeLimit)")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{uri}: cannot write {path} ({'read-only filesystem' if code == errno.EROFS else 'permission denied'}): "
                "the fetcher's user needs write access to --dest's directory")
    if code == errno.ENAMETOOLONG:
        return (f"{uri}: the name {path.name!r} is longer than the filesystem allows ({NAME_MAX} bytes a name): "
                "rename the object or use a shorter --dest")
    if code in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY):
        return (f"{uri}: {path} clashes with what is there (a file where a directory is needed, or a directory "
                "where a file is): remove it, or choose another --dest")
    return f"{uri}: cannot write {path} ({exc.strerror or exc}): check --dest and its volume"


def truncated(uri: str, what: str, received: int, expected: int) -> Transient:
    return Transient(f"{uri}: download of {what} truncated ({received} of {expected} bytes): the connection dropped")


def md5_from_headers(headers: Mapping[str, str]) -> str | None:
    """The MD5 (hex) a response vouches for: Content-MD5 or x-goog-hash's md5, both base64."""
    values = [headers.get("Content-MD5") or headers.get("content-md5") or ""]
    goog = headers.get("x-goog-hash") or headers.get("X-Goog-Hash") or ""
    values += [part.strip()[4:] for part in goog.split(",") if part.strip().startswith("md5=")]
    for value in values:
        try:
            raw = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(raw) == 16:
            return raw.hex()
    return None


def s3_md5(response: Mapping[str, Any]) -> str | None:
    """The MD5 a GetObject answer vouches for. An S3 ETag is the MD5 of the bytes only for a
    single-part upload without SSE-KMS or SSE-C (a multipart ETag has a `-N` suffix)."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    from_headers = md5_from_headers(headers)
    if from_headers:
        return from_headers
    etag = str(response.get("ETag", "")).strip('"')
    if not re.fullmatch(r"[0-9a-f]{32}", etag):
        return None
    if str(response.get("ServerSideEncryption", "")).startswith("aws:kms") or response.get("SSECustomerAlgorithm"):
        return None
    return etag


def backoff_s(attempt: int) -> float:
    return min(0.5 * 2 ** (attempt - 1), 8.0)


def deadline_message(uri: str, limits: Limits, progress: Progress, dest: Path) -> str:
    return (f"{uri}: not fetched within the {limits.deadline_s:g} s deadline (--deadline-s; a RankingModel sets it "
            f"with {DEADLINE_FIELD}) while {progress.activity}: the store is slow or stalled, or the model is larger "
            f"than that allows; raise {DEADLINE_FIELD}; {where(dest, progress)}")


def where(dest: Path, progress: Progress) -> str:
    """What DEST holds now, truthfully."""
    if progress.switched:
        return f"{dest} holds the new version"
    return f"{dest} still holds the previous version" if progress.dest_had_version else f"nothing was left at {dest}"


# --- deadline and reading ---------------------------------------------------------------------------

class Clock:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.end = time.monotonic() + limits.deadline_s

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - (self.end - self.limits.deadline_s)

    def check(self) -> None:
        if self.remaining() <= 0:
            raise DeadlineExceeded()



@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[Callable[[], None]]:
    """SIGALRM after `seconds` raises DeadlineExceeded even inside a blocking read (main thread only;
    elsewhere the reads' own checks between chunks bound it). Yields `disarm`."""
    def fire(_signum: int, _frame: Any) -> None:
        raise DeadlineExceeded()
    try:
        previous = signal.signal(signal.SIGALRM, fire)
    except ValueError:   # not the main thread
        yield lambda: None
        return
    disarm = lambda: signal.setitimer(signal.ITIMER_REAL, 0)  # noqa: E731
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield disarm
    finally:
        disarm()
        signal.signal(signal.SIGALRM, previous)


def body_timeout(holder: Any, attribute: str, seconds: float) -> None:
    """Give the socket under a response whose headers are in the body's timeout (--stall-s) in place
    of the first byte's. Best effort: where a library keeps it elsewhere, the body keeps the first
    byte's (shorter) timeout, which only fails a stall sooner."""
    sock = getattr(holder, attribute, None)
    if isinstance(sock, socket.socket):
        sock.settimeout(seconds)


class ReadFailed(Exception):
    def __init__(self, cause: BaseException, received: int) -> None:
        super().__init__(str(cause))
        self.cause, self.received = cause, received


def over_size(uri: str, total: int, limit: int) -> FetchError:
    return FetchError(f"{uri}: the artifact is over --max-bytes {limit} bytes ({limit / 2 ** 30:.2f} GiB, "
                      f"{SIZE_FIELD}) at {total} bytes: raise {SIZE_FIELD} or slim the artifact; nothing of it "
                      "is kept and the serving version is untouched")


def copy_stream(uri: str, read: Callable[[], bytes], target: Path, clock: Clock,
                room: int | None = None, limit: int | None = None) -> tuple[int, str]:
    """Write what `read` returns to `target` until it returns b''; (bytes, md5 hex). A read that
    raises becomes ReadFailed (with the bytes so far); a write that fails, a FetchError; more than
    `room` bytes (what --max-bytes `limit` leaves), a FetchError before the volume fills."""
    digest, received = hashlib.md5(usedforsecurity=False), 0
    try:
        out = open(target, "wb")
    except OSError as exc:
        raise FetchError(local_error(uri, target, exc)) from None
    with out:
        while True:
            clock.check()
            try:
                chunk = read()
            except Exception as exc:  # noqa: BLE001 - classified by the caller
                raise ReadFailed(exc, received) from None
            if not chunk:
                break
            try:
                out.write(chunk)
            except OSError as exc:
                raise FetchError(local_error(uri, target, exc)) from None
            digest.update(chunk)
            received += len(chunk)
            if room is not None and received > room:
                raise over_size(uri, (limit or 0) - room + received, limit or 0)
        try:
            out.flush()
            os.fsync(out.fileno())
        except OSError as exc:
            raise FetchError(local_error(uri, target, exc)) from None
    return received, digest.hexdigest()


def check_digest(uri: str, what: str, expected: str | None, actual: str, progress: Progress) -> None:
    if expected is None:
        progress.unverified.append(what)
        return
    if expected != actual:
        raise Transient(f"{uri}: {what} arrived with MD5 {actual} but the store says {expected}: "
                        "the download was cut or corrupted")
    progress.verified += 1


def _room(limits: Limits, progress: Progress) -> tuple[int | None, int | None]:
    """(bytes the next file may still take under --max-bytes, the limit)."""
    if limits.max_bytes is None:
        return None, None
    return max(0, limits.max_bytes - progress.bytes), limits.max_bytes


def with_retries(limits: Limits, clock: Clock, once: Callable[[], None]) -> None:
    """`once()` again after a Transient failure, with back-off, up to limits.attempts, inside the deadline."""
    for attempt in range(1, limits.attempts + 1):
        try:
            once()
            return
        except Transient as exc:
            if attempt == limits.attempts:
                raise FetchError(f"{exc} (after {attempt} attempts, {clock.elapsed():.0f} s in all): retry later, "
                                 "or check the store") from None
            if backoff_s(attempt) >= clock.remaining():
                raise FetchError(f"{exc} (attempt {attempt}; the {limits.deadline_s:g} s deadline, --deadline-s or "
                                 f"{DEADLINE_FIELD}, leaves no time for another): check the store") from None
            time.sleep(backoff_s(attempt))


# --- fetchers: each writes into `root`, a fresh staging directory --------------------------------

def _fetch_file(uri: str, src: Path, root: Path, file_dest: str | None, progress: Progress) -> None:
    if src.is_symlink() and not src.exists():
        raise FetchError(f"{uri}: {src} is a symlink to {os.readlink(src)}, which does not exist: fix the link")
    if not src.exists():
        raise FetchError(f"{uri}: {src} does not exist on this node: check the path")
    if src.is_dir():
        if file_dest:
            raise FetchError(f"{uri} is a directory but --dest names a file ({file_dest})")
        for entry in sorted(src.rglob("*")):
            if entry.is_symlink() and not entry.exists():
                raise FetchError(f"{uri}: {entry.relative_to(src)} is a symlink to {os.readlink(entry)}, which "
                                 "does not exist: fix or remove the link")
        progress.activity = f"copying {src}"
        try:
            shutil.copytree(src, root, dirs_exist_ok=True)
        except shutil.Error as exc:
            first = exc.args[0][0] if exc.args and exc.args[0] else ("", "", str(exc))
            raise FetchError(f"{uri}: cannot copy {first[0]} ({first[2]}): check the source's files") from None
    else:
        progress.activity = f"copying {src}"
        target = root / (file_dest or src.name)
        try:
            shutil.copy2(src, target)
        except PermissionError as exc:
            if os.access(src, os.R_OK):
                raise FetchError(local_error(uri, target, exc)) from None
            raise FetchError(f"{uri}: cannot read {src} (permission denied): make it readable by the fetcher") from None
    progress.files = sum(1 for p in root.rglob("*") if p.is_file())


def _fetch_http(uri: str, root: Path, file_dest: str | None, limits: Limits, clock: Clock,
                progress: Progress) -> None:
    name = file_dest or PurePosixPath(unquote(urlparse(uri).path)).name
    if not name:
        raise FetchError(f"{uri}: the URL names no file: point it at the artifact (e.g. .../model.onnx)")
    target = root / safe_relative(name, uri)
    with_retries(limits, clock, lambda: _http_once(uri, name, target, limits, clock, progress))
    progress.files = 1


def _http_once(uri: str, name: str, target: Path, limits: Limits, clock: Clock, progress: Progress) -> None:
    progress.activity = f"connecting for {name}"
    request = urllib.request.Request(uri, headers={"User-Agent": "rankops-fetch-model"})
    try:
        response = urllib.request.urlopen(request, timeout=limits.first_byte)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code in (404, 410):
            raise FetchError(f"{uri}: not found ({exc.code}): check the URL") from None
        if exc.code in (401, 403):
            raise FetchError(f"{uri}: refused ({exc.code}): the URL needs credentials, or a presigned URL "
                             "has expired: use a fresh one, or s3:// with modelCredentialsSecret") from None
        reason = flat(str(exc.reason))
        if 300 <= exc.code < 400:
            # urllib gives up on a loop, or after 10 hops, with a three-line reason.
            where_to = flat(str(exc.headers.get("Location", "") if exc.headers else ""))[:200]
            if "infinite loop" in reason:
                raise FetchError(f"{uri}: the server redirects in a loop or more than {REDIRECTS_MAX} times "
                                 f"(last: {exc.code} to {where_to or 'nowhere'}): point the URI at the artifact's "
                                 "final URL") from None
            raise FetchError(f"{uri}: the server answered {exc.code} {reason} without a redirect to follow: "
                             "point the URI at the artifact's final URL") from None
        if exc.code in RETRY_HTTP:
            raise Transient(f"{uri}: the server answered {exc.code} {reason}") from None
        raise FetchError(f"{uri}: the server answered {exc.code} {reason}: check the URL") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise Transient(f"{uri}: no answer within {limits.first_byte:g} s (--first-byte-s; {FIRST_BYTE_FIELD})") from None
        raise Transient(f"{uri}: cannot download ({reason}): check the URL and that the pod can reach it") from None
    with response:
        body_timeout(getattr(getattr(response, "fp", None), "raw", None), "_sock", limits.stall_s)
        expected = response.length          # from Content-Length; None when chunked or absent
        chunked = bool(getattr(response, "chunked", False))
        md5 = md5_from_headers(response.headers)
        progress.activity = f"downloading {name}"
        try:
            received, actual = copy_stream(uri, lambda: response.read1(CHUNK), target, clock,
                                           *_room(limits, progress))
        except ReadFailed as failed:
            cause, got = failed.cause, failed.received
            if isinstance(cause, (socket.timeout, TimeoutError)):
                raise Transient(f"{uri}: stalled: no byte for {limits.stall_s:g} s after {got} bytes of {name} "
                                f"(--stall-s; {STALL_FIELD})") from None
            if chunked:
                raise Transient(f"{uri}: the chunked body of {name} ended before its last chunk after {got} bytes: "
                                "the connection dropped") from None
            if isinstance(cause, http.client.IncompleteRead) and expected is not None:
                raise truncated(uri, name, got, expected) from None
            raise Transient(f"{uri}: download of {name} broke after {got} bytes ({cause or type(cause).__name__})") from None
    if expected is not None and received != expected:
        raise truncated(uri, name, received, expected)
    if expected is None and not chunked and md5 is None:
        # Close-delimited: the end of the body and a dropped connection look the same.
        progress.unverified.append(f"{name} (no length, no checksum)")
    else:
        check_digest(uri, name, md5, actual, progress)
    progress.bytes += received


def _bucket_client(uri: str, scheme: str, limits: Limits) -> Any:
    """The boto3 client; every way of failing to build one is a FetchError naming the setting."""
    problem = env_problem(scheme, os.environ)
    if problem:
        raise FetchError(f"{uri}: {problem}")
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        settings = client_settings(scheme, os.environ)
        # read_timeout bounds each request until its first byte (and a listing page's body);
        # a GetObject body gets --stall-s once its headers are in (body_timeout).
        config = Config(**settings.pop("config"), connect_timeout=min(10.0, limits.first_byte),
                        read_timeout=limits.first_byte,
                        retries={"mode": "standard", "max_attempts": limits.attempts})
        session = boto3.session.Session()
        if session.get_credentials() is None:
            config = config.merge(Config(signature_version=UNSIGNED))
        return session.client("s3", config=config, **settings)
    except Exception as exc:  # noqa: BLE001 - botocore raises ValueError, its own errors, KeyError...
        raise FetchError(f"{uri}: cannot set up the S3 client ({type(exc).__name__}: {exc}): check "
                         f"AWS_ENDPOINT_URL, AWS_DEFAULT_REGION and the keys in {SECRET}") from None


def _list(s3: Any, uri: str, scheme: str, bucket: str, prefix: str, limits: Limits,
          progress: Progress) -> list[tuple[str, int]]:
    """(key, size) of every object under `prefix`, within --max-objects, --max-listing-pages and
    --max-listing-bytes (each a FetchError naming the URI and the bound)."""
    def bound(flag: str, given: int | None) -> str:
        return f"{flag}" if given is not None else f"{flag}, from --max-objects {limits.max_objects}"

    received = 0

    def count(operation_model: Any, response_dict: Mapping[str, Any], **_: Any) -> None:
        # Every listing answer's body, before it is parsed (botocore has read it whole by then).
        nonlocal received
        received += len(response_dict.get("body") or b"")
        if received > limits.listing_bytes:
            raise FetchError(f"{uri}: the listing sent more than {limits.listing_bytes} bytes "
                             f"({bound('--max-listing-bytes', limits.max_listing_bytes)}) while {progress.activity}: "
                             "the store pads its pages or the prefix holds too much; check AWS_ENDPOINT_URL, "
                             "or point the URI at the model's own directory")

    # gs:// lists with V1, which Cloud Storage's XML API has always served.
    operation = "list_objects" if scheme == "gs" else "list_objects_v2"
    event = f"before-parse.s3.{'ListObjects' if scheme == 'gs' else 'ListObjectsV2'}"
    s3.meta.events.register(event, count, unique_id="rankops-listing-bytes")
    pages = s3.get_paginator(operation).paginate(Bucket=bucket, Prefix=prefix.rstrip("/"))
    listed: list[tuple[str, int]] = []
    progress.activity = "listing (page 1)"
    try:
        for number, page in enumerate(pages, 1):
            if "IsTruncated" not in page and "Name" not in page:
                raise ResponseNotS3(page)
            for item in page.get("Contents", []):
                listed.append((str(item["Key"]), int(item.get("Size", 0))))
            if len(listed) > limits.max_objects:
                raise FetchError(f"{uri}: more than {limits.max_objects} objects under this prefix (--max-objects): "
                                 "point the URI at the model's own directory")
            if number >= limits.pages and page.get("IsTruncated"):
                raise FetchError(f"{uri}: the listing went on past {limits.pages} pages "
                                 f"({bound('--max-listing-pages', limits.max_pages)}) with {len(listed)} objects: "
                                 "the store keeps paging; check AWS_ENDPOINT_URL, or point the URI at the "
                                 "model's own directory")
            progress.activity = f"listing (page {number + 1}, {len(listed)} objects so far)"
    finally:
        s3.meta.events.unregister(event, unique_id="rankops-listing-bytes")
    return listed


def _fetch_bucket(uri: str, source: Source, root: Path, file_dest: str | None, limits: Limits,
                  clock: Clock, progress: Progress) -> None:
    from botocore.exceptions import (BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError,
                                     PaginationError, ReadTimeoutError)
    from botocore.parsers import ResponseParserError

    s3 = _bucket_client(uri, source.scheme, limits)
    endpoint = s3.meta.endpoint_url
    try:
        listed = _list(s3, uri, source.scheme, source.bucket, source.key, limits, progress)
        plan = object_plan(uri, source.key, listed)
        if not plan:
            raise FetchError(f"{uri}: no object at this key or under this prefix at {endpoint}: "
                             "check the URI, or upload the artifact there")
        if file_dest and len(plan) > 1:
            raise FetchError(f"{uri} holds {len(plan)} objects but --dest names one file ({file_dest}): "
                             "point the URI at the file")
        listed_bytes = sum(size for _, _, size in plan)
        if limits.max_bytes is not None and listed_bytes > limits.max_bytes:   # said before a byte is copied
            raise over_size(uri, listed_bytes, limits.max_bytes)
        for key, rel, size in plan:
            target = root / (file_dest or rel)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise FetchError(local_error(uri, target.parent, exc)) from None

            def once(key: str = key, target: Path = target, size: int = size) -> None:
                progress.activity = f"downloading {key}"
                response = s3.get_object(Bucket=source.bucket, Key=key)
                body = response["Body"]
                body_timeout(getattr(getattr(body, "_raw_stream", None), "_connection", None), "sock", limits.stall_s)
                try:
                    received, actual = copy_stream(uri, lambda: body.read(CHUNK), target, clock,
                                                   *_room(limits, progress))
                except ReadFailed as failed:
                    if isinstance(failed.cause, ReadTimeoutError):
                        raise Transient(f"{uri}: stalled: no byte for {limits.stall_s:g} s after {failed.received} "
                                        f"bytes of {key} (--stall-s; {STALL_FIELD})") from None
                    raise truncated(uri, key, failed.received, size) from None
                finally:
                    body.close()
                if received != size:
                    raise truncated(uri, key, received, size)
                check_digest(uri, key, s3_md5(response), actual, progress)
                progress.bytes += received

            with_retries(limits, clock, once)
            progress.files += 1
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        raise FetchError(explain_client_error(uri, str(error.get("Code", status)), status, endpoint,
                                              str(error.get("Message", "")).replace("\n", " ")[:200])) from None
    except (EndpointConnectionError, ConnectTimeoutError) as exc:
        raise FetchError(f"{uri}: cannot reach {endpoint} ({exc}): check AWS_ENDPOINT_URL in {SECRET} "
                         "and that the pod can reach it") from None
    except ReadTimeoutError:
        raise FetchError(f"{uri}: {endpoint} sent no byte for {limits.first_byte:g} s at each of {limits.attempts} "
                         f"attempts while {progress.activity} ({clock.elapsed():.0f} s in all; --first-byte-s, "
                         f"{FIRST_BYTE_FIELD}): the store is down or hung; check it and AWS_ENDPOINT_URL in "
                         f"{SECRET}") from None
    except (ResponseParserError, ResponseNotS3):
        raise FetchError(f"{uri}: {endpoint} answered with something that is not S3's XML while "
                         f"{progress.activity}: check that AWS_ENDPOINT_URL in {SECRET} points at an S3 API, "
                         "not a web page or proxy") from None
    except PaginationError as exc:
        raise FetchError(f"{uri}: {endpoint} broke its listing ({exc}): check the store") from None
    except BotoCoreError as exc:
        raise FetchError(f"{uri}: download from {endpoint} failed while {progress.activity} ({exc}): "
                         "retry, or check the Secret") from None


# --- versions on disk ----------------------------------------------------------------------------

def _hidden(dest: Path, kind: str) -> str:
    return f".{dest.name}.{kind}-"


@contextlib.contextmanager
def dest_lock(dest: Path, uri: str, clock: Clock) -> Iterator[None]:
    """One fetch into DEST at a time: a second waits for the first, up to its own deadline."""
    lock_path = dest.parent / f".{dest.name}.lock"
    try:
        handle = open(lock_path, "a")
    except OSError as exc:
        raise FetchError(local_error(uri, lock_path, exc)) from None
    with handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock.remaining() <= 0.2:
                    raise FetchError(f"{uri}: another rankops fetch-model into {dest} held {lock_path} for the "
                                     "whole deadline: let it finish, or stop it") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def live_version(dest: Path) -> Path | None:
    """The version directory DEST's symlink points to, when it is one of ours and exists."""
    if not dest.is_symlink():
        return None
    target = os.readlink(dest)
    if "/" in target or not target.startswith(_hidden(dest, "v")):
        return None
    path = dest.parent / target
    return path if path.is_dir() else None


def tidy(dest: Path, keep: Path | None) -> None:
    """Remove staging, temporary links and versions other than `keep` (under the lock). Links go first
    so none is left pointing at a removed version (Triton fails on a dangling entry)."""
    for pattern in ("link", "partial"):
        for stale in dest.parent.glob(_hidden(dest, pattern) + "*"):
            if stale.is_symlink() or stale.is_file():
                stale.unlink(missing_ok=True)
            else:
                shutil.rmtree(stale, ignore_errors=True)
    for version in dest.parent.glob(_hidden(dest, "v") + "*"):
        if keep is None or version.name != keep.name:
            shutil.rmtree(version, ignore_errors=True)


def recover(dest: Path) -> None:
    """A run killed mid-migration (see `switch`) can leave DEST missing and its version parked:
    point DEST at the newest complete version again before anything is removed."""
    if dest.exists() or live_version(dest):
        return
    versions = sorted(dest.parent.glob(_hidden(dest, "v") + "*"), key=lambda p: p.stat().st_mtime)
    if versions:
        _point(dest, versions[-1])


def _point(dest: Path, version: Path) -> None:
    """DEST -> version in one rename of a fresh symlink over it (atomic for every reader)."""
    link = dest.parent / f"{_hidden(dest, 'link')}{version.name}"
    link.unlink(missing_ok=True)
    os.symlink(version.name, link)
    os.replace(link, dest)


@contextlib.contextmanager
def no_sigterm() -> Iterator[None]:
    """Hold SIGTERM back for a few renames: it lands after them, and the message says which side it is."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def switch(staging: Path, dest: Path, file_dest: bool, uri: str, progress: Progress) -> None:
    """Put the complete staging in place in one atomic step; the previous version is removed after."""
    with no_sigterm():
        try:
            if file_dest:
                os.replace(staging / dest.name, dest)
                staging.rmdir()
                progress.switched = True
                return
            version = staging.with_name(_hidden(dest, "v") + staging.name.rsplit("-", 1)[-1])
            os.rename(staging, version)                 # complete: a version from here on
            if dest.is_symlink() or not dest.exists():
                _point(dest, version)
            else:
                # A real directory (an older fetcher's): park it as a version, then switch. Killed
                # between the two, `recover` points DEST at the newest version again.
                parked = dest.with_name(_hidden(dest, "v") + "previous")
                shutil.rmtree(parked, ignore_errors=True)
                os.rename(dest, parked)
                try:
                    _point(dest, version)
                except BaseException:
                    os.rename(parked, dest)
                    raise
            progress.switched = True
        except OSError as exc:
            raise FetchError(local_error(uri, dest, exc)) from None
    if not file_dest:
        tidy(dest, live_version(dest))


def fetch(uri: str, dest: Path, expect: str | None = None, limits: Limits = Limits(),
          progress: Progress | None = None, sha256: str | None = None) -> Progress:
    """Fetch `uri` to `dest` completely or not at all (FetchError; DEST as it was). With `sha256`,
    the file `expect` names (or the artifact's one file) must have that digest."""
    progress = progress or Progress()
    source = parse_uri(uri)
    expected = check_expect(expect, uri)
    sha256 = check_sha256(sha256, uri)
    dest = check_dest(str(dest), uri)
    file_dest = dest.name if is_file_dest(dest) else None
    if file_dest and dest.is_dir() and not dest.is_symlink():
        raise FetchError(f"{uri}: --dest {dest} is a directory but its suffix names a file: remove it, "
                         "or give the file's path")
    if not file_dest and dest.exists() and not dest.is_dir():
        raise FetchError(f"{uri}: --dest {dest} is a file but a directory is needed: remove it, "
                         "or give another --dest")
    clock = Clock(limits)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(local_error(uri, dest.parent, exc)) from None
    try:
        with alarm(limits.deadline_s) as disarm, dest_lock(dest, uri, clock):
            if not file_dest:
                recover(dest)
            progress.dest_had_version = dest.exists()
            tidy(dest, None if file_dest else live_version(dest))
            try:
                staging = Path(tempfile.mkdtemp(prefix=_hidden(dest, "partial"), dir=dest.parent))
            except OSError as exc:
                raise FetchError(local_error(uri, dest.parent, exc)) from None
            try:
                staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from Triton's user
                if source.scheme == "file":
                    _fetch_file(uri, Path(source.path), staging, file_dest, progress)
                elif source.scheme in ("http", "https"):
                    _fetch_http(uri, staging, file_dest, limits, clock, progress)
                else:
                    _fetch_bucket(uri, source, staging, file_dest, limits, clock, progress)
                if expected and (staging / expected).is_dir():
                    raise FetchError(f"{uri}: {expected} (--expect) is a directory in the artifact, not a file: "
                                     f"Triton loads <version dir>/{expected} as one file")
                if expected and not (staging / expected).is_file():
                    found = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())[:5]
                    raise FetchError(f"{uri} has no {expected} (--expect; found: {', '.join(found) or 'nothing'}): Triton "
                                     f"loads <version dir>/{expected}; put it at {uri.rstrip('/')}/{expected}")
                if sha256:
                    verify_sha256(uri, staging, dest, expected, sha256, clock, progress)
                clock.check()
                disarm()   # complete: the switch and the tidying are not cut short
                progress.activity = "switching to the new version"
                switch(staging, dest, bool(file_dest), uri, progress)
            finally:
                disarm()
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
    except DeadlineExceeded:
        raise FetchError(deadline_message(uri, limits, progress, dest)) from None
    return progress
