"""A real S3-compatible object store for the local cluster, e2e and tests: moto's standalone server.

Test harness, not part of the operator. The server is a separate process (`python -m moto.server`,
from the `moto[server]` test extra, or, where that is not installed (the demo's `pip install -e .`),
from a virtualenv of its own made once under ~/.cache/rankops) bound on the caller's loopback
address, logging to a file.
Credentials are enforced: moto serves its first INITIAL_NO_AUTH_ACTION_COUNT requests without
checking them, which `start()` spends creating one IAM user, its access key and an allow-all
policy; every later request must be signed with that key. `start()` then checks that the server
really refuses an unknown key and a wrong secret and accepts the right pair, so a store that does
not check credentials is a startup failure, not a test that passes for the wrong reason.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .controlplane import _die_with_parent, tail, terminate
from .netns import connect_inside
from .netns import enter_command as netns_enter_command
from .ports import free_port

REGION = "us-east-1"
USER = "rankops-models"
# create_user, create_access_key, put_user_policy: the requests served before credentials count.
SETUP_ACTIONS = 3
ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


MOTO = "moto[server]==5.2.5"


class ObjectStoreError(RuntimeError):
    """The server could not be started or does not check credentials; the message has its log."""


def server_python() -> str:
    """An interpreter that has moto's server: ours, or a cached virtualenv installed on first use."""
    import importlib.util

    if importlib.util.find_spec("moto") and importlib.util.find_spec("flask"):
        return sys.executable
    base = Path(os.environ.get("RANKOPS_CACHE") or Path.home() / ".cache" / "rankops")
    venv = base / "objectstore" / MOTO.split("==")[-1]
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        print(f"[object-store] installing {MOTO} into {venv} (once per machine)", file=sys.stderr, flush=True)
        for command in ([sys.executable, "-m", "venv", str(venv)],
                        [str(python), "-m", "pip", "install", "--quiet", MOTO]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise ObjectStoreError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        (venv / ".installed").touch()
    return str(python)



class ObjectStore:
    """`with ObjectStore(workdir) as store:` a running server; `store.endpoint` and its credentials."""

    def __init__(self, workdir: Path | str, host: str = "127.0.0.1", port: int | None = None,
                 *, netns: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.port = port
        # In a network namespace the dev cluster made (a real node's pods reach `host` there),
        # this process reaches it through a forwarder on its own loopback.
        self.netns = netns
        self._forwarder: Any = None
        self.log_path = self.workdir / "objectstore.log"
        self.region = REGION
        self.access_key = ""
        self.secret_key = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The address pods and fetchers use (inside the namespace when there is one)."""
        return f"http://{self.host}:{self.port}"

    @property
    def _local(self) -> tuple[str, int]:
        """Where this process connects: the server, or the forwarder to it."""
        assert self.port is not None
        return ("127.0.0.1", self._forwarder.port) if self._forwarder else (self.host, self.port)

    def start(self, timeout: float = 60.0) -> ObjectStore:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port("127.0.0.1" if self.netns else self.host)
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)}
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            env.pop(name, None)
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [*(netns_enter_command(self.netns) if self.netns else []),
                 server_python(), "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent)
        if self.netns:
            from .netns import Forwarder

            self._forwarder = Forwarder(self.netns, 0, (self.host, self.port))
        try:
            self._wait_listening(time.monotonic() + timeout)
            self._create_credentials()
            self._check_credentials_enforced()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        terminate(process, timeout)
        if self._forwarder:
            self._forwarder.close()
            self._forwarder = None

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def _fail(self, what: str) -> ObjectStoreError:
        return ObjectStoreError(f"object store at {self.endpoint}: {what}; "
                                f"last lines of {self.log_path}:\n{self.log_tail()}")

    def _wait_listening(self, deadline: float) -> None:
        # A plain TCP connect: any HTTP request would spend one of the unauthenticated actions.
        while True:
            if self._process is None or self._process.poll() is not None:
                code = None if self._process is None else self._process.returncode
                raise self._fail(f"server exited with {code} before listening (is moto[server] installed?)")
            try:
                # In a namespace, dial the server itself: the forwarder accepts before it does.
                with (connect_inside(self.netns, (self.host, self.port), timeout=1) if self.netns
                      else socket.create_connection(self._local, timeout=1)):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise self._fail("server did not listen in time")
            time.sleep(0.2)

    def _create_credentials(self) -> None:
        iam = self._client("iam", "setup", "setup")
        iam.create_user(UserName=USER)
        key = iam.create_access_key(UserName=USER)["AccessKey"]
        iam.put_user_policy(UserName=USER, PolicyName="allow-all", PolicyDocument=json.dumps(ALLOW_ALL))
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def _check_credentials_enforced(self) -> None:
        from botocore.exceptions import ClientError

        for key, secret, code in (("AKIANOTAREALKEY00000", self.secret_key, "InvalidAccessKeyId"),
                                  (self.access_key, self.secret_key + "x", "SignatureDoesNotMatch")):
            try:
                self._client("s3", key, secret).list_buckets()
            except ClientError as exc:
                if exc.response["Error"]["Code"] != code:
                    raise self._fail(f"refused bad credentials with {exc.response['Error']['Code']}, "
                                     f"expected {code}") from exc
            else:
                raise self._fail(f"accepted bad credentials (expected {code}): authentication is not enforced")
        try:
            self.client().list_buckets()
        except ClientError as exc:
            raise self._fail(f"refused its own credentials: {exc}") from exc

    def _client(self, service: str, key: str, secret: str) -> Any:
        import boto3

        return boto3.session.Session().client(
            service, endpoint_url="http://%s:%d" % self._local, region_name=self.region,
            aws_access_key_id=key, aws_secret_access_key=secret)

    def client(self) -> Any:
        """A boto3 S3 client with this store's credentials."""
        return self._client("s3", self.access_key, self.secret_key)

    def ensure_bucket(self, bucket: str) -> None:
        s3 = self.client()
        if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
            s3.create_bucket(Bucket=bucket)

    def put_object(self, bucket: str, key: str, data: bytes) -> str:
        """Stores `data` at `key` (creating the bucket); returns its s3:// URI."""
        self.ensure_bucket(bucket)
        self.client().put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def upload_tree(self, bucket: str, prefix: str, local_dir: Path | str) -> str:
        """Uploads every file under `local_dir` to `prefix/<relative path>`; returns the s3:// URI."""
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        if not files:
            raise ObjectStoreError(f"{local_dir} has no files to upload")
        self.ensure_bucket(bucket)
        s3 = self.client()
        prefix = prefix.strip("/")
        for path in files:
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local_dir).as_posix()}")
        return f"s3://{bucket}/{prefix}"

    def env(self) -> dict[str, str]:
        """The environment a fetcher needs: what a modelCredentialsSecret provides via envFrom."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": self.region}

    def secret_manifest(self, name: str, namespace: str) -> dict[str, Any]:
        """A v1 Secret for a RankingModel's `modelCredentialsSecret` (data base64, as the API returns it)."""
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in self.env().items()}}
