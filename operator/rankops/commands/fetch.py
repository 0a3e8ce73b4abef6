"""`rankops fetch-model`: copy a model artifact into Triton's model repository (init container).

It runs as the `fetch-model` init container of every Triton pod (render/serving.py) and as
`fetch-reference` in the equivalence gate's Job (rollout/jobs.py). s3:// goes through boto3 with
the standard AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for
MinIO/Ceph/other S3-compatible stores, AWS_DEFAULT_REGION), which the RankingModel's
`modelCredentialsSecret` provides; without credentials it asks anonymously (public buckets).
gs:// goes through Cloud Storage's S3-compatible XML API at storage.googleapis.com with HMAC keys
in the same two AWS_* variables. http(s):// and file:// use the standard library.

Everything lands in a hidden sibling of DEST first and is renamed into place only when complete
(every object at its listed size, and --expect present): a failed, interrupted or killed fetch
never leaves a half-written model directory for Triton to load; the next run removes what a
killed one left.
"""
from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping
from urllib.parse import unquote, urlparse

GCS_XML_ENDPOINT = "https://storage.googleapis.com"
SECRET = "the Secret named by the RankingModel's spec.modelCredentialsSecret"
CHUNK = 1 << 20


class FetchError(Exception):
    """What went wrong, on one line, naming the URI and the fix."""


class Interrupted(BaseException):
    """SIGTERM (the pod is being deleted): unwinds like Ctrl-C so the staging directory is removed."""


# --- pure helpers -------------------------------------------------------------------------------

def is_file_dest(dest: Path) -> bool:
    """A DEST with a suffix (/reference/model.pt) is a file; otherwise a directory (/models/m/1)."""
    return bool(dest.suffix)


def safe_relative(rel: str, uri: str) -> PurePosixPath:
    """An object's path below DEST; refuses keys that would write outside it (the URI is tenant input)."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise FetchError(f"{uri}: object key part {rel!r} would land outside --dest: rename the object")
    return path


def object_plan(uri: str, prefix: str, objects: Iterable[tuple[str, int]]) -> list[tuple[str, PurePosixPath, int]]:
    """(key, path below DEST, size) for each listed object that is the URI itself or below it as a
    directory: s3://b/m/3 takes m/3 and m/3/..., never m/30/...; directory markers are skipped."""
    base = prefix.rstrip("/")
    plan = []
    for key, size in objects:
        if key.endswith("/"):
            continue
        if key == base:
            plan.append((key, safe_relative(PurePosixPath(key).name, uri), size))
        elif not base or key.startswith(base + "/"):
            plan.append((key, safe_relative(key[len(base):].lstrip("/"), uri), size))
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
    return f"{uri}: {endpoint} answered {status} {code}{': ' + detail if detail else ''}"


def truncated(uri: str, what: str, received: int, expected: int) -> FetchError:
    return FetchError(f"{uri}: download of {what} truncated ({received} of {expected} bytes): "
                      "the connection dropped; retry (the init container restarts)")


# --- fetchers: each writes into `root`, a fresh staging directory --------------------------------

def _fetch_file(uri: str, src: Path, root: Path, file_dest: str | None) -> None:
    if not src.exists():
        raise FetchError(f"{uri}: {src} does not exist on this node: check the path")
    if src.is_dir():
        if file_dest:
            raise FetchError(f"{uri} is a directory but --dest names a file ({file_dest})")
        shutil.copytree(src, root, dirs_exist_ok=True)
    else:
        shutil.copy2(src, root / (file_dest or src.name))


def _fetch_http(uri: str, root: Path, file_dest: str | None) -> None:
    name = file_dest or PurePosixPath(unquote(urlparse(uri).path)).name
    if not name:
        raise FetchError(f"{uri}: the URL names no file: point it at the artifact (e.g. .../model.onnx)")
    target = root / safe_relative(name, uri)
    received = 0
    request = urllib.request.Request(uri, headers={"User-Agent": "rankops-fetch-model"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response, open(target, "wb") as out:
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            while chunk := response.read1(CHUNK):  # as it arrives, not 1 MiB at a time
                out.write(chunk)
                received += len(chunk)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            raise FetchError(f"{uri}: not found ({exc.code}): check the URL") from None
        if exc.code in (401, 403):
            raise FetchError(f"{uri}: refused ({exc.code}): the URL needs credentials, or a presigned URL "
                             "has expired: use a fresh one, or s3:// with modelCredentialsSecret") from None
        raise FetchError(f"{uri}: the server answered {exc.code} {exc.reason}") from None
    except http.client.IncompleteRead as exc:
        got = received + len(exc.partial)
        raise truncated(uri, name, got, got + (exc.expected or 0)) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"{uri}: download failed after {received} bytes ({reason}): check the URL "
                         "and that the pod can reach it") from None
    if expected is not None and received != expected:
        raise truncated(uri, name, received, expected)


def _bucket_client(scheme: str) -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    settings = client_settings(scheme, os.environ)
    config = Config(**settings.pop("config"))
    session = boto3.session.Session()
    if session.get_credentials() is None:
        config = config.merge(Config(signature_version=UNSIGNED))
    return session.client("s3", config=config, **settings)


def _fetch_bucket(uri: str, scheme: str, bucket: str, prefix: str, root: Path, file_dest: str | None) -> None:
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

    s3 = _bucket_client(scheme)
    endpoint = s3.meta.endpoint_url
    try:
        # gs:// lists with V1, which Cloud Storage's XML API has always served.
        pages = s3.get_paginator("list_objects" if scheme == "gs" else "list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix.rstrip("/"))
        listed = [(item["Key"], item["Size"]) for page in pages for item in page.get("Contents", [])]
        plan = object_plan(uri, prefix, listed)
        if not plan:
            raise FetchError(f"{uri}: no object at this key or under this prefix at {endpoint}: "
                             "check the URI, or upload the artifact there")
        if file_dest and len(plan) > 1:
            raise FetchError(f"{uri} holds {len(plan)} objects but --dest names one file ({file_dest}): "
                             "point the URI at the file")
        for key, rel, size in plan:
            target = root / (file_dest or rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(target))
            if target.stat().st_size != size:
                raise truncated(uri, key, target.stat().st_size, size)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        raise FetchError(explain_client_error(uri, str(error.get("Code", status)), status, endpoint,
                                              str(error.get("Message", "")).replace("\n", " "))) from None
    except EndpointConnectionError as exc:
        raise FetchError(f"{uri}: cannot reach {endpoint} ({exc}): check AWS_ENDPOINT_URL in {SECRET} "
                         "and that the pod can reach it") from None
    except BotoCoreError as exc:
        raise FetchError(f"{uri}: download from {endpoint} failed ({exc}): retry, or check the Secret") from None


# --- staging and the command ----------------------------------------------------------------------

def _staging_prefix(dest: Path) -> str:
    return f".{dest.name}.partial-"


def _remove_leftovers(dest: Path) -> None:
    """What a killed run (OOMKilled, SIGKILL) left beside DEST."""
    for stale in dest.parent.glob(_staging_prefix(dest) + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _move_into_place(staging: Path, dest: Path, file_dest: bool) -> None:
    if file_dest:
        os.replace(staging / dest.name, dest)
        staging.rmdir()
        return
    if dest.exists():
        # A re-run over a complete directory: swap, so DEST is never a mix of two fetches.
        old = Path(tempfile.mkdtemp(prefix=_staging_prefix(dest), dir=dest.parent))
        os.rename(dest, old / dest.name)
        os.rename(staging, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, dest)


def fetch(uri: str, dest: Path, expect: str | None = None) -> None:
    """Fetch `uri` to `dest` completely or not at all (FetchError, DEST untouched)."""
    parsed = urlparse(uri)
    file_dest = dest.name if is_file_dest(dest) else None
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(dest), dir=dest.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from Triton's user
        if parsed.scheme == "file":
            _fetch_file(uri, Path(unquote(parsed.path)), staging, file_dest)
        elif parsed.scheme in ("http", "https"):
            _fetch_http(uri, staging, file_dest)
        elif parsed.scheme in ("s3", "gs"):
            if not parsed.netloc:
                raise FetchError(f"{uri}: no bucket: write {parsed.scheme}://BUCKET/PATH")
            _fetch_bucket(uri, parsed.scheme, parsed.netloc, unquote(parsed.path).lstrip("/"), staging, file_dest)
        else:
            raise FetchError(f"{uri}: unsupported scheme {parsed.scheme!r}: use s3://, gs://, https:// or file://")
        if expect and not (staging / expect).is_file():
            found = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())[:5]
            raise FetchError(f"{uri} has no {expect} (found: {', '.join(found) or 'nothing'}): Triton loads "
                             f"<version dir>/{expect}; put it at {uri.rstrip('/')}/{expect}")
        _move_into_place(staging, dest, bool(file_dest))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


def cmd_fetch(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        fetch(args.uri, dest, args.expect)
    except (FetchError, OSError) as exc:
        print(f"rankops fetch-model: {exc}", file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt):
        print(f"rankops fetch-model: {args.uri}: interrupted; nothing was left at {dest}", file=sys.stderr)
        return 143
    print(f"fetched {args.uri} -> {dest}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch-model", help="copy a model artifact into the model repository (init container)")
    p.add_argument("--uri", required=True,
                   help="where the artifact is: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, https://.../FILE or file:///PATH")
    p.add_argument("--dest", required=True,
                   help="the directory (or, with a file suffix, the file) to copy it to, e.g. /models/NAME/1")
    p.add_argument("--expect", help="file that must exist in DEST afterwards, e.g. model.onnx")
    p.set_defaults(func=cmd_fetch)
