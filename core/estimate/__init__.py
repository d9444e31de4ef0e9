"""TensorRT latency without a GPU: a GPU table, an engine-layer cost model fitted on real
trtexec reports, and a predictor of the engine TensorRT would build for a policy."""
