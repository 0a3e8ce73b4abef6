"""A minimal MLServer runtime that serves an ONNX file with onnxruntime on the CPU.

MLServer 1.7.1 ships no ONNX runtime, so the gate tests bring this one: the fixture copies it
into the model repository (which `mlserver start` puts on sys.path) and model-settings.json
names it as `implementation`. Inputs are cast to the ONNX graph's types; every output is returned.
"""
import numpy as np
import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

_ONNX_TO_NUMPY = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
                  "tensor(double)": np.float64, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self._settings)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1     # the test machine has 2 cores, shared with the client
        self._session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._input_types = {i.name: _ONNX_TO_NUMPY.get(i.type) for i in self._session.get_inputs()}
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {}
        for request_input in payload.inputs:
            array = NumpyCodec.decode_input(request_input)
            wanted = self._input_types.get(request_input.name)
            feeds[request_input.name] = array.astype(wanted) if wanted is not None else array
        results = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            model_name=self.name, model_version=self.version,
            outputs=[NumpyCodec.encode_output(name, value) for name, value in zip(self._output_names, results)])
