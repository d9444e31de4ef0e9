"""What the TensorRT backend calls in Polygraphy and TensorRT, declared: tests/unit/backends check these
tables against the installed Polygraphy's signatures (test_tensorrt_static.py), against the uses an AST
scan of the package's code finds, and against the version table of docs/tensorrt-api-check.md
(test_tensorrt_api_scan.py)."""
from __future__ import annotations

# Every Polygraphy callable this package calls, with the keywords it passes. tests/unit/backends/
# test_tensorrt_static.py checks them against the installed Polygraphy's signatures, and that
# every Polygraphy call in the package's modules is listed here.
POLYGRAPHY_CALLS = {
    "polygraphy.backend.trt.NetworkFromOnnxPath": ("strongly_typed",),
    "polygraphy.backend.trt.SetLayerPrecisions": (),
    "polygraphy.backend.trt.PostprocessNetwork": ("name",),
    "polygraphy.backend.trt.CreateConfig": ("fp16", "int8", "tf32", "precision_constraints", "profiles",
                                            "profiling_verbosity", "memory_pool_limits"),
    "polygraphy.backend.trt.EngineBytesFromNetwork": ("config",),
    "polygraphy.backend.trt.EngineFromBytes": (),
    "polygraphy.backend.trt.TrtRunner": ("name",),
    "polygraphy.backend.trt.TrtRunner.activate": (),
    "polygraphy.backend.trt.TrtRunner.infer": (),
    "polygraphy.backend.trt.TrtRunner.deactivate": (),
    "polygraphy.backend.trt.Profile": (),
    "polygraphy.backend.trt.Profile.add": ("min", "opt", "max"),
    "polygraphy.cuda.DeviceArray": ("shape", "dtype"),
    "polygraphy.cuda.DeviceArray.raw": (),
    "polygraphy.cuda.DeviceArray.copy_from": (),
    "polygraphy.cuda.Stream": (),
    "polygraphy.cuda.Stream.synchronize": (),
    "polygraphy.cuda.wrapper": (),
    "polygraphy.cuda.Cuda.check": (),
    "polygraphy.datatype.DataType.from_dtype": ("source_module",),
}
# Every TensorRT attribute, method and enum member that this package and the post-process script it exports
# (POSTPROCESS_SCRIPT) use. tests/unit/backends/test_tensorrt_api_scan.py finds the uses in the code itself (an
# AST scan that infers which values are TensorRT objects), checks that they are exactly these, and that
# the version table of docs/tensorrt-api-check.md has a row for each allowing it where it is used: what
# is deprecated (10.12) or removed (11) only in legacy.LEGACY_ONLY code.
TENSORRT_API = (
    "trt.__version__", "trt.float32", "trt.float16", "trt.int8", "trt.LayerType.CONVOLUTION",
    "trt.LayerType.DECONVOLUTION", "trt.LayerType.MATRIX_MULTIPLY", "trt.LayerType.CONSTANT",
    "trt.LayerType.SHAPE", "trt.LayerType.SHUFFLE", "trt.IConstantLayer", "trt.IProfiler", "trt.IProfiler.__init__",
    "trt.ProfilingVerbosity.DETAILED", "trt.MemoryPoolType.WORKSPACE", "trt.LayerInformationFormat.JSON",
    "trt.TensorIOMode.INPUT", "trt.BuilderFlag.INT8",
    "INetworkDefinition.num_layers", "INetworkDefinition.get_layer", "INetworkDefinition.num_inputs",
    "INetworkDefinition.get_input", "ILayer.name", "ILayer.metadata", "ILayer.type", "ILayer.num_inputs",
    "ILayer.get_input", "ILayer.num_outputs", "ILayer.get_output", "ILayer.precision", "ILayer.set_output_type",
    "IConstantLayer.weights", "ITensor.name", "ITensor.dtype", "ITensor.dynamic_range",
    "IProfiler.report_layer_time", "IBuilderConfig.set_flag",
    "ICudaEngine.create_engine_inspector", "ICudaEngine.num_io_tensors", "ICudaEngine.get_tensor_name",
    "ICudaEngine.get_tensor_mode", "ICudaEngine.get_tensor_dtype", "ICudaEngine.is_shape_inference_io",
    "IExecutionContext.profiler", "IExecutionContext.set_input_shape", "IExecutionContext.set_tensor_address",
    "IExecutionContext.get_tensor_shape", "IExecutionContext.get_max_output_size",
    "IExecutionContext.execute_async_v3", "IEngineInspector.execution_context",
    "IEngineInspector.get_engine_information",
)
# What Polygraphy's loaders and runner call in TensorRT for this package (documented beside, not scanned).
TENSORRT_VIA_POLYGRAPHY = (
    "ILayer.precision", "NetworkDefinitionCreationFlag.STRONGLY_TYPED", "OnnxParser.parse_from_file",
    "IParserError.__str__", "BuilderFlag.FP16", "BuilderFlag.INT8", "BuilderFlag.OBEY_PRECISION_CONSTRAINTS",
    "IBuilderConfig.set_memory_pool_limit", "IBuilderConfig.profiling_verbosity",
    "Builder.build_serialized_network", "IHostMemory", "Runtime.deserialize_cuda_engine",
)
