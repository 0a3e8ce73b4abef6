"""A model whose execution time is known: a + b·items ms per batch, served by real Triton.

Test and benchmark harness. `write_repository()` lays out a Python-backend model (`backend:
"python"`, `1/model.py` = this file's MODEL_PY) that sleeps instead of computing, so the
measured profile can be checked against the truth and the 2 shared cores stay free. Instances
emulate sharing one device: while k other instances of the model execute, each progresses at
1 / (1 + slowdown·k) of its solo speed (processor sharing in 2 ms slices, seen through marker
files), which is the contention model the planner assumes. `fail: true` answers every request
with an error (a model that loads but fails requests).
"""
from __future__ import annotations

import json
from pathlib import Path

from rankops_dev import triton

MODEL_PY = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.a_ms = float(params.get("a_ms", "1"))
        self.b_ms = float(params.get("b_ms", "0.1"))
        self.slowdown = float(params.get("slowdown", "0"))
        self.fail = params.get("fail", "false") == "true"
        self.busy_dir = params["busy_dir"]
        self.marker = os.path.join(self.busy_dir, f"{os.getpid()}-{args['model_instance_name']}")

    def _others(self):
        return max(0, len(os.listdir(self.busy_dir)) - 1)

    def execute(self, requests):
        if self.fail:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("timed stand-in: fail is set"))
                    for _ in requests]
        inputs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        items = sum(int(x.shape[0]) for x in inputs)
        work = (self.a_ms + self.b_ms * items) / 1000.0    # solo seconds
        open(self.marker, "w").close()
        try:
            # progress by the time actually slept (oversleeping does not add up), in slices that
            # see the other instances come and go; one sleep when there is no contention to model
            slice_s = 0.002 if self.slowdown else work
            while work > 1e-6:
                stretch = 1.0 + self.slowdown * self._others() if self.slowdown else 1.0
                start = time.perf_counter()
                time.sleep(min(slice_s, work * stretch))
                work -= (time.perf_counter() - start) / stretch
        finally:
            os.unlink(self.marker)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("y", x[:, :1].astype(np.float32))]) for x in inputs]
'''

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [{{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }}]
instance_group [{{ count: {instances} kind: KIND_CPU{rate_limiter} }}]
{batching}
parameters [
  {{ key: "a_ms" value: {{ string_value: "{a_ms}" }} }},
  {{ key: "b_ms" value: {{ string_value: "{b_ms}" }} }},
  {{ key: "slowdown" value: {{ string_value: "{slowdown}" }} }},
  {{ key: "fail" value: {{ string_value: "{fail}" }} }},
  {{ key: "busy_dir" value: {{ string_value: "{busy_dir}" }} }}
]
"""


# The priority lines the operator renders into every dynamic_batching (issue 40): live traffic at
# the default level 1, the gates, the warm container and replays at 2, which is delayed, never shed.
PRIORITY_LEVELS = ("priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 2 value: "
                   "{ timeout_action: DELAY default_timeout_microseconds: 0 } }")


def batching_block(preferred: tuple[int, ...] = (), delay_us: int = 0, extra: str = "") -> str:
    """The dynamic_batching block; `extra` goes inside it as written (e.g. PRIORITY_LEVELS)."""
    pref = f" preferred_batch_size: [ {', '.join(map(str, preferred))} ]" if preferred else ""
    return f"dynamic_batching {{{pref} max_queue_delay_microseconds: {delay_us}{' ' + extra if extra else ''} }}"


def write_repository(root: Path, name: str = "timed", *, a_ms: float = 2.0, b_ms: float = 0.25,
                     max_batch: int = 32, instances: int = 1, slowdown: float = 0.0, fail: bool = False,
                     preferred: tuple[int, ...] = (), delay_us: int = 0, dynamic: bool = True,
                     batching_extra: str = "", device: str | None = None,
                     rate_limiter: tuple[int, int] | None = None) -> Path:
    """A model repository holding the timed model `name`; returns the repository.

    `device`: models given the same name share one emulated device (their executions slow each
    other as the instances of one model do); default: a device of its own. `rate_limiter`:
    (priority, units of the resource `device` an execution takes), for a server started with
    --rate-limit=execution_count and --rate-limit-resource=device:N (Triton's rate limiter)."""
    model = root / "models" / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    busy = root / f"busy-{device or name}"
    busy.mkdir(parents=True, exist_ok=True)
    limiter = "" if rate_limiter is None else (
        f' rate_limiter {{ resources [ {{ name: "device" count: {rate_limiter[1]} }} ] priority: {rate_limiter[0]} }}')
    (model / "1" / "model.py").write_text(MODEL_PY)
    (model / "config.pbtxt").write_text(CONFIG.format(
        name=name, max_batch=max_batch, instances=instances, rate_limiter=limiter, a_ms=a_ms, b_ms=b_ms, slowdown=slowdown,
        fail=json.dumps(fail), busy_dir=busy,
        batching=batching_block(preferred, delay_us, batching_extra) if dynamic else ""))
    return root / "models"


def server(install: triton.TritonInstall, root: Path, names: list[str],
           extra_args: tuple[str, ...] = ()) -> triton.TritonServer:
    """A (not started) tritonserver over `root`/models loading `names`, as the operator runs it."""
    args = ["--model-control-mode=explicit", *(f"--load-model={n}" for n in names),
            "--metrics-config=summary_latencies=true", "--log-verbose=0", *extra_args]
    return triton.TritonServer(install=install, container_args=args, repository=root / "models",
                               log_path=root / "tritonserver.log")
