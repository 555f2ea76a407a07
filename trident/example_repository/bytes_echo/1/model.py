import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = upper-cased INPUT0 elements; OUTPUT1 = their byte lengths."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([bytes(v).upper() for v in x.reshape(-1)], dtype=object).reshape(x.shape)
            lengths = np.array([len(v) for v in x.reshape(-1)], dtype=np.int32).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", upper),
                pb_utils.Tensor("OUTPUT1", lengths),
            ]))
        return responses
