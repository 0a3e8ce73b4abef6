"""`rankops fetch-model`: copy a model artifact into Triton's model repository (init container).

file:// and https:// work with the standard library; s3:// needs boto3 and gs:// needs
google-cloud-storage (both in the operator image). Credentials come from the environment.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import urllib.request
from urllib.parse import urlparse


class FetchError(Exception):
    pass


def _fetch_file(src: pathlib.Path, dest: pathlib.Path) -> None:
    if not src.exists():
        raise FetchError(f"{src} does not exist")
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def _fetch_s3(bucket: str, prefix: str, dest: pathlib.Path) -> None:
    try:
        import boto3
    except ImportError as exc:
        raise FetchError("s3:// needs boto3 (pip install boto3)") from exc
    s3 = boto3.client("s3")
    found = False
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix):].lstrip("/") or pathlib.Path(item["Key"]).name
            target = dest / rel if not dest.suffix else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target))
            found = True
    if not found:
        raise FetchError(f"nothing under s3://{bucket}/{prefix}")


def _fetch_gs(bucket: str, prefix: str, dest: pathlib.Path) -> None:
    try:
        from google.cloud import storage
    except ImportError as exc:
        raise FetchError("gs:// needs google-cloud-storage (pip install google-cloud-storage)") from exc
    blobs = list(storage.Client().list_blobs(bucket, prefix=prefix))
    if not blobs:
        raise FetchError(f"nothing under gs://{bucket}/{prefix}")
    for blob in blobs:
        rel = blob.name[len(prefix):].lstrip("/") or pathlib.Path(blob.name).name
        target = dest / rel if not dest.suffix else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))


def fetch(uri: str, dest: pathlib.Path) -> None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        _fetch_file(pathlib.Path(parsed.path), dest)
    elif parsed.scheme in ("http", "https"):
        target = dest / pathlib.Path(parsed.path).name if not dest.suffix else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(uri, timeout=60) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out)
    elif parsed.scheme == "s3":
        _fetch_s3(parsed.netloc, parsed.path.lstrip("/"), dest)
    elif parsed.scheme == "gs":
        _fetch_gs(parsed.netloc, parsed.path.lstrip("/"), dest)
    else:
        raise FetchError(f"unsupported URI scheme {parsed.scheme!r} (file, https, s3, gs)")


def cmd_fetch(args: argparse.Namespace) -> int:
    dest = pathlib.Path(args.dest)
    try:
        fetch(args.uri, dest)
        if args.expect and not (dest / args.expect).exists():
            raise FetchError(f"{args.uri} has no {args.expect}: Triton loads <version dir>/{args.expect}")
    except (FetchError, OSError) as exc:
        print(f"rankops fetch-model: {exc}", file=sys.stderr)
        return 1
    print(f"fetched {args.uri} -> {dest}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch-model", help="copy a model artifact into the model repository (init container)")
    p.add_argument("--uri", required=True,
                   help="where the artifact is: file://, https://, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    p.add_argument("--dest", required=True,
                   help="the directory (or, with a file suffix, the file) to copy it to, e.g. /models/NAME/1")
    p.add_argument("--expect", help="file that must exist in DEST afterwards, e.g. model.onnx")
    p.set_defaults(func=cmd_fetch)
