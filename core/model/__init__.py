"""The model wing: reading an ONNX model — load, normalize, external data, shapes, the graph, the layer inventory, decoder LLM patterns, INT8 placement and the samples."""
